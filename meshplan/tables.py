"""Readable text for each report (the CLI without --json)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meshplan.render import count, gb, percent, seconds, table


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

    rows = [(name, shown(c["value"]), c["source"]) for name, c in r["conditions"].items()]
    return f"conditions (stack: {stack})\n" + table(rows, ["condition", "value", "from"], align="lll")


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


def _serving(r: dict[str, Any]) -> str:
    rows = [
        ("weights per GPU", gb(r["weights_bytes_per_gpu"])),
        ("prefill activations per GPU", gb(r["activations_bytes_per_gpu"])),
        ("runtime reserve per GPU", gb(r["runtime_reserve_bytes_per_gpu"])),
        (
            f"headroom per GPU ({r['engine']} keeps {1 - r['memory_fraction']:.0%} of {r['memory_fraction_of']})",
            gb(r["engine_headroom_bytes_per_gpu"]),
        ),
        ("KV budget per GPU", gb(r["kv_budget_bytes_per_gpu"])),
        ("KV per token per GPU", gb(r["kv_bytes_per_token_per_gpu"])),
        (f"KV per {r['context']}-token sequence", gb(r["kv_bytes_per_sequence_per_gpu"])),
        ("KV tokens that fit per replica", f"{r['kv_capacity_tokens_per_replica']:,}"),
        ("concurrent sequences, all replicas", f"{r['max_concurrent_sequences_total']:,}"),
    ]
    head = f"{r['model']} serving on {r['gpus']} x {r['gpu']}: tp={r['tp']} pp={r['pp']} x {r['replicas']} replicas"
    warnings = [f"WARNING: {w}" for w in r.get("warnings", [])]
    return "\n".join(
        [head, f"weights {r['dtype']}, KV cache {r['kv_dtype']}", "", table(rows, ["", "value"]), *warnings]
    )


def _estimate(r: dict[str, Any]) -> str:
    b = r["breakdown"]
    rows = [
        ("compute", seconds(b["compute_s"])),
        ("exposed communication", seconds(b["exposed_comm_s"])),
        ("  tensor / sequence parallel", seconds(b["exposed_tp_s"])),
        ("  context parallel", seconds(b["exposed_cp_s"])),
        ("  expert parallel", seconds(b["exposed_ep_s"])),
        ("  pipeline sends", seconds(b["exposed_pp_s"])),
        ("  data parallel / ZeRO", seconds(b["exposed_dp_s"])),
        ("pipeline bubble", seconds(b["bubble_s"])),
        ("optimizer step", seconds(b["optimizer_s"])),
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


def _opt_s(x: float | None) -> str:
    return "saturated" if x is None else seconds(x)


def _max_per_gpu(r: dict[str, Any]) -> str:
    return f" (max {r['max_tokens_per_s_per_gpu']:,.0f})" if "max_tokens_per_s_per_gpu" in r else ""


def _serve(r: dict[str, Any]) -> str:
    lay = r["layout"]
    head = (
        f"{r['model']} on {r['gpus']} x {r['gpu']} ({r['engine']}): tp={lay['tp']} pp={lay['pp']} ep={lay['ep']}"
        f"{' dp-attention' if lay['dp_attention'] else ''} x {lay['replicas']} replicas; weights {r['weights_dtype']}"
        f" ({r['quant']}), KV {r['kv_dtype']}; {r['input_len']} in / {r['output_len']} out"
    )
    rows = [
        ("TTFT p50 / p99", f"{_opt_s(r['ttft_s_p50'])} / {_opt_s(r['ttft_s_p99'])}"),
        ("TTFT unloaded", seconds(r["ttft_s_unloaded"])),
        ("TPOT = ITL", seconds(r["tpot_s"])),
        ("tokens/s per GPU", f"{r['tokens_per_s_per_gpu']:,.0f}" + _max_per_gpu(r)),
        ("tokens/s per user", f"{r['tokens_per_s_per_user']:,.1f}"),
        ("requests/s (all replicas)", f"{r['requests_per_s_total']:,.2f}"),
        ("batch per replica", f"{r['batch_per_replica']:,.1f} of {r['batch_cap_per_replica']:,} ({r['batch_limit']})"),
        ("knee (90% of max)", f"{r.get('knee_batch_per_replica', 0):,} sequences"),
    ]
    if "disaggregated" in r:
        d = r["disaggregated"]
        rows.pop()  # no knee: the decode pool's batch is set by the prefill pool's output
        rows += [
            ("pools: prefill / decode GPUs", f"{d['prefill_gpus']} / {d['decode_gpus']}"),
            ("prefill alone / KV hand-over", f"{seconds(d['prefill_s'])} / {seconds(d['kv_transfer_s'])}"),
            ("max requests/s: prefill / decode", f"{d['prefill_requests_per_s_max']:,.2f} / "
             f"{d['decode_requests_per_s_max']:,.2f} (bottleneck: {d['bottleneck']})"),
        ]  # fmt: skip
    steps = [(k.removesuffix("_s").replace("_", " "), seconds(v)) for k, v in r["step_s"].items()]
    blocks = [head, "", table(rows, ["", "value"]), "", "one step", table(steps, ["term", "time"])]
    return "\n".join([*blocks, "", "one GPU's memory", table(_serve_memory(r), ["term", "bytes"])])


def _serve_memory(r: dict[str, Any]) -> list[tuple[str, str]]:
    """The serving bill as the engine sizes it: the terms sum to the device's HBM."""
    keeps = f"{1 - r['memory_fraction']:.0%} of {r['memory_fraction_of']}"
    return [
        ("weights", gb(r["weights_bytes_per_gpu"])),
        ("prefill activations", gb(r["activations_bytes_per_gpu"])),
        (f"{r['engine']} runtime reserve", gb(r["runtime_reserve_bytes_per_gpu"])),
        (f"{r['engine']} headroom (keeps {keeps})", gb(r["engine_headroom_bytes_per_gpu"])),
        ("KV cache budget", gb(r["kv_budget_bytes_per_gpu"])),
    ]


