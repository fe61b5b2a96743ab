"""The released sources (published_runs_3.json) as a user gets them, and the step-time band's promise on them.

python benchmarks/released_sources.py            # the tables of docs/validation.md, "Released sources"

1. Each released source as its run file types it, predicted with the catalog's constants (what `meshplan estimate`
   prints): mean and max |error|, its best single constant, and how many of its runs lie inside the band estimate
   printed before the released sources joined (the old rule: every held-out run of the in-house sources pooled,
   P10 and P90; re-derived here, it is the catalog/held_out.toml of that commit).
2. The band's coverage of sources never seen: each released source held out in turn, the band built without it by
   validation/band.py's rule (the other sources' residuals, each from a fit that left that source out) and its runs
   as a user gets them checked against it, a run whose GPU kind, stack or parallelism mix none of the other
   sources used taking their range (step 4; also counted without it); beside the old rule's band, which never saw
   any released source.
3. The new band (every source) on the in-house sources: its bounds as factors, and the share of their runs inside.
4. The released memory sources: mean and max |error| and the best constant (`meshplan validate --memory`).

About two minutes on one core: every source is evaluated a few times over.
"""

from __future__ import annotations

import math
import statistics
from functools import cache
from typing import Any

from meshplan.reports.estimate import BAND_CLASSES, band_class
from meshplan.reports.novelty import kinds_of, mix_of, run_kinds, unseen
from meshplan.spec.profile import IDENTITY, from_values
from meshplan.validation import fit as profile_fit
from meshplan.validation import training as v
from meshplan.validation.band import held_out_band, held_out_ratios
from meshplan.validation.memory import validate_memory

RELEASED = ("fms_fsdp", "kempnerforge_mfu", "kempnerforge_weak", "megatron_moe_zoo", "qwen_lora", "torchtitan_h200")


@cache
def results(name: str, compute_scale: float = 1.0) -> tuple[v.RunResult, ...]:
    profile = IDENTITY if compute_scale == 1.0 else from_values({"compute_scale": compute_scale})
    return tuple(v.run_source(name, profile))


def ratio(metric: str, error: float) -> float:
    """Measured over predicted step time."""
    return 1 / (1 + error) if metric.endswith("_s") else 1 + error


def metric(name: str) -> str:
    return str(v.sources()[name]["source"]["metric"])


def loso_report(names: list[str], sens: list[profile_fit.Sensitivity]) -> dict[str, Any]:
    """What `meshplan validate` holds for the band, over ``names`` only: each source's residuals from the compute
    scale fitted on the others of ``names``."""
    held = []
    for name in names:
        others = [r for r in sens if r.source != name and r.source in names]
        scale = profile_fit.fit(others, free=v.SHARED_SCALES).profile.compute_scale
        held.append({"source": name, "loso_residuals": [r.error for r in results(name, scale)]})
    return {
        "sources": [{"source": n, "metric": metric(n)} for n in names],
        "runs": [{"source": n, "layout": r.layout} for n in names for r in results(n)],
        "held_out": {"sources": held},
    }


def old_band(report: dict[str, Any]) -> dict[str, float]:
    """The rule before: P10 and P90 of every held-out run pooled (and per band class), each run weighing the same."""
    pooled: dict[str | None, list[float]] = {None: [], **{axis: [] for axis in BAND_CLASSES}}
    layouts = {
        n["source"]: [r["layout"] for r in report["runs"] if r["source"] == n["source"]] for n in report["sources"]
    }
    for s in report["held_out"]["sources"]:
        for e, lay in zip(s["loso_residuals"], layouts[s["source"]], strict=True):
            x = ratio(metric(s["source"]), e)
            pooled[None].append(x)
            if (axis := band_class(cp=lay.get("cp", 1), ep=lay.get("ep", 1))) is not None:
                pooled[axis].append(x)
    out = {}
    for axis, xs in pooled.items():
        deciles = statistics.quantiles(sorted(xs), n=10, method="inclusive")
        key = f"{axis}_time_ratio" if axis else "time_ratio"
        out |= {f"{key}_p10": deciles[0], f"{key}_p90": deciles[-1]}
    return out


def pooled_band(report: dict[str, Any]) -> dict[str, float]:
    """The alternative considered first: every run of K sources weighing 1 / (K n), and the bounds that mixture's
    quantiles at the split-conformal level ceil(0.9 (K + 1)) / K and its mirror (above 1: the extremes, widened to
    the every-run band, as band.py's step 3)."""
    ratios = held_out_ratios(report)
    out: dict[str, float] = {}
    for axis in (None, *BAND_CLASSES):
        groups = ratios[axis]
        k = len(groups)
        points = sorted((r, 1 / (k * len(rs))) for rs in groups.values() for r in rs)
        level = math.ceil(0.9 * (k + 1) - 1e-9) / k
        key = f"{axis}_time_ratio" if axis else "time_ratio"
        if level > 1:
            lo, hi = min(p[0] for p in points), max(p[0] for p in points)
            lo, hi = min(lo, out["time_ratio_p10"]), max(hi, out["time_ratio_p90"])
        else:
            lo, hi = _read(points, 1 - level, below=True), _read(points, level, below=False)
        out |= {f"{key}_p10": lo, f"{key}_p90": hi}
    return out


def _read(points: list[tuple[float, float]], level: float, *, below: bool) -> float:
    """The least value whose cumulative weight from below reaches ``level`` (``below``: the largest value whose
    cumulative weight strictly before it is at most ``level``)."""
    total = 0.0
    for value, weight in points:
        if below and total + weight > level + 1e-12:
            return value
        total += weight
        if not below and total >= level - 1e-12:
            return value
    return points[-1][0]


