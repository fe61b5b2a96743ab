"""``meshplan calibrate RUNS.json``: a cluster profile fitted from a user's own measured runs.

RUNS.json is a list of objects, each with ``args`` (the ``meshplan estimate``
arguments as typed, e.g. ``["llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8"]``)
and the measured ``step_time_s`` or ``tokens_per_s_per_gpu`` (optionally
``peak_memory_bytes``, compared, not fitted). The profile's shared constants
(scales on the matmul efficiency, collective bandwidth, attention kernels and
memory-bound kernels, the host's speed issuing kernels, which sets the per-layer
host floor, and the host's seconds per step; spec/profile.py) are
fitted over all runs together (profile_fit.fit): nothing, one constant or two,
whichever choice predicts each run best from the others (leave one run out).
A constant no run can move is not fitted (the host's speed, where no run is
host-bound; the report says why), a choice gets at most one free
constant per two runs, and fewer than three runs are
refused: a constant is never fitted to one run. The held-out error reported is
that leave-one-run-out error of the choice made.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meshplan.files import load_json_file, writable, write_text_safely
from meshplan.spec.profile import CONSTANTS, IDENTITY, Profile, band_problem, dump_profile
from meshplan.validation import fit as profile_fit

MIN_RUNS = 3
RUNS_PER_SCALE = 2
"""A choice fits at most one constant per this many runs."""
MOST_FREE = 2
"""At most this many constants are fitted at once: ten runs of one cluster rarely tell three apart."""
METRICS = ("step_time_s", "tokens_per_s_per_gpu")
MEASURED_RANGE = {"step_time_s": (1e-6, 1e6), "tokens_per_s_per_gpu": (1e-3, 1e9)}
"""What a measured run can be: a step of a microsecond to eleven days, a GPU reading a token a thousand seconds to
a billion a second (beyond, a typo or a unit slip, and the fit's band would leave the float range)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredRun:
    """One run of the user's cluster: how it was set up (estimate's arguments) and what was measured."""

    args: tuple[str, ...]
    metric: str
    """step_time_s or tokens_per_s_per_gpu."""
    measured: float
    peak_memory_bytes: float | None = None


def load_runs(path: str | Path) -> list[MeasuredRun]:
    """RUNS.json as MeasuredRun, with one-line errors naming the run."""
    data = load_json_file(path, what="runs file")  # the one guarded reader: a regular file, finite numbers
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of runs, got {type(data).__name__}")
    return [_run(i, item) for i, item in enumerate(data)]


def _run(i: int, item: Any) -> MeasuredRun:
    if not isinstance(item, dict):
        raise ValueError(f"run {i}: expected an object with args and step_time_s or tokens_per_s_per_gpu")
    unknown = sorted(set(item) - {"args", "peak_memory_bytes", *METRICS})
    if unknown:
        raise ValueError(f"run {i}: unknown keys {', '.join(unknown)}")
    args = item.get("args")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args) or not args:
        raise ValueError(f"run {i}: args must be the list of meshplan estimate arguments, as strings")
    if "--profile" in args or any(a.startswith("--profile=") for a in args):
        raise ValueError(f"run {i}: args must not carry --profile (the profile is what is fitted)")
    if {"-h", "--help", "--version"} & set(args):
        raise ValueError(f"run {i}: args must describe a run, not ask for help or the version")
    given = [m for m in METRICS if m in item]
    if len(given) != 1:
        raise ValueError(f"run {i}: give exactly one of step_time_s and tokens_per_s_per_gpu")
    value = item[given[0]]
    low, high = MEASURED_RANGE[given[0]]
    if not _positive(value) or not low <= value <= high:
        raise ValueError(f"run {i}: {given[0]} must be a number in [{low:g}, {high:g}], got {value!r}")
    memory = item.get("peak_memory_bytes")
    if memory is not None and not _positive(memory):
        raise ValueError(f"run {i}: peak_memory_bytes must be a positive number, got {memory!r}")
    return MeasuredRun(args=tuple(args), metric=given[0], measured=float(value), peak_memory_bytes=memory)


def _positive(value: Any) -> bool:
    """A finite number above 0 (JSON's Infinity and NaN, booleans and strings are not)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf


def _estimate(run: MeasuredRun, profile: Profile) -> dict[str, Any]:
    """``meshplan estimate`` of the run's words, read through the request schema (spec/argv.py)."""
    from meshplan.reports.typed import estimate_defaults, estimate_fields, estimate_from_values
    from meshplan.spec.argv import parse_words

    try:
        values = parse_words(run.args, fields=estimate_fields(), defaults=estimate_defaults())
    except ValueError as exc:
        raise ValueError(f"run {' '.join(run.args)[:80]!r}: {exc}") from None
    values["profile"] = None if profile.is_identity else profile.inline()
    return estimate_from_values(values)