def _serve_layout(lay: dict[str, Any]) -> str:
    parts = [f"tp{lay['tp']}"] + [f"pp{lay['pp']}"] * (lay["pp"] > 1) + [f"ep{lay['ep']}"] * (lay["ep"] > 1)
    parts += ["dp-attn"] * lay["dp_attention"]
    return " ".join(parts) + f" {lay['weights_dtype']}/{lay['kv_dtype']}"


def _replicas(plan: dict[str, Any]) -> str:
    p = plan.get("prefill_replicas", 0)
    return f"{p} prefill + {plan['replicas'] - p} decode" if p else str(plan["replicas"])


def _serve_plan(r: dict[str, Any]) -> str:
    t = r["targets"]
    head = (
        f"{r['model']} on {r['gpus']} x {r['gpu']} ({r['engine']}), {r['input_len']} in / {r['output_len']} out;"
        f" TTFT p99 <= {t['ttft_s_p99'] or '-'} s, TPOT <= {t['tpot_s_p99'] or '-'} s; objective {r['objective']}"
    )
    rows = [
        (
            i + 1,
            _serve_layout(c["layout"]),
            _replicas(c),
            c["gpus"],
            c["batch_cap_per_replica"],
            seconds(c["ttft_s_p99"]),
            seconds(c["tpot_s"]),
            f"{c['tokens_per_s_per_gpu']:,.0f}",
            f"{c['tokens_per_s_per_user']:,.1f}",
        )
        for i, c in enumerate(r["top"])
    ]
    front = [
        (
            _serve_layout(p["layout"]),
            p["batch_cap_per_replica"],
            f"{p['tokens_per_s_per_gpu']:,.0f}",
            f"{p['tokens_per_s_per_user']:,.1f}",
        )
        for p in r["pareto"]
    ]
    reasons: dict[str, int] = {}
    for x in r["rejected"]:
        key = x["reason"].split(" at batch")[0].split(" >")[0]
        reasons[key] = reasons.get(key, 0) + 1
    return "\n".join(
        [
            head,
            f"{r['layouts_evaluated']} layouts, {r['points_evaluated']:,} batch caps in {seconds(r['elapsed_s'])};"
            f" {r['layouts_meeting_targets']} meet the targets",
            "",
            table(rows, ["#", "layout", "replicas", "GPUs", "batch", "TTFT p99", "TPOT", "tok/s/GPU", "tok/s/user"])
            if rows
            else "no layout meets the targets",
            "",
            f"Pareto front ({r['pareto_points_total']:,} points, {len(front)} shown)",
            table(front, ["layout", "batch", "tok/s/GPU", "tok/s/user"]),
            "",
            "rejected: " + ", ".join(f"{n} x {k}" for k, n in reasons.items()),
        ]
    )


