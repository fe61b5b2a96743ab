"""Shared scales fitted over measured runs, and the error of each source left out of the fit.

A profile (spec/profile.py) scales two things at once for every GPU kind and link
kind: the compute efficiencies and the collective bandwidths. Fitting it needs the
step time as a function of the two scales; each run is evaluated three times
(the catalog's constants, compute at 0.9, bandwidth at 0.9) and its time is taken
as affine in 1/scale, t(a, b) = t0 + dc (1/a - 1) + dm (1/b - 1), which holds
while neither changes which setting a source tuned or which term hides which.
The scales are chosen on a grid by the mean |log(predicted / measured)|, each
source weighing the same whatever its number of runs. Leaving a source out, the
scales are fitted on the others and the source is evaluated again exactly, with
the fitted profile: that is its held-out error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from meshplan.spec.profile import IDENTITY, Profile

PERTURB = 0.9
"""Each scale's step for the sensitivities: a 10% slower GPU, a 10% slower network."""
COMPUTE_GRID = np.exp(np.linspace(math.log(0.6), math.log(1.6), 61))
COMM_GRID = np.exp(np.linspace(math.log(0.25), math.log(1.25), 41))
"""Up to 1.25: a collective never beats its link's nominal bandwidth, and the least efficient link of the
catalog reaches 0.81 of it (NVLink 4 ring collectives), so no network is more than 1/0.81 faster than modeled."""
IDENTIFIES = 0.01
"""A scale is identified by a set of runs when a 10% change of it moves some run's time by more than 1%."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Sensitivity:
    """One run's time-like value (a time, or 1 / a rate) at the catalog's constants and its slopes."""

    source: str
    case: str
    measured: float
    """Measured, time-like (a time, or 1 / the measured rate)."""
    base: float
    d_compute: float
    """Change of the time-like value per unit of 1/compute_scale - 1."""
    d_comm: float
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
) -> list[Sensitivity]:
    """Per run, from ``results(profile)`` rows (source, case, metric, measured, predicted)."""
    base = results(IDENTITY)
    slow_gpu = results(Profile(compute_scale=PERTURB))
    slow_net = results(Profile(comm_scale=PERTURB))
    step = 1 / PERTURB - 1
    out = []
    for b, c, m in zip(base, slow_gpu, slow_net, strict=True):
        source, case, metric, measured, predicted = b
        t0 = time_like(metric, predicted)
        out.append(
            Sensitivity(
                source=source,
                case=case,
                measured=time_like(metric, measured),
                base=t0,
                d_compute=(time_like(metric, c[4]) - t0) / step,
                d_comm=(time_like(metric, m[4]) - t0) / step,
                rate=not metric.endswith("_s"),
            )
        )
    return out


def identified(runs: Sequence[Sensitivity]) -> dict[str, bool]:
    """Which scales the runs can pin down (a 10% change moves some run by more than IDENTIFIES)."""
    step = 1 / PERTURB - 1
    return {
        "compute_scale": any(abs(r.d_compute * step) > IDENTIFIES * r.base for r in runs),
        "comm_scale": any(abs(r.d_comm * step) > IDENTIFIES * r.base for r in runs),
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class Fit:
    """The scales that suit a set of runs best, and their error on those runs (first order)."""

    profile: Profile
    mean_abs_error: float
    """Mean over sources of each source's mean |predicted / measured - 1|, at the fitted scales."""
    runs: int


def fit(runs: Sequence[Sensitivity], *, free: Sequence[str] = ("compute_scale", "comm_scale")) -> Fit:
    """The grid point of (compute_scale, comm_scale) with the least mean |log error|, sources weighed alike.

    Scales not in ``free`` stay at 1.
    """
    if not runs:
        raise ValueError("no runs to fit")
    a = COMPUTE_GRID if "compute_scale" in free else np.array([1.0])
    b = COMM_GRID if "comm_scale" in free else np.array([1.0])
    inv_a, inv_b = (1 / a - 1)[:, None], (1 / b - 1)[None, :]
    names = sorted({r.source for r in runs})
    per_source = []
    for name in names:
        mine = [r for r in runs if r.source == name]
        t0 = np.array([r.base for r in mine])[:, None, None]
        dc = np.array([r.d_compute for r in mine])[:, None, None]
        dm = np.array([r.d_comm for r in mine])[:, None, None]
        meas = np.array([r.measured for r in mine])[:, None, None]
        t = np.maximum(t0 + dc * inv_a + dm * inv_b, 1e-3 * t0)
        per_source.append(np.abs(np.log(t / meas)).mean(axis=0))
    score = np.mean(per_source, axis=0)
    i, j = np.unravel_index(int(np.argmin(score)), score.shape)
    profile = Profile(compute_scale=float(a[i]), comm_scale=float(b[j]))
    return Fit(profile=profile, mean_abs_error=_error_at(runs, profile), runs=len(runs))


def predict(r: Sensitivity, profile: Profile) -> float:
    """First-order time-like value of run ``r`` under ``profile``."""
    t = r.base + r.d_compute * (1 / profile.compute_scale - 1) + r.d_comm * (1 / profile.comm_scale - 1)
    return max(t, 1e-3 * r.base)


def _error_at(runs: Sequence[Sensitivity], profile: Profile) -> float:
    names = sorted({r.source for r in runs})
    return float(np.mean([np.mean([abs(r.error(predict(r, profile))) for r in runs if r.source == n]) for n in names]))
