"""Readable text for each report (the CLI without --json)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meshplan.cli.tables_compare import compare_table
from meshplan.cli.tables_conditions import conditions_lines, stack_line
from meshplan.cli.tables_cost import cost_lines, plan_cost_lines, with_cost_columns
from meshplan.cli.tables_export import export_table
from meshplan.cli.tables_serving import serve_plan_table, serve_table, serving_table
from meshplan.cli.tables_timeline import timeline_lines
from meshplan.cli.tables_validation import calibrate_table, validate_table
from meshplan.render import count, fit_width, gb, percent, seconds, table


def _params(r: dict[str, Any]) -> str:
    rows = [(name, f"{n:,}", count(n)) for name, n in r["by_component"].items() if n]
    out = [f"{r['model']}: {r['total_params']:,} parameters ({count(r['total_params'])})"]
    if r["active_params_per_token"] != r["total_params"]:
        out.append(f"active per token: {r['active_params_per_token']:,} ({count(r['active_params_per_token'])})")
    if r.get("mtp_params"):
        out.append(f"multi-token-prediction modules (not in the total): {r['mtp_params']:,}")
    out += ["", table(rows, ["component", "parameters", ""])]
    if r["finetune"] != "full" or r["trainable_params"] != r["total_params"]:
        what = f"{r['finetune']} adapters" if r.get("adapter_params") else f"{r['finetune']} fine-tuning"
        out += [
            "",
            f"trainable ({what}): {r['trainable_params']:,} ({count(r['trainable_params'])}, "
            f"{percent(r['trainable_fraction'])} of the model); frozen: {r['frozen_params']:,}",
        ]
    return "\n".join(out)


def _finetune_line(r: dict[str, Any]) -> list[str]:
    """One line saying what trains, for reports of fine-tuning (none for pre-training)."""
    if r["finetune"] == "full" and "frozen" not in r:
        return []
    if "lora_rank" in r:
        what = f"{r['finetune']} rank {r['lora_rank']} on {','.join(r['lora_targets'])}"
    else:
        frozen = r["frozen"]
        parts = (["embeddings"] if frozen["embeddings"] else []) + (
            [f"first {frozen['layers']} layers"] if frozen["layers"] else []
        )
        what = f"full, frozen: {', '.join(parts)}"
    return [f"fine-tuning: {what}; {r['trainable_params']:,} trainable parameters ({count(r['trainable_params'])})"]


def _layout_line(lay: dict[str, Any]) -> str:
    parts = [f"{k}={lay[k]}" for k in ("tp", "pp", "vpp", "cp", "ep", "dp_shard", "dp_replicate") if lay[k] != 1]
    if lay.get("expert_tp", lay["tp"]) != lay["tp"]:
        parts.insert(parts.index(f"ep={lay['ep']}") + 1 if lay["ep"] != 1 else 0, f"expert_tp={lay['expert_tp']}")
    parts += [f"zero={lay['zero']}", f"recompute={lay['recompute']}", f"micro_batch={lay['micro_batch']}"]
    if lay["sp"]:
        parts.append("sp")
    if lay["pp"] > 1:
        parts.append(f"schedule={lay['schedule']}")
    return " ".join(parts)


def _memory(r: dict[str, Any]) -> str:
    bill = r["per_gpu"]
    rows = [(t["title"], gb(t["value_bytes"]), t["formula"]) for t in r["terms"] if t["value_bytes"]]
    rows.append(("total", gb(bill["total_bytes"]), f"of {gb(r['hbm_bytes_per_gpu'])} HBM"))
    head = [
        f"{r['model']} on {r['gpus']} x {r['gpu']}: {_layout_line(r['layout'])}",
        f"seq {r['seq']}, global batch {r['global_batch']} sequences, precision {r['precision']}",
        *stack_line(r),
        *_finetune_line(r),
    ]
    if len(r["stages"]) > 1:
        head.append(f"heaviest pipeline stage: {r['heaviest_stage']} of {len(r['stages'])}")
    verdict = "fits" if r["fits"] else "does NOT fit"
    tail = f"{verdict}: {gb(bill['total_bytes'])} of {gb(r['hbm_bytes_per_gpu'])} ({gb(abs(r['free_bytes_per_gpu']))} "
    tail += f"free, {r['hbm_pressure']:.0%} of HBM)" if r["fits"] else "over)"
    peaks = f"allocator peaks: {gb(bill['allocated_bytes'])} allocated, {gb(bill['reserved_bytes'])} reserved"
    body = table(rows, ["term", "per GPU", "formula"], align="lrl")
    warned = [f"WARNING: {w}" for w in r.get("warnings", [])]
    return "\n".join([*head, "", body, "", peaks, tail, *warned, "", conditions_lines(r)])


def _stacks(r: dict[str, Any]) -> str:
    out = []
    for s in r["stacks"]:
        settings = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in s["defaults"].items())
        out += [f"{s['name']}: {s['description']} (reports {s['reports']} bytes)", f"  {settings}"]
    return "\n".join(out)


def _split(split: dict[str, Any] | None) -> str:
    return (
        "" if split is None else f" (tp {split['tp']} x pp {split['pp']}: {gb(split['weights_bytes_per_gpu'])} a GPU)"
    )


def _tried(tried: list[dict[str, Any]]) -> str:
    return ", ".join(f"{t['gpus']:,}" for t in tried)


def _fit(r: dict[str, Any]) -> str:
    verdict = "fits" if r["fits"] else "does NOT fit"
    tune: list[str] = []
    if "max_micro_batch" in r:
        sharded = f"FSDP over {r['gpus']} GPUs" if r["layout"]["zero"] else "one GPU"
        tune = [
            "",
            *_finetune_line(r),
            f"on {sharded}, largest micro-batch at seq {r['seq']}: {r['max_micro_batch']} "
            f"({r['max_micro_batch_with_recompute']} with full recompute)",
            f"longest sequence at micro-batch 1: {r['max_seq_len']:,} tokens "
            f"({r['max_seq_len_with_recompute']:,} with full recompute)",
        ]
        if "nothing_fits" in r:
            tune.append(f"not one sequence of {r['seq']:,} tokens fits on {sharded}")
    fewest = r["min_gpus_for_training"]
    training = [
        f"training (seq {r['seq']:,}, the planner's layouts, {percent(r['headroom_fraction'])} of HBM kept "
        f"free): {'fits' if r['training_fits'] else 'does NOT fit'} on {r['gpus']:,} GPU{'s' * (r['gpus'] != 1)}; "
        "fewest GPUs that fit: "
        + (f"{fewest:,}" if fewest else "none")
        + f" (searched {_tried(r['min_gpus_for_training_tried'])})",
        *(
            f"fits on these GPUs with {v['change']}: {_layout_short(v['layout'])}, {seconds(v['step_time_s'])} per step"
            for v in r["training_variants"]
        ),
    ]
    weights = r["min_gpus_for_weights"]
    return "\n".join(
        [
            *stack_line(r),
            f"{r['model']} weights in {r['dtype']}: {gb(r['weights_bytes_total'])}",
            f"split over {r['gpus']} x {r['gpu']}: {gb(r['weights_bytes_per_gpu_even_split'])} per GPU evenly "
            f"({percent(r['hbm_fraction_per_gpu'])} of {gb(r['hbm_bytes_per_gpu'])}); the lightest split"
            f"{_split(r['weights_split']) or ' (none of these GPUs)'} - {verdict}",
            f"free: {gb(r['free_bytes_per_gpu'])} per GPU, {gb(r['free_bytes_total'])} in total, "
            "for the KV cache and activations",
            "fewest GPUs for the weights alone: "
            + (f"{weights}{_split(r['min_gpus_for_weights_split'])}" if weights else "no split holds them")
            + f"; the training state is {gb(r['training_state_bytes_total'])} "
            f"({r['training_state_bytes_per_param']:g} bytes/param)",
            *training,
            *tune,
        ]
    )


def _estimate(r: dict[str, Any]) -> str:
    b = r["breakdown"]
    rows = [
        ("compute", seconds(b["compute_s"])),
        ("exposed communication", seconds(b["exposed_comm_s"])),
        ("  tensor / sequence parallel", seconds(b["exposed_tp_s"])),
        ("  context parallel", seconds(b["exposed_cp_s"])),
        ("  expert parallel", seconds(b["exposed_ep_s"])),
        ("  pipeline sends and syncs", seconds(b["exposed_pp_s"])),
        ("  data parallel / ZeRO", seconds(b["exposed_dp_s"])),
        ("pipeline bubble", seconds(b["bubble_s"])),
        ("optimizer step", seconds(b["optimizer_s"])),
        *([("host overhead (profile)", seconds(b["host_s"]))] if b.get("host_s") else []),
        ("step", seconds(r["step_time_s"])),
    ]
    head = [
        f"{r['model']} on {r['gpus']} x {r['gpu']}: {_layout_line(r['layout'])}",
        f"seq {r['seq']}, global batch {r['global_batch']} sequences, precision {r['precision']}"
        + (f", attention kernel {r['attention_kernel']}" if "attention_kernel" in r else ""),
        *stack_line(r),
        "",
        table(rows, ["step time", ""]),
        "",
        f"step time P10-P90 {seconds(r['step_time_s_p10'])} - {seconds(r['step_time_s_p90'])} ({r['uncertainty']})"
        if "step_time_s_p10" in r
        else "",
        f"MFU {percent(r['mfu'])} (causal attention, of the dense bf16 peak), HFU {percent(r['hfu'])}"
        + (f", {percent(r['mfu_fp8_peak'])} of the FP8 peak" if r.get("mfu_fp8_peak") is not None else "")
        + f", {r['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU; "
        f"memory {gb(r['per_gpu']['total_bytes'])} of {gb(r['hbm_bytes_per_gpu'])} "
        f"({'fits' if r['fits'] else 'does NOT fit'})",
    ]
    if "time_to_train" in r:
        t = r["time_to_train"]
        head.append(
            f"{count(t['tokens_total'])} tokens: {t['wall_time_days']:.1f} days, {t['gpu_hours_total']:,.0f} GPU-hours"
        )
    head += cost_lines(r)
    if r.get("host", {}).get("bound"):
        h = r["host"]
        head.append(
            f"host-bound: the CPU issues a layer's kernels in {seconds(h['host_s_per_layer'])} per micro-batch where "
            f"the GPU runs them in {seconds(h['gpu_s_per_layer'])} (launch {h['launch']}; --launch cudagraph or a "
            "larger micro-batch raises the GPU's share)"
        )
    place = [(axis, p["size"], p["inside_domain"], p["domains"], p["link"]) for axis, p in r["placement"].items()]
    calls = [
        (
            c["strategy"],
            c["op"],
            c["phase"],
            c["group_size"],
            gb(c["size_bytes_per_call"]),
            f"{c['count_per_step']:,.0f}",
            c["link"],
            seconds(c["time_s_per_step"]),
            seconds(c["exposed_s_per_step"]),
        )
        for c in r["collectives"]
    ]
    out = [*head, "", "placement (axis order " + ",".join(r["axis_order"]) + ")"]
    out.append(table(place, ["axis", "size", "per domain", "domains", "link"]))
    out += [
        "",
        "collectives of one GPU per step",
        table(
            calls, ["strategy", "op", "phase", "group", "bytes", "count", "link", "time", "exposed"], align="lllrrrlrr"
        ),
    ]
    out += timeline_lines(r) if "timeline" in r else []
    out += [f"WARNING: {w}" for w in r["warnings"]]
    return "\n".join(out)


def _collectives(r: dict[str, Any]) -> str:
    rows = [
        (
            x["link"],
            x["tier"],
            gb(x["bandwidth_bytes_per_s"]) + "/s",
            seconds(x["bandwidth_only_s"]),
            f"{x['ratio_bandwidth_only']:.0f}x",
            seconds(x["modeled_s"]),
            f"{x['ratio_modeled']:.0f}x",
        )
        for x in r["links"]
    ]
    return "\n".join(
        [
            f"one ring all-reduce of {gb(r['size_bytes'])} over {r['group_size']} GPUs "
            f"(one TP all-reduce of {r['model']}'s activations unless a size is given)",
            "",
            table(rows, ["link", "tier", "per GPU", "bandwidth only", "ratio", "modeled", "ratio"], align="llrrrrr"),
            "",
            f"{r['model']} pays {r['tp_collectives_per_forward']} TP collectives per forward pass "
            f"(2 per layer), {r['tp_collectives_per_step_per_micro_batch']} per forward and backward.",
        ]
    )


def _layout_short(lay: dict[str, Any]) -> str:
    """A layout in words: 'TP 2+SP · PP 4 (2 virtual) · DP 8, ZeRO-1 over 4 · micro-batch 1' (a CP ring is the
    default; all-gathered K/V is said)."""
    parts = []
    if lay["tp"] > 1:
        parts.append(f"TP {lay['tp']}" + ("+SP" if lay["sp"] else ""))
    if lay["cp"] > 1:
        parts.append(f"CP {lay['cp']}" + (" (K/V all-gathered)" if lay.get("cp_kind") == "all-gather" else ""))
    if lay["pp"] > 1:
        named = {"dualpipe": " (DualPipe)", "zero-bubble": " (zero-bubble)", "gpipe": " (GPipe)"}
        parts.append(
            f"PP {lay['pp']}"
            + (f" ({lay['vpp']} virtual)" if lay["vpp"] > 1 else named.get(lay.get("schedule", ""), ""))
        )
    if lay["ep"] > 1:
        etp = lay.get("expert_tp", lay["tp"])
        parts.append(f"EP {lay['ep']}" + (f" (expert TP {etp})" if etp != lay["tp"] else ""))
    dp = lay["dp_shard"] * lay["dp_replicate"]
    zero = f", ZeRO-{lay['zero']} over {lay['dp_shard'] * lay['cp']}" if lay["zero"] else ""
    parts.append(f"DP {dp}{zero}")
    if lay["recompute"] != "none":
        parts.append(f"{lay['recompute']} recompute")
    parts.append(f"micro-batch {lay['micro_batch']}")
    return " · ".join(parts)


PLAN_COLUMNS = ["#", "layout", "step", "MFU", "tok/s/GPU", "memory", "free", "across fabric"]


def _nothing_fits(r: dict[str, Any]) -> list[str]:
    """What would fit, when nothing does."""
    n = r.get("nothing_fits")
    if n is None:
        return []
    out = ["", "nothing fits."]
    if n["lightest_layout"] is not None:
        out.append(
            f"lightest layout found: {_layout_short(n['lightest_layout'])} at {gb(n['lightest_bytes_per_gpu'])} "
            f"per GPU, over the {gb(n['budget_bytes_per_gpu'])} budget"
        )
    fewest = n["fewest_gpus_that_fit"]
    tried = f" (searched {_tried(n['fleet_sizes_tried'])} GPUs)"
    out.append(
        (f"fewest GPUs that fit: {fewest:,}" if fewest else "no fleet up to 64 times larger fits either") + tried
    )
    for v in n["variants"]:
        out.append(f"fits with {v['change']}: {_layout_short(v['layout'])}, {seconds(v['step_time_s'])} per step")
    return out


def _band(p: dict[str, Any]) -> str:
    return f"{seconds(p['step_time_s_p10'])} - {seconds(p['step_time_s_p90'])}"


def _plan(r: dict[str, Any]) -> str:
    rows = [
        (
            i + 1,
            _layout_short(p["layout"]),
            seconds(p["step_time_s"]),
            percent(p["mfu"]),
            f"{p['tokens_per_s_per_gpu']:,.0f}",
            gb(p["per_gpu"]["total_bytes"]),
            gb(p["free_bytes_per_gpu"]),
            ",".join(axis for axis, at in p["placement"].items() if at["crosses_fabric"]) or "-",
        )
        for i, p in enumerate(r["plans"])
    ]
    rows, columns, align = with_cost_columns(r, rows, PLAN_COLUMNS, "rlrrrrrl")
    out = [
        f"{r['model']} on {r['gpus']} x {r['gpu']}, seq {r['seq']}, {r['global_batch_tokens']:,} tokens per step",
        f"searched {r['evaluated']:,} layouts in {r['elapsed_s']:.2f} s: {r['feasible']:,} fit "
        f"with {percent(r['headroom_fraction'])} of HBM kept free"
        + (f"; only layouts {r['engine']} runs are shown" if r.get("engine") else ""),
        *stack_line(r),
        *(
            [
                f"fewest GPUs that train {r['fewest_gpus']['tokens']:.3g} tokens within {r['fewest_gpus']['days']:g} "
                f"days: {r['gpus']:,} (searched "
                + ", ".join(
                    f"{t['gpus']:,}" + ("" if t["days"] is None else f" in {t['days']:.1f} d")
                    for t in r["fewest_gpus"]["tried"]
                )
                + ")"
            ]
            if "fewest_gpus" in r
            else []
        ),
        *plan_cost_lines(r),
        *(
            [
                "",
                table(rows, columns, align=align),
            ]
            if rows
            else []
        ),
        *([f"step times: P10-P90 {_band(r['plans'][0])} for plan 1 ({r['uncertainty']})"] if rows else []),
        *([r["ties"]] if r.get("ties") else []),
        *(f"WARNING: {w}" for w in r.get("warnings", [])),
        "",
        "rejected: " + ("; ".join(f"{k} {v:,}" for k, v in r["rejections"].items()) or "none"),
        *_nothing_fits(r),
        f"Pareto front (step time against memory per GPU): {len(r['pareto'])} layouts",
    ]
    for e in r.get("explain", []):
        term_rows = [
            (
                x["term"],
                _value(x["value_a"], x["unit"]),
                _value(x["value_b"], x["unit"]),
                _value(x["difference"], x["unit"], signed=True),
            )
            for x in e["rows"]
            if x["value_a"] or x["value_b"]
        ]
        out += ["", f"{e['a']} vs {e['b']}: {e['why']}"]
        if "filled" in e:
            filled = ", ".join(f"{k}={v}" for k, v in e["filled"].items()) or "none"
            out.append(f"fields not given, filled with {e['filled_with']} of those given: {filled}")
        out.append(table(term_rows, ["term", e["a"], e["b"], "difference"]))
        for w in e.get("named", {}).get("warnings", []):
            out.append(f"  note: {w}")
    out.append("not searched: " + "; ".join(r["not_searched"]))
    return "\n".join(out)


def _value(x: float, unit: str, *, signed: bool = False) -> str:
    text = seconds(abs(x)) if unit == "s" else gb(abs(x))
    return ("-" if x < 0 else "+" if signed and x > 0 else "") + text


def _recipe(r: dict[str, Any]) -> str:
    if "recipes" in r:
        rows = [
            (
                x["name"],
                x["title"],
                f"{x['gpus']:,}",
                " x ".join(f"{k}{v}" for k, v in x["factors"].items() if k != "gpus"),
            )
            for x in r["recipes"]
        ]
        return table(rows, ["recipe", "", "GPUs", "factors"], align="llrl")
    p = r["published"]
    figure = {
        "mfu": ("MFU (attention over the whole context)", lambda v: percent(v)),
        "tokens_per_s_per_gpu": ("tokens/s per GPU", lambda v: f"{v:,.0f}"),
        "iteration_time_s": ("step time", seconds),
        "tflops_per_gpu_eq3": ("TFLOP/s per GPU (Eq. 3)", lambda v: f"{v:.0f}"),
        "tflops_per_gpu_megatron": ("TFLOP/s per GPU", lambda v: f"{v:.0f}"),
        "tflops_per_gpu_mcore": ("TFLOP/s per GPU (Megatron-Core's count)", lambda v: f"{v:.0f}"),
    }
    label, show = figure.get(p["metric"], (p["metric"], lambda v: f"{v:g}"))
    published = (
        f"published {label}: {show(p['value'])} ({p['source']}, {p['locator']}); predicted {show(p['predicted'])} "
        f"({p['error']:+.1%}) under the conditions `meshplan validate` runs it with ({p['run']}: {p['case']})"
    )
    out = [f"{r['title']} ({r['source']})", r["why"], published, "", _estimate(r)]
    if "search" in r:
        s = r["search"]
        rank, kept = f"{s['rank_of_published']:,}", f"{s['feasible']:,}"
        if not r["fits"]:
            where = f"is billed over HBM; by step time it would rank {rank} among the {kept} layouts that fit"
        elif not s["published_fits_with_headroom"]:
            where = f"leaves less than the planner's headroom; by step time it would rank {rank} among the {kept} that"
            where += " leave it"
        else:
            where = f"ranks {rank} of {kept} that fit"
        out += [
            "",
            f"planner: the published layout {where}; best found {seconds(s['best_step_time_s'])} per step vs "
            f"{seconds(s['published_step_time_s'])}: {_layout_short(s['best_layout'])}",
        ]
    return "\n".join(out)


def _check(r: dict[str, Any]) -> str:
    from meshplan.check.render import render_check

    return render_check(r)


def _list(r: dict[str, Any]) -> str:
    from meshplan.render import gb

    rows = []
    for item in r["items"]:
        if r["kind"] == "models":
            kind = "MoE" if item["moe"] else "dense"
            rows.append([item["name"], f"{item['params_total'] / 1e9:,.1f}B params", f"{item['layers']} layers", kind])
        elif r["kind"] == "gpus":
            rows.append([item["name"], gb(item["hbm_bytes_per_gpu"]), item["description"]])
        elif r["kind"] == "links":
            speed = f"{item['bandwidth_bytes_per_s_per_direction'] / 1e9:,.0f} GB/s"
            rows.append([item["name"], speed, item["description"]])
        else:
            rows.append([item["name"], item["description"]])
    width = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))] if rows else []
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, width, strict=True)).rstrip() for row in rows)


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "calibrate": calibrate_table,
    "compare": compare_table,
    "list": _list,
    "stacks": _stacks,
    "check": _check,
    "plan": _plan,
    "recipe": _recipe,
    "export": export_table,
    "estimate": _estimate,
    "collectives": _collectives,
    "validate": validate_table,
    "params": _params,
    "memory": _memory,
    "fit": _fit,
    "serving": serving_table,
    "serve": serve_table,
    "serve-plan": serve_plan_table,
}


def render_table(command: str, result: dict[str, Any]) -> str:
    """The report as text, every line within render.WIDTH columns but an export's files (printed as written)."""
    text = RENDERERS[command](result)
    return text if command == "export" else fit_width(text)
