"""Shared scales fitted over measured runs, and the error of each source left out of the fit.

A profile (spec/profile.py) scales, for every GPU kind and link kind at once, the
matmul efficiency, the collective bandwidths, the attention kernels' share of peak
and the speed of the memory-bound kernels, and adds a host time per step. Fitting
it needs the step time as a function of those constants; each run is evaluated
once at the catalog's constants and once with each constant moved (a scale to
0.9, the host's speed to 0.5, the host time to 0.1 s), and its time is taken as affine in each constant's
departure from neutral (1/scale - 1 for a scale, the seconds themselves for the
host time), t = t0 + sum_i d_i x_i, which holds while no constant changes which
setting a source tuned or which term hides which (the host time is exactly
additive). The free constants are chosen on a grid by
the mean |log(predicted / measured)|, each source weighing the same whatever its
number of runs. Leaving a source out, the constants are fitted on the others and the
source is evaluated again exactly, with the fitted profile: that is its held-out
error.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from meshplan.spec.profile import CONSTANTS, IDENTITY, OFFSETS, Profile, from_values

PERTURB = 0.9
"""Each scale's step for the sensitivities: a 10% slower GPU, network, attention kernel or memory-bound kernel."""
PERTURB_OFFSET_S = 0.1
"""The host time's step for the sensitivities: 0.1 s more per step."""
PERTURB_HOST = 0.5
"""The host speed's step: hosts half as fast. The host floor is a maximum (a layer takes the longer of the GPU's
and the host's time, core/time/host.py), so a host 10% slower moves only layers already within 10% of binding,
and a cluster whose hosts are slower than the catalog's would read as none; half the speed, the geometric middle
of the grid's slow side (0.25 to 1), moves every layer within a factor of two of binding, and the slope it gives
is exact where a layer binds at both speeds. On synthetic clusters of small eager runs whose hosts run at 0.4 of
the catalog's speed, fitted on 10 runs of 14 (eight draws), the other runs' median error is 3.1% with this step,
6.2% with 0.9; where the hosts are as the catalog's, 0.13% either way."""
GRIDS = {
    "compute_scale": np.exp(np.linspace(math.log(0.6), math.log(1.6), 241)),
    "comm_scale": np.exp(np.linspace(math.log(0.25), math.log(1.25), 41)),
    "attention_scale": np.exp(np.linspace(math.log(0.5), math.log(2.0), 41)),
    "memory_scale": np.exp(np.linspace(math.log(0.4), math.log(1.25), 41)),
    "host_scale": np.exp(np.linspace(math.log(0.25), math.log(4.0), 41)),
    "step_overhead_s": np.concatenate([[0.0], np.exp(np.linspace(math.log(0.002), math.log(5.0), 40))]),
}
"""Each constant's candidates. Bandwidth up to 1.25: a collective never beats its link's nominal bandwidth, and the
least efficient link of the catalog reaches 0.81 of it (NVLink 4 ring collectives), so no network is more than
1/0.81 faster than modeled; memory-bound kernels likewise reach at most the HBM bandwidth (0.8 of it modeled). The
host's speed issuing kernels from a quarter to four times the catalog's (its per-kernel costs come from one
published measurement per launch mode, a host of its day: core/time/host.py). The host time from none through 2 ms
to 5 s per step, never negative: a host adds time, it cannot take the GPUs' away."""
GRID_POINTS = 40_000
"""Most grid points one fit evaluates: with more than two free scales each grid is thinned to keep to it."""
IDENTIFIES = 0.01
"""A constant is identified by a set of runs when its step (a scale 10% slower, hosts half as fast, 0.1 s more
per step) moves some run's time by more than 1%."""


def departure(name: str, value: Any) -> Any:
    """How far a constant's value (a float, or a numpy array of candidates) is from neutral, in the unit the time
    is affine in: 1/scale - 1 for a scale (a time divided by the scale), the seconds themselves for the host time
    per step."""
    return value if name in OFFSETS else 1 / value - 1


def _moved(name: str) -> float:
    """Each constant's value for the sensitivities."""
    return PERTURB_OFFSET_S if name in OFFSETS else PERTURB_HOST if name == "host_scale" else PERTURB


@dataclass(frozen=True, slots=True, kw_only=True)
class Sensitivity:
    """One run's time-like value (a time, or 1 / a rate) at the catalog's constants and its slopes."""

    source: str
    case: str
    measured: float
    """Measured, time-like (a time, or 1 / the measured rate)."""
    base: float
    slopes: Mapping[str, float]
    """Per constant, the change of the time-like value per unit of its departure (``departure``; constants not
    evaluated: absent)."""
    rate: bool
    """The metric is a rate (throughput, MFU): its error is measured / predicted time-like - 1."""

    def error(self, time_like_predicted: float) -> float:
        """Relative error of the metric for a time-like prediction."""
        if self.rate:
            return self.measured / time_like_predicted - 1
        return time_like_predicted / self.measured - 1