def predict(runs: list[MeasuredRun], profile: Profile) -> list[float]:
    """Each run's predicted metric under ``profile``."""
    return [float(_estimate(r, profile)[r.metric]) for r in runs]


def _rows(runs: list[MeasuredRun], profile: Profile) -> list[tuple[str, str, str, float, float]]:
    predicted = predict(runs, profile)
    return [("runs", str(i), r.metric, r.measured, p) for i, (r, p) in enumerate(zip(runs, predicted, strict=True))]


def _error(run: MeasuredRun, predicted: float) -> float:
    return predicted / run.measured - 1


NOT_IDENTIFIED = {
    "host_scale": "no run is host-bound: the hosts issue every layer's kernels faster than the GPUs run them "
    "(core/time/host.py), even at half the catalog's speed, so no run's time moves with the hosts' speed; runs of "
    "small models, short sequences or micro-batch 1 under eager launches would show it",
}
"""Why a constant the runs do not move is left at the catalog's value, for the constants whose reason is not plain
from the name (the report's ``not_identified``)."""


def fit_runs(runs: list[MeasuredRun], *, offered: tuple[str, ...] = CONSTANTS) -> tuple[Profile, dict[str, Any]]:
    """The profile that suits ``runs`` and the numbers of its fit; ValueError when the runs cannot fit one.
    ``offered``: the constants a choice may fit (benchmarks/calibrate_sources.py compares sets of them)."""
    if len(runs) < MIN_RUNS:
        raise ValueError(
            f"{len(runs)} runs cannot fit a profile: give at least {MIN_RUNS} (never one constant per run)"
        )
    sens = profile_fit.sensitivities(lambda p: _rows(runs, p), constants=offered)
    which = profile_fit.identified(sens)
    identified = [name for name, ok in which.items() if ok]
    if not identified:
        raise ValueError("these runs cannot identify any constant: no run's time moves with any scale or the host time")
    # nothing, each identified constant alone, and each pair: the choice whose leave-one-run-out error is least (a
    # handful of runs rarely separates more than two causes: fitting more then overfits; and where the catalog's
    # constants already predict the runs, a fitted constant only adds noise)
    choices = [c for c in profile_fit.subsets(identified, MOST_FREE) if len(runs) >= RUNS_PER_SCALE * len(c)]
    predicted_by_choice = {c: _held_out(sens, list(c)) for c in choices}
    held_by_choice = {
        c: [abs(r.error(p)) for r, p in zip(sens, ps, strict=True)] for c, ps in predicted_by_choice.items()
    }
    best: tuple[str, ...] = min(held_by_choice, key=lambda c: (statistics.mean(held_by_choice[c]), len(c)))
    free = list(best)
    held = held_by_choice[best]
    p10, p90 = prediction_band([r.measured / p for r, p in zip(sens, predicted_by_choice[best], strict=True)])
    fitted = profile_fit.fit(sens, free=free)
    _check_fit(fitted.profile, free, p10, p90)
    before = [abs(_error(run, p)) for run, p in zip(runs, predict(runs, IDENTITY), strict=True)]
    after = [abs(_error(run, p)) for run, p in zip(runs, predict(runs, fitted.profile), strict=True)]
    profile = dataclasses.replace(
        fitted.profile,
        source=f"meshplan calibrate: {len(runs)} runs; fitted {', '.join(free) or 'nothing (catalog best held out)'}; "
        f"mean |error| {100 * statistics.mean(before):.1f}% before, {100 * statistics.mean(after):.1f}% fitted, "
        f"{100 * statistics.mean(held):.1f}% held out (leave one run out)",
    )
    numbers = {
        "runs": len(runs),
        "held_out_by_choice": [
            {"scales": list(c), "mean_abs_error_held_out": statistics.mean(h)} for c, h in held_by_choice.items()
        ],
        "mean_abs_error_before": statistics.mean(before),
        "mean_abs_error_fitted": statistics.mean(after),
        "mean_abs_error_held_out": statistics.mean(held),
        "time_ratio_p10": float(p10),
        "time_ratio_p90": float(p90),
    }
    refused = {name: NOT_IDENTIFIED[name] for name, ok in which.items() if not ok and name in NOT_IDENTIFIED}
    return profile, {"identified": which, "not_identified": refused, "fitted": free, **numbers}


