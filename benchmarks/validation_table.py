"""The validation tables of docs/validation.md, as Markdown, from `meshplan validate`.

python benchmarks/validation_table.py > /tmp/validation.md
python benchmarks/validation_table.py --write-band   # also refresh meshplan/catalog/held_out.toml,
                                                     # meshplan/catalog/published_mfu.toml and
                                                     # meshplan/catalog/serving/held_out.toml

The band is measured over predicted step time on the published runs, each source held out of the fit and weighing
the same (validation/band.py states the rule); `meshplan estimate` prints it beside every step time with the number
of sources behind it. The published MFU range is the lowest and highest MFU the published runs measured, per GPU
kind, class of layout and matmul kind (validation/mfu_range.py); `meshplan estimate`, `recipe` and `plan` warn above
it. The serving band is the same over the published serving measurements, per metric class (`meshplan validate
--serving`); `meshplan serve` prints it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from meshplan.validation.band import conformal_rank
from meshplan.validation.mfu_range import published_mfu_range, range_toml
from meshplan.validation.serving import validate_serving
from meshplan.validation.training import held_out_band, validate

SERVING_BAND_CLASSES = ("decode", "prefill", "throughput_dense", "throughput_moe")

UNITS = {
    "iteration_time_s": ("iteration time", "s", 1.0),
    "tflops_per_gpu_eq3": ("TFLOP/s per GPU", "", 1.0),
    "tflops_per_gpu_megatron": ("TFLOP/s per GPU (Megatron's count)", "", 1.0),
    "tflops_per_gpu_mcore": ("TFLOP/s per GPU (Megatron-Core's 2025 count)", "", 1.0),
    "mfu": ("MFU", "%", 100.0),
    "tokens_per_s_per_gpu": ("tokens/s per GPU", "", 1.0),
}


def main() -> None:
    report = validate()
    for src in report["sources"]:
        label, unit, scale = UNITS[src["metric"]]
        print(f"### {src['title']}\n")
        print(f"| run | published {label} | predicted | error | layout chosen |")
        print("|---|---|---|---|---|")
        for r in (x for x in report["runs"] if x["source"] == src["source"]):
            tuned = {k: v for k, v in r["layout"].items() if k in ("micro_batch", "vpp")}
            print(
                f"| {r['case']} | {r['measured'] * scale:.3g}{unit} | {r['predicted'] * scale:.3g}{unit} | "
                f"{100 * r['error']:+.1f}% | {tuned or ''} |"
            )
        print(f"\nmean |error| {100 * src['mean_abs_error']:.2f}%, max {100 * src['max_abs_error']:.2f}%")
        if "best_constant_error" in src:
            print(f"; the best single constant: {100 * src['best_constant_error']:.2f}%")
        for c in src["checks"]:
            print(f"- {'holds' if c['ok'] else 'FAILS'}: {c['check']} = {c['value']:.4g} (bound {c['bound']:.4g})")
        print()
    print("All targets hold." if report["all_ok"] else "Some targets do not hold.")
    held_out(report)
    if "--write-band" in sys.argv:
        band = held_out_band(report)
        rank = conformal_rank(int(band["sources"]))
        path = Path(__file__).parent.parent / "meshplan" / "catalog" / "held_out.toml"
        path.write_text(
            "# Written by benchmarks/validation_table.py --write-band: measured over predicted step time, the band\n"
            "# a never-seen source's runs fall in four times in five (validation/band.py): over every published\n"
            "# source of catalog/runs, each held out of the shared-scale fit and weighing the same, the k-th smallest\n"
            f"# of the sources' P10 and the k-th largest of their P90 (the split-conformal rank: k = {rank}).\n"
            f"time_ratio_p10 = {band['time_ratio_p10']:.4f}\n"
            f"time_ratio_p90 = {band['time_ratio_p90']:.4f}\n"
            f"runs = {int(band['runs'])}\n"
            f"sources = {int(band['sources'])}\n"
            f"promised = {int(band['promised'])}\n"
            "# The range of every held-out run, least and largest: the band reaches at least this far for a layout\n"
            "# whose GPU kind, stack or parallelism mix no published run used (validation/band.py step 4).\n"
            f"unseen_time_ratio_p10 = {band['unseen_time_ratio_p10']:.4f}\n"
            f"unseen_time_ratio_p90 = {band['unseen_time_ratio_p90']:.4f}\n"
            "# The same over the runs whose layout uses context parallelism (cp > 1), with their median; under 9\n"
            "# sources (promised = 0) the band is the range of every held-out run (the unseen bounds above).\n"
            + _class_band(band, "cp", sources=True)
            + "# And over the runs with expert parallelism (ep > 1) but none of context parallelism.\n"
            + _class_band(band, "ep", sources=True),
            encoding="utf-8",
        )
        mfu = path.parent / "published_mfu.toml"
        mfu.write_text(range_toml(published_mfu_range(report)), encoding="utf-8")
        write_serving_band()


def write_serving_band() -> None:
    """meshplan/catalog/serving/held_out.toml from `meshplan validate --serving`'s held-out rows."""
    band = validate_serving()["band"]
    path = Path(__file__).parent.parent / "meshplan" / "catalog" / "serving" / "held_out.toml"
    lines = [f"{k} = {int(v)}" if k.endswith(("_runs", "_sources")) else f"{k} = {v:.4f}" for k, v in band.items()]
    path.write_text(
        "# Written by benchmarks/validation_table.py --write-band: measured over predicted time (a latency's ratio,\n"
        "# a rate's inverse), P10, median and P90 per metric class over the published serving measurements\n"
        "# (meshplan validate --serving), each predicted with the correction fitted without its source, each source\n"
        "# weighing the same; widened by t_0.90(k - 1) sqrt(1 + 1/k) / z_0.90 for k sources, a class of one source\n"
        "# borrowing its sibling class's spread (meshplan/validation/serving_band.py); _sources: the sources behind.\n"
        "# _engine_NAME_: the class's spread around that engine family's median, covering the class's band;\n"
        "# _gpu_NAME_, _moe_0/1_, _mla_0/1_: the sources that ran each; _unseen_AXIS_log: the width (in logs) a\n"
        "# question outside them adds to each side, in quadrature (meshplan/reports/serve_band.py).\n"
        "# decode_few_moe_: a MoE model decoding 8 or fewer sequences a step, measured over predicted on the rows of\n"
        "# catalog/serving/few_moe_decode.toml, not held out (no correction), each source weighing the same, widened\n"
        "# for few sources (meshplan/validation/serving_few_moe.py); serve takes its union with the decode band.\n"
        + "".join(f"{line}\n" for line in lines),
        encoding="utf-8",
    )