def inside(name: str, band: dict[str, float], *, novelty: bool = True) -> int:
    """How many of a source's runs, as a user gets them (the catalog's constants), lie inside ``band`` (built
    without it). ``novelty``: a run whose GPU kind, stack or parallelism mix no other source used takes the range
    of every held-out run of the others (validation/band.py step 4)."""
    seen = kinds_of(data for n, data in v.sources().items() if n != name)
    count = 0
    kinds = run_kinds(v.sources()[name])
    for r, (gpu, stack, _) in zip(results(name), kinds, strict=True):  # a layout takes its classes' bands
        degrees = {"cp": r.layout.get("cp", 1), "ep": r.layout.get("ep", 1)}
        keys = [f"{a}_time_ratio" for a in BAND_CLASSES if degrees[a] > 1 and f"{a}_time_ratio_p10" in band]
        keys = keys or ["time_ratio"]
        lo, hi = min(band[f"{k}_p10"] for k in keys), max(band[f"{k}_p90"] for k in keys)
        axes = {a: int(r.layout.get(a, 1)) for a in ("tp", "pp", "cp", "ep")}
        if novelty and "unseen_time_ratio_p10" in band and unseen(gpu=gpu, stack=stack, mix=mix_of(**axes), seen=seen):
            lo, hi = min(lo, band["unseen_time_ratio_p10"]), max(hi, band["unseen_time_ratio_p90"])
        count += lo <= ratio(r.metric, r.error) <= hi
    return count


def main() -> None:
    names = list(v.sources())
    in_house = [n for n in names if n not in RELEASED]
    sens = profile_fit.sensitivities(
        lambda p: [(r.source, r.case, r.metric, r.measured, r.predicted) for n in names for r in v.run_source(n, p)],
        constants=("compute_scale", "comm_scale"),
    )
    before = old_band(loso_report(in_house, sens))
    print("## Released sources as typed, before they were used\n")
    print(
        "| source | runs | mean |error| | max |error| | best constant | inside the old band "
        "| inside the new band, built without it | inside the pooled alternative |"
    )
    print("|---|---|---|---|---|---|---|---|")
    total = {"runs": 0, "old": 0, "new": 0, "pooled": 0, "plain": 0}
    errors = []
    for name in RELEASED:
        rs = results(name)
        errs = [abs(r.error) for r in rs]
        errors += errs
        others = loso_report([n for n in names if n != name], sens)
        without = held_out_band(others)
        old_in, new_in, pooled_in = inside(name, before), inside(name, without), inside(name, pooled_band(others))
        plain_in = inside(name, without, novelty=False)
        total = {
            "runs": total["runs"] + len(rs),
            "old": total["old"] + old_in,
            "new": total["new"] + new_in,
            "pooled": total["pooled"] + pooled_in,
            "plain": total["plain"] + plain_in,
        }
        print(
            f"| {name} | {len(rs)} | {100 * statistics.mean(errs):.1f}% | {100 * max(errs):.1f}% "
            f"| {100 * v.best_constant_error([r.measured for r in rs]):.1f}% | {old_in} of {len(rs)} "
            f"| {new_in} of {len(rs)} ({without['time_ratio_p10']:.2f}-{without['time_ratio_p90']:.2f}, "
            f"{int(without['sources'])} sources; {plain_in} without step 4) | {pooled_in} of {len(rs)} |"
        )
    print(
        f"\nall {total['runs']} runs: mean |error| {100 * statistics.mean(errors):.1f}%; inside the old band "
        f"{total['old']} ({100 * total['old'] / total['runs']:.1f}%), inside the new band built without their source "
        f"{total['new']} ({100 * total['new'] / total['runs']:.1f}%; without step 4, the unseen kinds' widening, "
        f"{total['plain']}, {100 * total['plain'] / total['runs']:.1f}%); inside the pooled alternative "
        f"{total['pooled']} ({100 * total['pooled'] / total['runs']:.1f}%)"
    )
    print(f"\nthe old band (every run pooled, in-house sources): {before}")
    band = held_out_band(loso_report(names, sens))
    print(f"\n## The new band, every source: {band}\n")
    for axis in (None, *BAND_CLASSES):
        key = f"{axis}_time_ratio" if axis else "time_ratio"
        if f"{key}_p10" in band:
            print(f"- {axis or 'every run'}: P10 x{band[f'{key}_p10']:.3f}, P90 x{band[f'{key}_p90']:.3f}")
    mine = sum(inside(n, band) for n in in_house)
    runs = sum(len(results(n)) for n in in_house)
    print(f"- in-house runs as a user gets them inside it: {mine} of {runs} ({100 * mine / runs:.1f}%)")
    print(
        "\n## Each in-house source held out of the band in turn (the rule checked on sources that shaped the model)\n"
    )
    counts = {"runs": 0, "new": 0, "pooled": 0}
    for name in in_house:
        others = loso_report([n for n in names if n != name], sens)
        counts["runs"] += len(results(name))
        counts["new"] += inside(name, held_out_band(others))
        counts["pooled"] += inside(name, pooled_band(others))
    print(
        f"inside the new band built without their source: {counts['new']} of {counts['runs']} "
        f"({100 * counts['new'] / counts['runs']:.1f}%); the pooled alternative: {counts['pooled']} "
        f"({100 * counts['pooled'] / counts['runs']:.1f}%)"
    )
    print("\n## Released memory sources\n")
    print("| source | cases | mean |error| | max |error| | best constant |")
    print("|---|---|---|---|---|")
    for s in validate_memory()["sources"]:
        if not s["targets"]:
            print(
                f"| {s['source']} | {s['cases']} | {100 * s['mean_abs_error']:.1f}% | {100 * s['max_abs_error']:.1f}% "
                f"| {100 * s['best_constant_error']:.1f}% |"
            )


if __name__ == "__main__":
    main()