def _validate_serving(r: dict[str, Any]) -> str:
    def err(x: float | None) -> str:
        return "" if x is None else f"{100 * x:+.1f}%"

    runs = [
        (
            x["case"],
            x["metric_class"],
            f"{x['measured']:.4g}",
            "" if x["predicted"] is None else f"{x['predicted']:.4g}",
            err(x["error"]),
            x["status"],
        )
        for x in r["runs"]
    ]
    sources = [
        (
            s["source"],
            s["metric_class"],
            s["cases"],
            percent(s["mean_abs_error"]),
            percent(s["max_abs_error"]),
            percent(s["loso_mean_abs_error"]),
            percent(s["best_constant_mean_abs_error"]),
        )
        for s in r["sources"]
    ]
    classes = [
        (
            c["metric_class"],
            c["cases"],
            percent(c["mean_abs_error"]),
            percent(c["max_abs_error"]),
            percent(c["loso_mean_abs_error"]),
            percent(c["target_mean"]),
            percent(c["best_constant_mean_abs_error"]),
            "ok" if c["ok"] else "FAIL",
        )
        for c in r["classes"]
    ]
    notes = [f"  {x['case']}: {x['reason']}" for x in r["runs"] if x["status"] in ("physics", "warned", "skipped")]
    return "\n".join(
        [
            table(runs, ["case", "metric", "published", "predicted", "error", "status"]),
            "",
            table(sources, ["source", "metric", "cases", "mean |err|", "max", "LOSO mean", "best constant"]),
            "",
            table(classes, ["metric", "cases", "mean |err|", "max", "LOSO mean", "target", "best constant", ""]),
            "",
            "not fitted:",
            *notes,
        ]
    )


def _validate(r: dict[str, Any]) -> str:
    if "classes" in r:
        return _validate_serving(r)
    out = []
    for src in r["sources"]:
        runs = [x for x in r["runs"] if x["source"] == src["source"]]
        unit = {
            "iteration_time_s": "s",
            "mfu": "",
            "tflops_per_gpu_eq3": "TFLOP/s",
            "tflops_per_gpu_megatron": "TFLOP/s",
            "tokens_per_s_per_gpu": "tok/s",
        }[src["metric"]]
        rows = [
            (x["case"], f"{x['measured']:.3g} {unit}", f"{x['predicted']:.3g} {unit}", f"{100 * x['error']:+.1f}%")
            for x in runs
        ]
        out += [
            f"{src['title']}",
            table(rows, ["run", "published", "predicted", "error"]),
            f"mean |error| {percent(src['mean_abs_error'])}, max {percent(src['max_abs_error'])}",
        ]
        out += [
            f"  [{'ok' if c['ok'] else 'FAIL'}] {c['check']}: {c['value']:.4g} (bound {c['bound']:.4g})"
            for c in src["checks"]
        ]
        out.append("")
    if "held_out" in r:
        out += _held_out(r)
    out.append("all targets hold" if r["all_ok"] else "some targets do NOT hold")
    return "\n".join(out)


def _held_out(r: dict[str, Any]) -> list[str]:
    """Leave-one-source-out: each source against the scales fitted on all the others."""
    rows = [
        (
            s["source"],
            s["cases"],
            percent(s["mean_abs_error"]),
            percent(s["loso_mean_abs_error"]),
            percent(s["best_constant_error"]) if s["cases"] >= 3 else "-",
            f"{s['loso_compute_scale']:.2f} / {s['loso_comm_scale']:.2f}",
        )
        for s in r["held_out"]["sources"]
    ]
    fit = r["held_out"]["fit_all"]
    lines = [
        "Held out: each source predicted with the shared scales fitted on all the other sources",
        table(rows, ["source", "runs", "model", "held out", "best constant", "compute / comm scale"]),
        f"fit on all sources: compute scale {fit['compute_scale']:.3f}, comm scale {fit['comm_scale']:.3f}",
        "goals (reported, not yet part of the checks):",
    ]
    lines += [
        f"  [{'ok' if g['ok'] else 'not met'}] {g['check']}: {g['value']:.4g} (goal {g['bound']:.4g})"
        for g in r["goals"]
    ]
    return [*lines, ""]


def _layout_short(lay: dict[str, Any]) -> str:
    """A layout in words: 'TP 2+SP · PP 4 (2 virtual) · DP 8, ZeRO-1 over 4 · micro-batch 1'."""
    parts = []
    if lay["tp"] > 1:
        parts.append(f"TP {lay['tp']}" + ("+SP" if lay["sp"] else ""))
    if lay["cp"] > 1:
        parts.append(f"CP {lay['cp']}")
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
        out += [
            "",
            f"planner: the published layout ranks {s['rank_of_published']:,} of {s['feasible']:,} that fit; "
            f"best found {seconds(s['best_step_time_s'])} per step vs {seconds(s['published_step_time_s'])}: "
            f"{_layout_short(s['best_layout'])}",
        ]
    return "\n".join(out)


