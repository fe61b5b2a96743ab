"""Tables of the checks against published measurements: validate (training, serving, memory) and calibrate."""

from __future__ import annotations

from typing import Any

from meshplan.render import gb, percent, table
from meshplan.spec.profile import CONSTANTS

SERVING_CLASS_HEAD = ["metric", "cases", "mean |err|", "max", "LOSO mean", "sources", "LOSO by source", "target"]


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
            c["sources"],
            percent(c["loso_source_mean_abs_error"]),
            percent(c["target_mean"]),
            percent(c["best_constant_mean_abs_error"]),
            "ok" if c["ok"] else "FAIL",
        )
        for c in r["classes"]
    ]
    notes = [f"  {x['case']}: {x['reason']}" for x in r["runs"] if x["status"] in ("physics", "warned", "skipped")]
    band = r["band"]
    bands = [
        (
            c["metric_class"],
            int(band[f"{(key := c['metric_class'].replace('-', '_'))}_runs"]),
            int(band[f"{key}_sources"]),
            f"{band[f'{key}_widening']:.2f}" if band[f"{key}_sources"] >= 2 else "borrowed",
            f"{band[f'{key}_time_ratio_p10']:.3f}",
            f"{band[f'{key}_time_ratio_p50']:.3f}",
            f"{band[f'{key}_time_ratio_p90']:.3f}",
        )
        for c in r["classes"]
    ]
    return "\n".join(
        [
            table(runs, ["case", "metric", "published", "predicted", "error", "status"]),
            "",
            table(sources, ["source", "metric", "cases", "mean |err|", "max", "LOSO mean", "best constant"]),
            "",
            table(
                classes,
                [*SERVING_CLASS_HEAD, "best constant", ""],
            ),
            "",
            "measured over predicted time, held out by source, each source weighing the same, widened for few "
            "sources (the band `serve` prints):",
            table(bands, ["metric", "cases", "sources", "widened", "P10", "median", "P90"]),
            "",
            "per engine family: the class's spread around the family's median, covering the class's band:",
            table(_family_rows(band), ["metric", "engine", "cases", "sources", "P10", "median", "P90"]),
            "",
            "what a question no row ran adds to each side, in logs and in quadrature (an engine, a GPU kind, MoE or"
            " dense, MLA or not):",
            table(
                [
                    (c["metric_class"], *(f"{band[f'{_key(c)}_unseen_{a}_log']:.3f}" for a in SERVING_AXES))
                    for c in r["classes"]
                ],
                ["metric", *SERVING_AXES],
            ),
            "",
            *_under_load(r["under_load"]),
            "",
            *_few_moe(r["few_moe"]),
            "",
            "not fitted:",
            *notes,
        ]
    )


def _under_load(u: dict[str, Any]) -> list[str]:
    """The figures under Poisson arrivals (MLPerf Server rows): published, predicted, the band, inside or not."""

    def ms(x: float | None) -> str:
        return "saturated" if x is None else f"{1e3 * x:,.1f}"

    rows = [
        (
            f["case"],
            f["figure"],
            ms(f["measured_s"]),
            ms(f["predicted_s"]),
            "" if f["error"] is None else f"{100 * f['error']:+.0f}%",
            f"{ms(f['band_s'][0])} - {ms(f['band_s'][1])}",
            "yes" if f["inside"] else "no",
        )
        for f in u["figures"]
        if f["figure"].endswith("_p99")
    ]
    err, const = u["p99_mean_abs_error"], u["p99_best_constant_mean_abs_error"]
    return [
        f"under Poisson arrivals near capacity, p99 in ms ({u['source']}; nothing set on these rows):",
        table(rows, ["case", "figure", "published", "predicted", "error", "P10-P90 printed", "inside"]),
        f"mean |error| at p99: TTFT {percent(err['ttft'])}, TPOT {percent(err['tpot'])} (best constant "
        f"{percent(const['ttft'])}, {percent(const['tpot'])}; target {percent(u['target_p99'])}: "
        f"{'ok' if u['ok'] else 'FAIL'}); every figure (p50, p99, mean) inside the band serve prints: "
        f"{percent(u['inside_band'])}",
        "the same systems' Offline runs (every prompt queued at once: serve --num-requests 24576), tokens/s:",
        table(
            [
                _compared(
                    o["case"],
                    f"{o['measured_tokens_per_s']:,.0f}",
                    f"{o['predicted_tokens_per_s']:,.0f}",
                    o["error"],
                    f"{o['band_tokens_per_s'][0]:,.0f} - {o['band_tokens_per_s'][1]:,.0f}",
                    o["inside"],
                )
                for o in u["offline"]
            ],
            ["case", "published", "predicted", "error", "P10-P90 printed", "inside"],
        ),
        f"mean |error| {percent(u['offline_mean_abs_error'])} (best constant "
        f"{percent(u['offline_best_constant_mean_abs_error'])})",
    ]


