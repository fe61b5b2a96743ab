"""Tables of the serving reports: the serving bill, one serving layout under load, and the serving planner."""

from __future__ import annotations

from typing import Any

from meshplan.cli.tables_cost import serve_cost_line
from meshplan.render import gb, seconds, table


def serving_table(r: dict[str, Any]) -> str:
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


def _opt_s(x: float | None) -> str:
    return "saturated" if x is None else seconds(x)


def _max_per_gpu(r: dict[str, Any]) -> str:
    return f" (max {r['max_tokens_per_s_per_gpu']:,.0f})" if "max_tokens_per_s_per_gpu" in r else ""


def _engine(r: dict[str, Any]) -> str:
    """The engine predicted, and whether it was stated (``engine_source``)."""
    unstated = ", no engine stated" if r.get("engine_source") == "default" else ""
    return r["engine"] + unstated + LAUNCHED.get(r.get("launch", "cudagraph"), "")


LAUNCHED = {"eager": ", kernels launched eagerly", "compile": ", kernels launched by torch.compile"}
"""What the head line adds for a launch mode other than the engines' default CUDA graphs."""


def serve_table(r: dict[str, Any]) -> str:
    lay = r["layout"]
    head = (
        f"{r['model']} on {r['gpus']} x {r['gpu']} ({_engine(r)}): tp={lay['tp']} pp={lay['pp']} ep={lay['ep']}"
        f"{' dp-attention' if lay['dp_attention'] else ''} x {lay['replicas']} replicas; weights {r['weights_dtype']}"
        f" ({r['quant']}), KV {r['kv_dtype']}; {r['input_len']} in / {r['output_len']} out"
    )
    rate_band = f"{r['tokens_per_s_per_gpu_p10']:,.0f} - {r['tokens_per_s_per_gpu_p90']:,.0f}"
    rows = [
        ("TTFT p50 / p99", f"{_opt_s(r['ttft_s_p50'])} / {_opt_s(r['ttft_s_p99'])}", ""),
        ("TTFT unloaded", seconds(r["ttft_s_unloaded"]), _band(r, "ttft_s_unloaded")),
        ("TPOT mean", seconds(r["tpot_s"]), _band(r, "tpot_s")),
    ]
    if "tpot_s_p99" in r:
        rows[0] = ("TTFT p50/p99/mean", rows[0][1] + f" / {_opt_s(r['ttft_s_mean'])}", _load_band(r, "ttft_s_p99"))
        rows += [
            ("TPOT p50 / p99", f"{seconds(r['tpot_s_p50'])} / {seconds(r['tpot_s_p99'])}", _load_band(r, "tpot_s_p99")),
            ("ITL p99 (one token)", seconds(r["itl_s_p99"]), _load_band(r, "itl_s_p99")),
        ]
    rows += [
        ("tokens/s per GPU", f"{r['tokens_per_s_per_gpu']:,.0f}" + _max_per_gpu(r), rate_band),
        ("tokens/s per user", f"{r['tokens_per_s_per_user']:,.1f}", ""),
        ("requests/s (all replicas)", f"{r['requests_per_s_total']:,.2f}", ""),
        (
            "in flight per replica",
            f"{r['batch_per_replica']:,.1f} of {r['batch_cap_per_replica']:,} ({r['batch_limit']}"
            + (
                f"; cap: {r['batch_cap_limit']})"
                if r.get("batch_cap_limit", r["batch_limit"]) != r["batch_limit"]
                else ")"
            ),
            "",
        ),
        ("knee (90% of max)", f"{r.get('knee_batch_per_replica', 0):,} sequences", ""),
    ]
    if "speculative" in r:
        sp = r["speculative"]
        rows += [
            ("speculative", f"{sp['method']}:{sp['draft_tokens']}, a={sp['acceptance']:g}: "
             f"{sp['tokens_per_step']:.2f} tokens a step", ""),
            ("verify + draft", f"{seconds(sp['verify_s'])} + {seconds(sp['draft_s'])} (plain step "
             f"{seconds(sp['decode_step_s_without'])}: x{sp['decode_speedup']:.2f})", ""),
        ]  # fmt: skip
    if "prefix_cache" in r:
        pc = r["prefix_cache"]
        rows.append(("prefix cache", f"{pc['cached_tokens']:,} cached, {pc['prefill_tokens']:,} prefilled", ""))
    if "static_batch" in r:
        sb = r["static_batch"]
        rows[0] = ("TTFT (the batch's prefill)", seconds(sb["ttft_s"]), _band(sb, "ttft_s"))
        rows.pop()  # no knee: one batch, in and out together
        rows += [
            ("prefill forwards", f"{sb['prefill_forwards']:,} of at most {_default(r, 'max_num_tokens')} tokens", ""),
            ("decode / whole batch", f"{seconds(sb['decode_s'])} / {seconds(sb['run_s'])}", ""),
        ]
    if "disaggregated" in r:
        d = r["disaggregated"]
        rows.pop()  # no knee: the decode pool's batch is set by the prefill pool's output
        rows += [
            ("pools: prefill / decode GPUs", f"{d['prefill_gpus']} / {d['decode_gpus']}", ""),
            ("prefill alone / KV hand-over", f"{seconds(d['prefill_s'])} / {seconds(d['kv_transfer_s'])}", ""),
            ("max requests/s: prefill / decode", f"{d['prefill_requests_per_s_max']:,.2f} / "
             f"{d['decode_requests_per_s_max']:,.2f} (bottleneck: {d['bottleneck']})", ""),
        ]  # fmt: skip
    steps = [
        (k.removesuffix("_s").replace("_", " ") + (" (host-bound)" if k == "host_wait_s" else ""), seconds(v))
        for k, v in r["step_s"].items()
        if k != "host_wait_s" or v > 0  # shown only where the host sets the pace (--launch eager or compile)
    ]
    main = table(rows, ["", "value", "P10 - P90"])
    blocks = [head, "", main, f"({r['uncertainty']})", *serve_cost_line(r), "", "one step"]
    blocks.append(table(steps, ["term", "time"]))
    blocks += ["", "one GPU's memory", table(_serve_memory(r), ["term", "bytes"])]
    defaults = [(d["setting"].replace("_", "-"), d["value"], d["source"]) for d in r.get("defaults_applied", [])]
    if defaults:
        blocks += ["", "defaults applied (not typed)", table(defaults, ["setting", "value", "from"])]
    return "\n".join([*blocks, *(f"WARNING: {w}" for w in r.get("warnings", []))])