def time_like(metric: str, value: float) -> float:
    """A value that grows with step time: the time itself, or the inverse of a rate."""
    return value if metric.endswith("_s") else 1.0 / value


def sensitivities(
    results: Callable[[Profile], Sequence[tuple[str, str, str, float, float]]],
    *,
    constants: Sequence[str] = CONSTANTS,
) -> list[Sensitivity]:
    """Per run, from ``results(profile)`` rows (source, case, metric, measured, predicted), with the slopes of
    ``constants``."""
    base = results(IDENTITY)
    moved = {name: results(from_values({name: _moved(name)})) for name in constants}
    out = []
    for i, (source, case, metric, measured, predicted) in enumerate(base):
        t0 = time_like(metric, predicted)
        out.append(
            Sensitivity(
                source=source,
                case=case,
                measured=time_like(metric, measured),
                base=t0,
                slopes={
                    name: (time_like(metric, rows[i][4]) - t0) / departure(name, _moved(name))
                    for name, rows in moved.items()
                },
                rate=not metric.endswith("_s"),
            )
        )
    return out


def identified(runs: Sequence[Sensitivity]) -> dict[str, bool]:
    """Which constants the runs can pin down (their step moves some run by more than IDENTIFIES)."""
    names = [name for name in CONSTANTS if runs and name in runs[0].slopes]
    return {
        name: any(abs(r.slopes[name] * departure(name, _moved(name))) > IDENTIFIES * r.base for r in runs)
        for name in names
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class Fit:
    """The scales that suit a set of runs best, and their error on those runs (first order)."""

    profile: Profile
    mean_abs_error: float
    """Mean over sources of each source's mean |predicted / measured - 1|, at the fitted scales."""
    runs: int


def _grid(name: str, free: int) -> np.ndarray:
    grid = GRIDS[name]
    points = int(GRID_POINTS ** (1 / free)) if free > 2 else len(grid)
    if points >= len(grid):
        return grid
    return np.asarray(grid[np.round(np.linspace(0, len(grid) - 1, points)).astype(int)])


def fit(runs: Sequence[Sensitivity], *, free: Sequence[str] = ("compute_scale", "comm_scale")) -> Fit:
    """The grid point of the ``free`` constants with the least mean |log error|, sources weighed alike.

    Constants not in ``free`` stay neutral (scales at 1, the host time at 0).
    """
    if not runs:
        raise ValueError("no runs to fit")
    free = [name for name in CONSTANTS if name in free]
    grids = [_grid(name, len(free)) for name in free]
    mesh = [g.ravel() for g in np.meshgrid(*grids, indexing="ij")] if free else []
    points = len(mesh[0]) if mesh else 1
    per_source = []
    for name in sorted({r.source for r in runs}):
        mine = [r for r in runs if r.source == name]
        base = np.array([r.base for r in mine])[:, None]
        t = np.repeat(base, points, axis=1)
        for scale, values in zip(free, mesh, strict=True):
            t = t + np.array([r.slopes[scale] for r in mine])[:, None] * departure(scale, values)[None, :]
        t = np.maximum(t, 1e-3 * base)
        meas = np.array([r.measured for r in mine])[:, None]
        per_source.append(np.abs(np.log(t / meas)).mean(axis=0))
    best = int(np.argmin(np.mean(per_source, axis=0)))
    profile = from_values({scale: float(values[best]) for scale, values in zip(free, mesh, strict=True)})
    return Fit(profile=profile, mean_abs_error=_error_at(runs, profile), runs=len(runs))


def predict(r: Sensitivity, profile: Profile) -> float:
    """First-order time-like value of run ``r`` under ``profile``."""
    t = r.base + sum(slope * departure(name, float(getattr(profile, name))) for name, slope in r.slopes.items())
    return max(float(t), 1e-3 * r.base)


def subsets(names: Sequence[str], most: int) -> list[tuple[str, ...]]:
    """Every choice of at most ``most`` of ``names`` to fit, nothing first, in ``names``' order."""
    return [c for k in range(most + 1) for c in itertools.combinations(names, k)]


def _error_at(runs: Sequence[Sensitivity], profile: Profile) -> float:
    names = sorted({r.source for r in runs})
    return float(np.mean([np.mean([abs(r.error(predict(r, profile))) for r in runs if r.source == n]) for n in names]))
