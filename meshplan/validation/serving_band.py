"""The serving band: what a serving prediction's error is on a source it was not fitted to, per metric class.

Each published serving source is held out in turn: the class's correction (the speed ratio, measured over predicted
for a rate and its inverse for a latency, averaged in logs over the other sources, each source weighing the same
whatever its number of rows) is fitted without it, and its rows are predicted with it. Their measured over
predicted times (a latency's ratio, a rate's inverse) are the class's residuals. The band is their P10, median and
P90 with every source weighing the same (a row weighs 1 / its source's rows), widened where the class rests on few
sources:

  k sources (k >= 2): each side's distance from the median, in logs, times
      f(k) = t_0.90(k - 1) sqrt(1 + 1/k) / z_0.90
  the factor of a prediction interval for one new draw when the spread is estimated from k draws (Student's t with
  k - 1 degrees of freedom, over the normal quantile it replaces): 2.94 for 2 sources, 1.70 for 3, 1.43 for 4,
  1.31 for 5, 1.14 for 10, tending to 1. The source, not the row, is the draw: a new deployment's offset is one
  more source's.
  k = 1: one source says nothing of how sources differ; each side takes the larger of its own distance and that
      of the class measuring the same quantity on the other models (``SIBLING``: MoE throughput takes dense
      throughput's), else the widest of the classes that rest on two sources or more (after their widening).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Protocol

Z90 = 1.2815515655446004
"""The standard normal's 0.90 quantile."""
SIBLING = {"throughput-moe": "throughput-dense", "throughput-dense": "throughput-moe"}
"""The class measuring the same quantity (offline tokens/s) on the other model class."""


class Measured(Protocol):
    """A predicted published measurement (validation.serving.Row)."""

    @property
    def source(self) -> str: ...
    @property
    def metric(self) -> str: ...
    @property
    def metric_class(self) -> str: ...
    @property
    def measured(self) -> float: ...
    @property
    def predicted(self) -> float | None: ...
    @property
    def status(self) -> str: ...


def t90(df: int) -> float:
    """Student's t 0.90 quantile with ``df`` degrees of freedom: exact for 1 and 2 (tan(0.4 pi), 0.8 sqrt(50/9)),
    the Cornish-Fisher expansion to 1/df^3 beyond (within 0.002 of the tables from 3 on)."""
    if df < 1:
        raise ValueError(f"t quantile needs df >= 1, got {df}")
    if df == 1:
        return math.tan(0.4 * math.pi)
    if df == 2:
        return 0.8 * math.sqrt(2 / (4 * 0.9 * 0.1))
    z = Z90
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / df + g2 / df**2 + g3 / df**3


def widening(sources: int) -> float:
    """f(k) of the module docstring; 0 for one source (no spread between sources to widen)."""
    if sources < 2:
        return 0.0
    return t90(sources - 1) * math.sqrt(1 + 1 / sources) / Z90


def is_latency(metric: str) -> bool:
    return metric.endswith("_ms")


def time_ratio(r: Measured, predicted: float | None = None) -> float:
    """Measured over predicted time: a latency's ratio, a rate's inverse."""
    p = r.predicted if predicted is None else predicted
    assert p is not None
    return r.measured / p if is_latency(r.metric) else p / r.measured


def correction(rows: Sequence[Measured]) -> float:
    """The speed ratio, measured over predicted (a rate's ratio, a latency's inverse), its logs averaged per source
    and then over the sources (each source weighing the same); 1 where there are no rows. A rate is corrected by
    multiplying by it, a latency by dividing."""
    per_source: dict[str, list[float]] = {}
    for r in rows:
        if r.predicted:
            per_source.setdefault(r.source, []).append(-math.log(time_ratio(r)))
    if not per_source:
        return 1.0
    return math.exp(statistics.mean(statistics.mean(v) for v in per_source.values()))


def counted(rows: Sequence[Measured], cls: str) -> list[Measured]:
    return [r for r in rows if r.status == "ok" and r.metric_class == cls and r.predicted]