def _export(r: dict[str, Any]) -> str:
    out = [f"# {r['engine']} {r['engine_version']}", f"$ {r['command']}"]
    for name, text in r["files"].items():
        out += ["", f"--- {name}", text.rstrip()]
    out += [f"note: {n}" for n in r["notes"]]
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


def _validate_memory(r: dict[str, Any]) -> str:
    from meshplan.render import gb, percent

    rows = [
        [
            x["source"],
            x["case"],
            x["metric"],
            f"{x['measured_gib']:.1f}",
            f"{x['predicted_gib']:.1f}",
            f"{x['error']:+.1%}",
        ]
        for x in r["runs"]
    ]
    out = [table(rows, ["source", "case", "figure", "measured GiB", "billed GiB", "error"], align="lllrrr"), ""]
    srcs = [
        [
            s["source"],
            s["reports"],
            str(s["cases"]),
            percent(s["mean_abs_error"]),
            percent(s["max_abs_error"]),
            percent(s["best_constant_error"]),
            "ok" if s["ok"] else "MISSED",
        ]
        for s in r["sources"]
    ]
    head = ["source", "reports", "cases", "mean |error|", "max |error|", "best constant", "targets"]
    out += [table(srcs, head, align="llrrrrl"), ""]
    summary = r["summary"]
    out.append(
        f"all cases: mean |error| {percent(summary['mean_abs_error'])} (target {percent(summary['target_mean'])}), "
        f"max {percent(summary['max_abs_error'])} (target {percent(summary['target_max'])})"
    )
    for v in r["verdicts"]:
        verdict = "fits" if v["fits"] else f"billed {gb(v['over_bytes_per_gpu'])} over HBM"
        out += ["", f"{v['case']}: {gb(v['memory_bytes_per_gpu'])} of {gb(v['hbm_bytes_per_gpu'])}, {verdict}"]
        for s in v.get("savings", []):
            closes = "closes the gap" if s["closes_gap"] else "not enough alone"
            out.append(f"  unstated saving: {s['saving']}: {gb(s['bytes'])} ({closes})")
    return "\n".join(out)


def _validate_any(r: dict[str, Any]) -> str:
    return _validate_memory(r) if "verdicts" in r else _validate(r)


def _calibrate(r: dict[str, Any]) -> str:
    rows = [
        (
            " ".join(x["args"])[:60],
            x["metric"],
            f"{x['measured']:.4g}",
            f"{x['predicted_before']:.4g}",
            f"{100 * x['error_before']:+.1f}%",
            f"{x['predicted_fitted']:.4g}",
            f"{100 * x['error_fitted']:+.1f}%",
        )
        for x in r["runs_detail"]
    ]
    p = r["profile"]
    out = [
        table(rows, ["run", "metric", "measured", "catalog", "error", "fitted", "error"]),
        "",
        f"profile: compute_scale {p['compute_scale']:.3f}, comm_scale {p['comm_scale']:.3f} "
        f"(fitted: {', '.join(r['fitted'])}; not identified by these runs: "
        f"{', '.join(k for k, ok in r['identified'].items() if not ok) or 'none'})",
        "chosen by the least error held out: "
        + ", ".join(f"{k.replace('+', ' and ')} {percent(v)}" for k, v in r["held_out_by_choice"].items()),
        f"mean |error| over {r['runs']} runs: {percent(r['mean_abs_error_before'])} with the catalog, "
        f"{percent(r['mean_abs_error_fitted'])} fitted, {percent(r['mean_abs_error_held_out'])} held out "
        "(each run predicted from the others)",
    ]
    out.append(f"written to {r['profile_file']}" if r["profile_file"] else "profile (write it with --out FILE):")
    if not r["profile_file"]:
        out.append(r["profile_toml"].rstrip())
    return "\n".join(out)


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "calibrate": _calibrate,
    "list": _list,
    "stacks": _stacks,
    "check": _check,
    "plan": _plan,
    "recipe": _recipe,
    "export": _export,
    "estimate": _estimate,
    "collectives": _collectives,
    "validate": _validate_any,
    "params": _params,
    "memory": _memory,
    "fit": _fit,
    "serving": _serving,
    "serve": _serve,
    "serve-plan": _serve_plan,
}


def render_table(command: str, result: dict[str, Any]) -> str:
    return RENDERERS[command](result)
