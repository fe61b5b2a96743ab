"""The step-time band ``meshplan estimate`` prints beside every step time, as a promise for a source never seen.

What it promises: for a run from a published source meshplan has never been checked against, measured over
predicted step time lies between the band's bounds four times in five (its P10 and P90). The published sources are
the sample: each is one draw of "a source never seen" (its stack, its fleet, its way of measuring), so the band is
built from their residuals with every source weighing the same, whatever its number of runs, and each source's
residuals are taken from a fit that left that source out (validation/training.py ``leave_one_source_out``).

The rule (``source_band``), for the runs of a band class (every run; those with context parallelism; those with
expert parallelism and none of context parallelism: ``reports.estimate.BAND_CLASSES``), K the sources behind it:

1. Each source's result is the interval that holds four in five of its own held-out time ratios (measured over
   predicted step time): its P10 and P90 (for a source of one or two runs, its least and largest).
2. The band is a pair of order statistics over those K results, at the split-conformal rank with the sources as
   the exchangeable units: its lower bound the k-th smallest of the sources' P10, its upper bound the k-th largest
   of their P90, k = K + 1 - ceil(0.9 (K + 1)) (with 21 sources, the second of each). A never-seen source is one
   more draw: its P90 is above the k-th largest of the K with probability at most k / (K + 1), about a tenth, and
   its P10 below the k-th smallest likewise; so with probability at least 1 - 2k / (K + 1) (0.82 with 21 sources)
   four in five of its runs or more lie inside. A source weighs the same whatever its number of runs (a source of
   58 runs gives one P10 and one P90, as one of 3 does).
3. Below 9 sources k is 0: no order statistic of so few sources makes the promise. Such a band is the range of
   every held-out run of every source, their least and largest time ratio (which holds the class's own runs), and
   it says how many sources stand behind the class. (It was the class's own runs and the every-run band: held out
   in turn, 23 of the 29 runs with CP or EP fell inside it where 222 of the other 229 fell inside theirs; inside
   the range, 28; docs/validation.md.)
4. A layout whose GPU kind, stack or parallelism mix (its axes among TP, PP, CP and EP above 1) no published run
   used (reports/novelty.py) is no draw of the sources behind any band: its band reaches at least that same range
   (``unseen_time_ratio_p10``, ``_p90``). Derived from the sources held out in turn: of the 5 runs whose mix no
   other source had (the model zoo's EP without PP and its CP with EP, NeMo's PP alone), 4 fell outside the band
   built without their source; of the 23 on a kind no other source ran on, none did (docs/validation.md).

The median (``_p50``) is that of every run of the class, each source weighing the same: what the class's runs say
of the model's bias (``band_warning``).

A published run counts in one class (a run with both CP and EP is a CP run); a layout to predict with both takes
the band covering the CP and the EP bands, the lower P10 and the higher P90 (reports/estimate.py ``uncertainty``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from meshplan.reports.estimate import BAND_CLASSES, band_class

COVERAGE = 0.8
"""The band's promise: this share of a never-seen source's runs inside it (P10 to P90)."""


def conformal_rank(sources: int) -> int:
    """k of step 2, K + 1 - ceil((1 + COVERAGE) / 2 x (K + 1)): which order statistic of the sources' P10 (from
    below) and P90 (from above) bound the band; 0 when K sources are too few to promise COVERAGE."""
    if sources < 1:
        raise ValueError("a band needs at least one source")
    return sources + 1 - math.ceil((1 + COVERAGE) / 2 * (sources + 1) - 1e-9)


def _tenths(ratios: Sequence[float]) -> tuple[float, float]:
    """A source's P10 and P90 (inclusive deciles; its least and largest of one or two runs)."""
    if len(ratios) < 3:
        return min(ratios), max(ratios)
    deciles = statistics.quantiles(sorted(ratios), n=10, method="inclusive")
    return deciles[0], deciles[-1]