def held_out(rows: Sequence[Measured], source: str, cls: str) -> tuple[float, list[tuple[Measured, float]]]:
    """The correction of class ``cls`` fitted on the counted rows of every other source, and each counted row of
    ``source`` with its prediction so corrected."""
    mine = counted(rows, cls)
    k = correction([r for r in mine if r.source != source])
    held = []
    for r in mine:
        if r.source == source and r.predicted:
            held.append((r, r.predicted / k if is_latency(r.metric) else r.predicted * k))
    return k, held


def weighted_quantile(values: Sequence[float], weights: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` weighted by ``weights``: each value sits at the middle of its weight on the
    cumulative axis, linearly interpolated between them, clamped to the smallest and the largest."""
    pairs = sorted(zip(values, weights, strict=True))
    total = sum(w for _, w in pairs)
    positions, cum = [], 0.0
    for _, w in pairs:
        positions.append((cum + w / 2) / total)
        cum += w
    if q <= positions[0]:
        return pairs[0][0]
    for i in range(1, len(pairs)):
        if q <= positions[i]:
            span = positions[i] - positions[i - 1]
            t = (q - positions[i - 1]) / span if span else 1.0
            return pairs[i - 1][0] + t * (pairs[i][0] - pairs[i - 1][0])
    return pairs[-1][0]


def class_residuals(rows: Sequence[Measured]) -> dict[str, dict[str, list[float]]]:
    """Per class and source, the log time ratios of its counted rows held out (the correction without it)."""
    out: dict[str, dict[str, list[float]]] = {}
    for cls in sorted({r.metric_class for r in rows if r.status == "ok"}):
        for source in sorted({r.source for r in counted(rows, cls)}):
            _, held = held_out(rows, source, cls)
            out.setdefault(cls, {})[source] = [math.log(time_ratio(r, p)) for r, p in held]
    return out


def held_out_band(rows: Sequence[Measured]) -> dict[str, float]:
    """Per metric class (``decode``, ``prefill``, ``throughput_dense``, ``throughput_moe``): the P10, median and P90
    of the held-out time ratios, each source weighing the same, widened for few sources (module docstring); the
    rows, sources and widening factor behind it."""
    raw: dict[str, tuple[float, float, float, int, int]] = {}
    for cls, by_source in class_residuals(rows).items():
        logs = [x for v in by_source.values() for x in v]
        weights = [1 / len(v) for v in by_source.values() for _ in v]
        q = [weighted_quantile(logs, weights, p) for p in (0.1, 0.5, 0.9)]
        raw[cls] = (q[0], q[1], q[2], len(logs), len(by_source))
    widened: dict[str, tuple[float, float, float]] = {}
    for cls, (lo, mid, hi, _, k) in raw.items():
        if k >= 2:
            f = widening(k)
            widened[cls] = (mid - f * (mid - lo), mid, mid + f * (hi - mid))
    out: dict[str, float] = {}
    for cls, (lo, mid, hi, n, k) in raw.items():
        f = widening(k)
        if k >= 2:
            lo, mid, hi = widened[cls]
        else:
            sibling = widened.get(SIBLING.get(cls, ""))
            donors = [sibling] if sibling else list(widened.values())
            below = max((m - low for low, m, _ in donors), default=0.0)
            above = max((high - m for _, m, high in donors), default=0.0)
            lo, hi = mid - max(mid - lo, below), mid + max(hi - mid, above)
        key = cls.replace("-", "_")
        out |= {
            f"{key}_time_ratio_p10": math.exp(lo),
            f"{key}_time_ratio_p50": math.exp(mid),
            f"{key}_time_ratio_p90": math.exp(hi),
            f"{key}_runs": float(n),
            f"{key}_sources": float(k),
            f"{key}_widening": f,
        }
    return out


def inside(r: Measured, band: dict[str, float], predicted: float | None = None) -> bool:
    """Whether the row's measured over predicted time lies within its class's P10-P90."""
    key = r.metric_class.replace("-", "_")
    return band[f"{key}_time_ratio_p10"] <= time_ratio(r, predicted) <= band[f"{key}_time_ratio_p90"]


def band_without(rows: Sequence[Measured], source: str) -> dict[str, float]:
    """The band built as ``held_out_band`` builds it, from every source but ``source`` (its rows removed)."""
    return held_out_band([r for r in rows if r.source != source])