def _check_fit(profile: Profile, free: list[str], p10: float, p90: float) -> None:
    """Refuse a fit that says nothing. Each fitted constant must be finite and on its grid (validation/fit.py
    GRIDS: the range each constant can physically take; a grid search cannot leave it, so this guards the fit
    itself). A fit may well sit at an end of its grid, and is not refused for it: published runs do (a draw of
    ten of llm-foundry's A100 runs in benchmarks/calibrate_sources.py takes the memory-bound scale to 1.25, the
    HBM bandwidth itself), and the band below then says how far the runs still are. The band of held-out ratios
    must be finite and within what a profile may state (spec/profile.py ``band_problem``, at most 100x wide and
    within 100x of 1): beyond, the runs disagree with each other or with the catalog by two orders of magnitude
    (a unit slip, runs of another setup), and no constant explains them."""
    for name in free:
        grid, value = profile_fit.GRIDS[name], float(getattr(profile, name))
        low, high = float(grid[0]), float(grid[-1])
        if not (math.isfinite(value) and low <= value <= high):
            raise ValueError(f"the fit of {name} gave {value!r}, outside its range [{low:g}, {high:g}]")
    problem = band_problem(p10, p90)
    if problem is not None:
        raise ValueError(
            f"these runs fit no profile: {problem}; they disagree with each other or with the catalog (check each "
            "run's arguments and units)"
        )


T_90 = (
    3.078,
    1.886,
    1.638,
    1.533,
    1.476,
    1.440,
    1.415,
    1.397,
    1.383,
    1.372,
    1.363,
    1.356,
    1.350,
    1.345,
    1.341,
    1.337,
    1.333,
    1.330,
    1.328,
    1.325,
    1.323,
    1.321,
    1.319,
    1.318,
    1.316,
    1.315,
    1.314,
    1.313,
    1.311,
    1.310,
)
"""Student's t distribution's 0.90 quantile for 1 to 30 degrees of freedom (any statistics table); beyond 30, the
normal's 1.2816."""


def prediction_band(ratios: list[float]) -> tuple[float, float]:
    """P10 and P90 of the next run's measured over predicted step time, from ``ratios`` of runs each predicted
    without itself: log-normal, with the t distribution's widening for a mean and spread taken from n runs,
    exp(m +- t(0.9, n - 1) s sqrt(1 + 1/n)) (a prediction interval: the P10-P90 of 10 runs alone would hold the
    next run less often than 80%, and of 4 runs far less)."""
    logs = np.log(ratios)
    n = len(logs)
    t = T_90[n - 2] if n - 1 <= len(T_90) else 1.2816
    half = t * float(np.std(logs, ddof=1)) * math.sqrt(1 + 1 / n)
    mean = float(np.mean(logs))
    return math.exp(mean - half), math.exp(mean + half)


def _held_out(sens: list[profile_fit.Sensitivity], free: list[str]) -> list[float]:
    """Each run's time-like value predicted with ``free`` fitted on all the other runs (first order in the
    constants; with nothing free, the catalog's own prediction)."""
    if not free:
        return [r.base for r in sens]
    return [
        profile_fit.predict(r, profile_fit.fit([s for j, s in enumerate(sens) if j != i], free=free).profile)
        for i, r in enumerate(sens)
    ]


def calibrate_report(path: str, *, out: str | None = None, force: bool = False) -> dict[str, Any]:
    """``meshplan calibrate``: the fitted profile, the errors before, fitted and held out, per run and overall.

    ``out``: the profile TOML's file, written by files.py's one safe writer: never over RUNS.json or a file a run
    reads, never through a link, never over an existing file unless ``force``."""
    runs = load_runs(path)
    inputs = [path, *(word for run in runs for word in run.args)]
    if out:
        writable(out, what="--out", inputs=inputs, force=force)  # refused before the fit, not after
    profile, numbers = fit_runs(runs)
    text = dump_profile(profile, {k: v for k, v in numbers.items() if isinstance(v, int | float)})
    if out:
        write_text_safely(out, text, what="--out", inputs=inputs, force=force)
    before, after = predict(runs, IDENTITY), predict(runs, profile)
    rows = []
    for run, b, a in zip(runs, before, after, strict=True):
        row: dict[str, Any] = {
            "args": list(run.args),
            "metric": run.metric,
            "measured": run.measured,
            "predicted_before": b,
            "predicted_fitted": a,
            "error_before": _error(run, b),
            "error_fitted": _error(run, a),
        }
        if run.peak_memory_bytes is not None:
            memory = float(_estimate(run, profile)["per_gpu"]["total_bytes"])
            row["peak_memory_bytes"] = run.peak_memory_bytes
            row["memory_error"] = memory / run.peak_memory_bytes - 1
        rows.append(row)
    return {
        "profile": {**{name: getattr(profile, name) for name in CONSTANTS}, "source": profile.source},
        **numbers,
        "runs_detail": rows,
        "profile_file": out,
        "profile_toml": text,
    }