def _default(r: dict[str, Any], setting: str) -> str:
    values = [d["value"] for d in r.get("defaults_applied", []) if d["setting"] == setting]
    return f"{int(values[0]):,}" if values else "the typed number of"


def _band(r: dict[str, Any], key: str) -> str:
    return f"{seconds(r[f'{key}_p10'])} - {seconds(r[f'{key}_p90'])}"


def _load_band(r: dict[str, Any], key: str) -> str:
    """The P10-P90 of a figure under load (the p99 where a row shows several): the band of its last number."""
    if key not in r.get("load_band", {}):
        return ""
    lo, hi = r["load_band"][key]
    return f"p99 {_opt_s(lo)} - {_opt_s(hi)}"


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


PLAN_COLUMNS = ["#", "layout", "replicas", "GPUs", "batch", "TTFT p99", "TPOT", "TPOT p99", "tok/s/GPU", "tok/s/user"]


def serve_plan_table(r: dict[str, Any]) -> str:
    t = r["targets"]
    head = (
        f"{r['model']} on {r['gpus']} x {r['gpu']} ({_engine(r)}), {r['input_len']} in / {r['output_len']} out;"
        f" TTFT p99 <= {t['ttft_s_p99'] or '-'} s, TPOT p99 <= {t['tpot_s_p99'] or '-'} s; objective {r['objective']}"
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
            seconds(c.get("tpot_s_p99", c["tpot_s"])),
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
            table(rows, PLAN_COLUMNS) if rows else "no layout meets the targets",
            f"model error: {r['uncertainty']}",
            "",
            f"Pareto front ({r['pareto_points_total']:,} points, {len(front)} shown)",
            table(front, ["layout", "batch", "tok/s/GPU", "tok/s/user"]),
            "",
            "rejected: " + ", ".join(f"{n} x {k}" for k, n in reasons.items()),
            *(f"WARNING: {w}" for w in r.get("warnings", [])),
        ]
    )