def _class_band(band: dict, axis: str, *, sources: bool = False) -> str:
    out = "".join(f"{axis}_time_ratio_{q} = {band[f'{axis}_time_ratio_{q}']:.4f}\n" for q in ("p10", "p50", "p90")) + (
        f"{axis}_runs = {int(band[f'{axis}_runs'])}\n"
    )
    if sources:  # the step-time band's: how many sources stand behind it, and whether they make the promise
        out += f"{axis}_sources = {int(band[f'{axis}_sources'])}\n{axis}_promised = {int(band[f'{axis}_promised'])}\n"
    return out


def held_out(report: dict) -> None:
    """The leave-one-source-out table and the goals."""
    print("\n### Held out: each source against the scales fitted on all the others\n")
    print("| source | runs | model | held out | best constant | compute / comm scale fitted without it |")
    print("|---|---|---|---|---|---|")
    for s in report["held_out"]["sources"]:
        const = f"{100 * s['best_constant_error']:.1f}%" if s["cases"] >= 3 else "-"
        print(
            f"| {s['source']} | {s['cases']} | {100 * s['mean_abs_error']:.1f}% "
            f"| {100 * s['loso_mean_abs_error']:.1f}% "
            f"| {const} | {s['loso_compute_scale']:.2f} / {s['loso_comm_scale']:.2f} |"
        )
    fit = report["held_out"]["fit_all"]
    print(f"\nFitted on all sources: compute scale {fit['compute_scale']:.3f}, comm scale {fit['comm_scale']:.3f}.\n")
    for g in report["goals"]:
        print(f"- {'met' if g['ok'] else 'not met'}: {g['check']} = {g['value']:.4g} (goal {g['bound']:.4g})")


if __name__ == "__main__":
    main()