def _compared(case: str, published: str, predicted: str, error: float, extra: str, inside: bool) -> tuple[str, ...]:
    """One published figure beside meshplan's: the case, both figures, the error, a column of the table's own and
    whether the published figure lies inside the band."""
    return case, published, predicted, f"{100 * error:+.1f}%", extra, "yes" if inside else "no"


def _few_moe(f: dict[str, Any]) -> list[str]:
    """A MoE model decoding a few sequences a step: each published TPOT beside serve's, and the band they make."""
    b = f["band"]
    rows = [
        _compared(
            x["case"],
            f"{1e3 * x['measured_s']:,.2f}",
            f"{1e3 * x['predicted_s']:,.2f}",
            x["error"],
            f"{x['batch_per_replica']:.3g}",
            x["inside_band_without_source"],
        )
        for x in f["rows"]
    ]
    return [
        "a MoE model decoding 8 or fewer sequences a step, TPOT in ms (catalog/serving/few_moe_decode.toml; nothing "
        "set on these rows; the band serve prints there is its decode band's union with this one):",
        table(rows, ["case", "published", "predicted", "error", "batch", "inside the band without its source"]),
        f"measured over predicted, P10-P90 x{b['decode_few_moe_time_ratio_p10']:.2f}-"
        f"{b['decode_few_moe_time_ratio_p90']:.2f} (median x{b['decode_few_moe_time_ratio_p50']:.2f}; "
        f"{int(b['decode_few_moe_runs'])} runs of {int(b['decode_few_moe_sources'])} sources, widened "
        f"x{b['decode_few_moe_widening']:.2f}); mean |error| {percent(f['mean_abs_error'])} (best constant "
        f"{percent(f['best_constant_mean_abs_error'])}); inside the band built without their source: "
        f"{percent(f['inside_band_without_source'])}",
    ]


SERVING_AXES = ("engine", "gpu", "moe", "mla")


def _key(c: dict[str, Any]) -> str:
    return str(c["metric_class"]).replace("-", "_")


def _family_rows(band: dict[str, float]) -> list[tuple[str, ...]]:
    """(class, engine, runs, sources, P10, median, P90) of each engine family's serving band."""
    out = []
    for name in band:
        if not (name.endswith("_sources") and "_engine_" in name):
            continue
        prefix = name.removesuffix("_sources")
        cls, engine = prefix.split("_engine_")
        out.append(
            (
                cls.replace("_", "-"),
                engine.replace("_", "-"),
                str(int(band[f"{prefix}_runs"])),
                str(int(band[name])),
                *(f"{band[f'{prefix}_time_ratio_{q}']:.3f}" for q in ("p10", "p50", "p90")),
            )
        )
    return out


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
            "tflops_per_gpu_mcore": "TFLOP/s",
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
    out.append("every per-source check holds" if r["all_ok"] else "some per-source checks do NOT hold")
    missed = [g for g in r.get("goals", []) if not g["ok"]]
    if missed:
        out.append(f"{len(missed)} of {len(r['goals'])} generalization goals not met (listed above)")
    elif "goals" in r:
        out.append(f"all {len(r['goals'])} generalization goals met")
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
        *_band_lines(r.get("band")),
        "goals (reported, not yet part of the checks):",
    ]
    lines += [
        f"  [{'ok' if g['ok'] else 'not met'}] {g['check']}: {g['value']:.4g} (goal {g['bound']:.4g})"
        for g in r["goals"]
    ]
    steps = [
        (
            p["source"],
            f"{p['gpus_from']:,} -> {p['gpus_to']:,}",
            p["from_case"][:48],
            f"{100 * p['measured_change']:+.1f}%",
            f"{100 * p['predicted_change']:+.1f}%",
            f"{100 * (p['predicted_change'] - p['measured_change']):+.1f}",
        )
        for p in r.get("scaling", [])
    ]
    if steps:
        lines += [
            "",
            "Per-GPU throughput as the fleet grows (runs alike but for the fleet, the batch and data parallelism)",
            table(steps, ["source", "GPUs", "from", "published", "predicted", "points"]),
        ]
    return [*lines, ""]