def _weighted_median(by_source: Mapping[str, Sequence[float]]) -> float:
    """The median of every run, each of K sources weighing 1 / K (its n runs 1 / (K n) each)."""
    k = len(by_source)
    total = 0.0
    for value, weight in sorted((r, 1 / (k * len(rs))) for rs in by_source.values() for r in rs):
        total += weight
        if total >= 0.5 - 1e-12:
            return value
    raise AssertionError("weights sum to 1")


def source_band(by_source: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """``lo``, ``p50``, ``hi``, ``runs``, ``sources`` and ``promised`` of each source's time ratios: the module's
    rule, steps 1 and 2 (``promised`` 1.0), or, too few sources, the class's least and largest ratio (0.0; step 3
    then widens it to every run's range, ``held_out_band``)."""
    groups = {name: list(ratios) for name, ratios in by_source.items() if ratios}
    k = conformal_rank(len(groups))
    tenths = [_tenths(ratios) for ratios in groups.values()]
    values = [r for ratios in groups.values() for r in ratios]
    lows, highs = sorted(t[0] for t in tenths), sorted((t[1] for t in tenths), reverse=True)
    return {
        "lo": lows[k - 1] if k > 0 else min(values),
        "p50": _weighted_median(groups),
        "hi": highs[k - 1] if k > 0 else max(values),
        "runs": float(len(values)),
        "sources": float(len(groups)),
        "promised": float(k > 0),
    }


def held_out_ratios(report: Mapping[str, Any]) -> dict[str | None, dict[str, list[float]]]:
    """Per band class (None: every run) and per source, the time ratio of each run held out of the fit: a rate's
    error e (predicted / measured - 1) is a time ratio of 1 + e, a time's 1 / (1 + e)."""
    metric = {s["source"]: s["metric"] for s in report["sources"]}
    layouts: dict[str, list[dict[str, Any]]] = {}
    for run in report["runs"]:
        layouts.setdefault(run["source"], []).append(run["layout"])
    out: dict[str | None, dict[str, list[float]]] = {None: {}, **{axis: {} for axis in BAND_CLASSES}}
    for s in report["held_out"]["sources"]:
        name = s["source"]
        for e, layout in zip(s["loso_residuals"], layouts[name], strict=True):
            ratio = 1 / (1 + e) if metric[name].endswith("_s") else 1 + e
            out[None].setdefault(name, []).append(ratio)
            if (axis := band_class(cp=layout.get("cp", 1), ep=layout.get("ep", 1))) is not None:
                out[axis].setdefault(name, []).append(ratio)
    return out


def held_out_band(report: Mapping[str, Any]) -> dict[str, float]:
    """catalog/held_out.toml's numbers from a ``meshplan validate`` report: ``time_ratio_p10`` and ``_p90`` (the
    every-run band), the ``runs`` and ``sources`` behind it and whether they are enough for the promise
    (``promised``, 1 or 0: step 3), the range of every run (``unseen_``: step 4), and per band class (``cp_``,
    ``ep_``) its bounds, median, runs, sources and ``promised`` (the module's rule)."""
    ratios = held_out_ratios(report)
    every = source_band(ratios[None])
    values = [r for ratios in ratios[None].values() for r in ratios]
    widest = {"lo": min(min(values), every["lo"]), "hi": max(max(values), every["hi"])}
    if not every["promised"]:
        every |= widest
    out = {
        "time_ratio_p10": every["lo"],
        "time_ratio_p90": every["hi"],
        "runs": every["runs"],
        "sources": every["sources"],
        "promised": every["promised"],
        "unseen_time_ratio_p10": widest["lo"],
        "unseen_time_ratio_p90": widest["hi"],
    }
    for axis in BAND_CLASSES:
        if not ratios[axis]:
            continue
        mine = source_band(ratios[axis])
        if not mine["promised"]:
            mine |= widest
        out |= {
            f"{axis}_time_ratio_p10": mine["lo"],
            f"{axis}_time_ratio_p50": mine["p50"],
            f"{axis}_time_ratio_p90": mine["hi"],
            f"{axis}_runs": mine["runs"],
            f"{axis}_sources": mine["sources"],
            f"{axis}_promised": mine["promised"],
        }
    return out
