"""Readable text for each report (the CLI without --json)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meshplan.cli.tables_serving import serve_plan_table, serve_table, serving_table
from meshplan.cli.tables_validation import calibrate_table, validate_table
from meshplan.render import WIDTH, count, fit_width, gb, percent, seconds, table


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
        *_finetune_line(r),
    ]
    if len(r["stages"]) > 1:
        head.append(f"heaviest pipeline stage: {r['heaviest_stage']} of {len(r['stages'])}")
    verdict = "fits" if r["fits"] else "does NOT fit"
    tail = f"{verdict}: {gb(bill['total_bytes'])} of {gb(r['hbm_bytes_per_gpu'])} ({gb(abs(r['free_bytes_per_gpu']))} "
    tail += "free)" if r["fits"] else "over)"
    peaks = f"allocator peaks: {gb(bill['allocated_bytes'])} allocated, {gb(bill['reserved_bytes'])} reserved"
    body = table(rows, ["term", "per GPU", "formula"], align="lrl")
    return "\n".join([*head, "", body, "", peaks, tail, "", _conditions_lines(r)])


def _conditions_lines(r: dict[str, Any]) -> str:
    """The conditions the bill assumed and where each came from (flag, stack or default)."""
    stack = r.get("stack") or "none"

    def shown(v: Any) -> str:
        return "-" if v is None else f"{v:g}" if isinstance(v, float) else str(v)

    conditions = r["conditions"].items()
    rows = [(name, shown(c["value"]), c["source"]) for name, c in conditions if _stated(c)]
    rest = len(r["conditions"]) - len(rows)
    unset = f"; {rest} more unset, at their defaults: --json lists all" if rest else ""
    head = f"conditions (stack: {stack}{unset})"
    return head + ("\n" + table(rows, ["condition", "value", "from"], align="lll") if rows else "")


def _stated(condition: dict[str, Any]) -> bool:
    """Whether a condition row says something: a value a flag or the stack set, or a default that is a value."""
    return condition["source"] != "default" or condition["value"] is not None


def _stacks(r: dict[str, Any]) -> str:
    out = []
    for s in r["stacks"]:
        settings = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in s["defaults"].items())
        out += [f"{s['name']}: {s['description']} (reports {s['reports']} bytes)", f"  {settings}"]
    return "\n".join(out)


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
            n = r["nothing_fits"]
            fewest = n["fewest_gpus_that_fit"]
            tune.append(
                f"not one sequence of {r['seq']:,} tokens fits; "
                + (f"{fewest} GPUs would (FSDP, full recompute)" if fewest else "no fleet up to 64 times larger would")
            )
            tune += [f"fits on these GPUs with {v}" for v in n["variants"]]
    return "\n".join(
        [
            f"{r['model']} weights in {r['dtype']}: {gb(r['weights_bytes_total'])}",
            f"split over {r['gpus']} x {r['gpu']}: {gb(r['weights_bytes_per_gpu_even_split'])} per GPU "
            f"({percent(r['hbm_fraction_per_gpu'])} of {gb(r['hbm_bytes_per_gpu'])}) - {verdict}",
            f"free: {gb(r['free_bytes_per_gpu'])} per GPU, {gb(r['free_bytes_total'])} in total, "
            "for the KV cache and activations",
            f"fewest GPUs for the weights alone: {r['min_gpus_for_weights']}; "
            f"for the training state ({gb(r['training_state_bytes_total'])}, "
            f"{r['training_state_bytes_per_param']:g} bytes/param): {r['min_gpus_for_training']}",
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
        "",
        table(rows, ["step time", ""]),
        "",
        f"step time P10-P90 {seconds(r['step_time_s_p10'])} - {seconds(r['step_time_s_p90'])} ({r['uncertainty']})"
        if "step_time_s_p10" in r
        else "",
        f"MFU {percent(r['mfu'])}, HFU {percent(r['hfu'])}, {r['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU; "
        f"memory {gb(r['per_gpu']['total_bytes'])} of {gb(r['hbm_bytes_per_gpu'])} "
        f"({'fits' if r['fits'] else 'does NOT fit'})",
    ]
    if "time_to_train" in r:
        t = r["time_to_train"]
        head.append(
            f"{count(t['tokens_total'])} tokens: {t['wall_time_days']:.1f} days, {t['gpu_hours_total']:,.0f} GPU-hours"
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
        parts.append(f"PP {lay['pp']}" + (f" ({lay['vpp']} virtual)" if lay["vpp"] > 1 else ""))
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
    out.append(f"fewest GPUs that fit: {fewest:,}" if fewest else "no fleet up to 64 times larger fits either")
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
    out = [
        f"{r['model']} on {r['gpus']} x {r['gpu']}, seq {r['seq']}, {r['global_batch_tokens']:,} tokens per step",
        f"searched {r['evaluated']:,} layouts in {r['elapsed_s']:.2f} s: {r['feasible']:,} fit "
        f"with {percent(r['headroom_fraction'])} of HBM kept free"
        + (f"; only layouts {r['engine']} runs are shown" if r.get("engine") else ""),
        *(
            [
                f"fewest GPUs that train {r['fewest_gpus']['tokens']:.3g} tokens within {r['fewest_gpus']['days']:g} "
                f"days: {r['gpus']:,} (fleets from {r['fewest_gpus']['searched_from']:,} GPUs, doubling)"
            ]
            if "fewest_gpus" in r
            else []
        ),
        *(
            [
                "",
                table(
                    rows,
                    ["#", "layout", "step", "MFU", "tok/s/GPU", "memory", "free", "across fabric"],
                    align="rlrrrrrl",
                ),
            ]
            if rows
            else []
        ),
        *([f"step times: P10-P90 {_band(r['plans'][0])} for plan 1 ({r['uncertainty']})"] if rows else []),
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
        out += ["", f"{e['a']} vs {e['b']}: {e['why']}", table(term_rows, ["term", e["a"], e["b"], "difference"])]
        for w in e.get("named", {}).get("warnings", []):
            out.append(f"  note: {w}")
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
    out = [f"{r['title']} ({r['source']})", r["why"], "", _estimate(r)]
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


def _export(r: dict[str, Any]) -> str:
    """The command (continued over lines with a backslash, so it pastes whole), each file as written (its lines
    are the engine's), and the notes."""
    out = [f"# {r['engine']} {r['engine_version']}", shell_lines(f"$ {r['command']}")]
    for name, text in r["files"].items():
        out += ["", f"--- {name}", text.rstrip()]
    out += [fit_width(f"note: {n}") for n in r["notes"]]
    if "written" in r:
        out.append("written: " + ", ".join(r["written"]))
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
    "list": _list,
    "stacks": _stacks,
    "check": _check,
    "plan": _plan,
    "recipe": _recipe,
    "export": _export,
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


def shell_lines(command: str, width: int = WIDTH) -> str:
    """A shell command over lines of at most ``width`` columns, each but the last ending in `` \\``: broken at
    spaces outside quotes only, so it runs as one line does."""
    words, word, quote = [], "", ""
    for ch in command:
        if ch == " " and not quote:
            words += [word] if word else []
            word = ""
            continue
        quote = "" if ch == quote else ch if not quote and ch in "'\"" else quote
        word += ch
    words += [word] if word else []
    lines, line = [], ""
    for w in words:
        if line and len(line) + 1 + len(w) > width - 2:
            lines.append(line + " \\")
            line = "    " + w
        else:
            line = f"{line} {w}" if line else w
    return "\n".join([*lines, line])