def _band_lines(band: dict[str, float] | None) -> list[str]:
    """The step-time band the held-out errors make (catalog/held_out.toml), with the sources behind each."""
    if not band:
        return []
    lines = [
        f"step-time band (measured over predicted, held out, each source weighing alike): P10-P90 "
        f"{band['time_ratio_p10']:.3f}-{band['time_ratio_p90']:.3f} over {int(band['runs'])} runs from "
        f"{int(band['sources'])} sources"
    ]
    for axis, what in (("cp", "context parallelism"), ("ep", "expert parallelism")):
        if f"{axis}_runs" in band:
            lines.append(
                f"  with {what}: {band[f'{axis}_time_ratio_p10']:.3f}-{band[f'{axis}_time_ratio_p90']:.3f} "
                f"(median {band[f'{axis}_time_ratio_p50']:.3f}) over {int(band[f'{axis}_runs'])} runs from "
                f"{int(band[f'{axis}_sources'])} sources"
                + ("" if band[f"{axis}_promised"] else ": too few for the promise, every held-out run's range")
            )
    if "unseen_time_ratio_p10" in band:
        lines.append(
            f"  on a GPU kind, stack or parallelism mix no published run used: "
            f"{band['unseen_time_ratio_p10']:.3f}-{band['unseen_time_ratio_p90']:.3f} (every held-out run's range)"
        )
    return lines


def _validate_memory(r: dict[str, Any]) -> str:
    from meshplan.render import percent

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
            ("ok" if s["ok"] else "MISSED") if s["targets"] else "none (released)",
        ]
        for s in r["sources"]
    ]
    head = ["source", "reports", "cases", "mean |error|", "max |error|", "best constant", "targets"]
    out += [table(srcs, head, align="llrrrrl"), ""]
    summary = r["summary"]
    out.append(
        f"all cases: mean |error| {percent(summary['mean_abs_error'])}, max {percent(summary['max_abs_error'])}; "
        f"the {summary['targeted_cases']} cases of sources with targets: mean "
        f"{percent(summary['targeted_mean_abs_error'])} (target {percent(summary['target_mean'])}), "
        f"max {percent(summary['targeted_max_abs_error'])} (target {percent(summary['target_max'])})"
    )
    for v in r["verdicts"]:
        verdict = "fits" if v["fits"] else f"billed {gb(v['over_bytes_per_gpu'])} over HBM"
        out += ["", f"{v['case']}: {gb(v['memory_bytes_per_gpu'])} of {gb(v['hbm_bytes_per_gpu'])}, {verdict}"]
        for s in v.get("savings", []):
            closes = "closes the gap" if s["closes_gap"] else "not enough alone"
            out.append(f"  unstated saving: {s['saving']}: {gb(s['bytes'])} ({closes})")
        if "cause" in v:
            c = v["cause"]
            closer = c["closed_by"] or "no listed saving alone"
            out.append(
                f"  cause: the bill's largest term, {c['term'].replace('_', ' ')} ({gb(c['term_bytes_per_gpu'])}, "
                f"{percent(c['term_share'])}), puts it over; closed by: {closer}"
            )
    return "\n".join(out)


def validate_table(r: dict[str, Any]) -> str:
    return _validate_memory(r) if "verdicts" in r else _validate(r)


def calibrate_table(r: dict[str, Any]) -> str:
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
        f"profile: {', '.join(f'{name} {p[name]:.3f}' for name in CONSTANTS)} "
        f"(fitted: {', '.join(r['fitted']) or 'nothing: the catalog predicts the runs best'}; not identified: "
        f"{', '.join(k for k, ok in r['identified'].items() if not ok) or 'none'})",
        *(f"{name} not fitted: {why}" for name, why in r.get("not_identified", {}).items()),
        "chosen by the least error held out: "
        + ", ".join(
            f"{' and '.join(c['scales']) or 'none'} {percent(c['mean_abs_error_held_out'])}"
            for c in r["held_out_by_choice"]
        ),
        f"mean |error| over {r['runs']} runs: {percent(r['mean_abs_error_before'])} with the catalog, "
        f"{percent(r['mean_abs_error_fitted'])} fitted, {percent(r['mean_abs_error_held_out'])} held out "
        "(each run predicted from the others)",
        f"measured over held-out predicted step time: P10 {r['time_ratio_p10']:.3f}, P90 {r['time_ratio_p90']:.3f} "
        "(the band estimate and plan print with this profile)",
    ]
    out.append(f"written to {r['profile_file']}" if r["profile_file"] else "profile (write it with --out FILE):")
    if not r["profile_file"]:
        out.append(r["profile_toml"].rstrip())
    return "\n".join(out)
