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

Beside each class's band the file holds, for reports/serve_band.py to pick from (its docstring states the rule a
question follows):
  each engine family with rows in the class: the class's (widened) distances around the family's own median,
      each of its sources weighing the same, covering the class's band (never narrower than it);
  the sources that ran each GPU kind, MoE or dense models, MLA or not;
  per axis (engine, GPU kind, MoE, MLA), the width an unseen level adds (``unseen_width``): with n levels among
      the class's rows, t_0.90(n - 1) sqrt(1 + 1/n) times the standard deviation of the levels' mean log ratios;
      a class with one level of an axis takes that axis's widest among the other classes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from functools import cache
from typing import Protocol

from meshplan import io
from meshplan.reports.serve_band import SIBLING, Band, band_for, key

Z90 = 1.2815515655446004
"""The standard normal's 0.90 quantile."""


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
    @property
    def engine(self) -> str: ...
    @property
    def gpu(self) -> str: ...
    @property
    def model(self) -> str: ...


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
    return {cls: {s: [x for _, x in v] for s, v in by.items()} for cls, by in class_rows(rows).items()}


def class_rows(rows: Sequence[Measured]) -> dict[str, dict[str, list[tuple[Measured, float]]]]:
    """Per class and source, each counted row with its log time ratio held out (the correction without it)."""
    out: dict[str, dict[str, list[tuple[Measured, float]]]] = {}
    for cls in sorted({r.metric_class for r in rows if r.status == "ok"}):
        for source in sorted({r.source for r in counted(rows, cls)}):
            _, held = held_out(rows, source, cls)
            out.setdefault(cls, {})[source] = [(r, math.log(time_ratio(r, p))) for r, p in held]
    return out


@cache
def model_traits(model: str) -> tuple[bool, bool]:
    """(MoE, MLA) of a catalog model; (False, False) where the row names none."""
    if not model:
        return False, False
    spec = io.load_model(model)
    return spec.moe is not None, spec.mla is not None


def _levels(r: Measured) -> dict[str, str]:
    """The row's level on each axis a question may fall outside of."""
    moe, mla = model_traits(r.model)
    return {"engine": key(r.engine), "gpu": key(r.gpu), "moe": str(int(moe)), "mla": str(int(mla))}


def _weighted(by_source: dict[str, list[tuple[Measured, float]]], q: float) -> float:
    logs = [x for v in by_source.values() for _, x in v]
    weights = [1 / len(v) for v in by_source.values() for _ in v]
    return weighted_quantile(logs, weights, q)


def unseen_width(by_source: dict[str, list[tuple[Measured, float]]], axis: str) -> float | None:
    """The width (in logs) an unseen level of ``axis`` adds: with n levels among the class's rows, each level's
    mean log ratio (the mean of its sources' means, each source weighing the same), w = t_0.90(n - 1)
    sqrt(1 + 1/n) s, s their standard deviation: the half-width of a P10-P90 prediction interval for one more
    level's offset. None below two levels (nothing says how levels differ)."""
    per_level: dict[str, dict[str, list[float]]] = {}
    for source, members in by_source.items():
        for r, x in members:
            per_level.setdefault(_levels(r)[axis], {}).setdefault(source, []).append(x)
    means = [statistics.mean(statistics.mean(v) for v in by.values()) for by in per_level.values()]
    if len(means) < 2:
        return None
    n = len(means)
    return t90(n - 1) * math.sqrt(1 + 1 / n) * statistics.stdev(means)


def held_out_band(rows: Sequence[Measured]) -> dict[str, float]:
    """catalog/serving/held_out.toml's numbers (reports/serve_band.py reads them). Per metric class (``decode``,
    ``prefill``, ``throughput_dense``, ``throughput_moe``): the P10, median and P90 of the held-out time ratios,
    each source weighing the same, widened for few sources (module docstring), with the rows, sources and factor
    behind them; per engine family with rows in the class (``_engine_NAME_``), the class's distances around the
    family's own median, covering the class's band, and its sources; the sources per GPU kind (``_gpu_NAME_``), per
    MoE and MLA (``_moe_1_``, ``_mla_0_``...); and the width each unseen level adds (``_unseen_AXIS_log``)."""
    by_class = class_rows(rows)
    raw: dict[str, tuple[float, float, float, int, int]] = {}
    for cls, by_source in by_class.items():
        q = [_weighted(by_source, p) for p in (0.1, 0.5, 0.9)]
        raw[cls] = (q[0], q[1], q[2], sum(len(v) for v in by_source.values()), len(by_source))
    widened: dict[str, tuple[float, float, float]] = {}
    for cls, (lo, mid, hi, _, k) in raw.items():
        if k >= 2:
            f = widening(k)
            widened[cls] = (mid - f * (mid - lo), mid, mid + f * (hi - mid))
    out: dict[str, float] = {}
    widths: dict[tuple[str, str], float | None] = {}
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
        c = key(cls)
        out |= {
            f"{c}_time_ratio_p10": math.exp(lo),
            f"{c}_time_ratio_p50": math.exp(mid),
            f"{c}_time_ratio_p90": math.exp(hi),
            f"{c}_runs": float(n),
            f"{c}_sources": float(k),
            f"{c}_widening": f,
        }
        by_source = by_class[cls]
        families = sorted({_levels(r)["engine"] for v in by_source.values() for r, _ in v})
        for family in families:
            mine = {s: v for s, v in by_source.items() if _levels(v[0][0])["engine"] == family}
            centre = _weighted(mine, 0.5)
            e = f"{c}_engine_{family}"
            out |= {
                f"{e}_time_ratio_p10": math.exp(min(centre - (mid - lo), lo)),
                f"{e}_time_ratio_p50": math.exp(centre),
                f"{e}_time_ratio_p90": math.exp(max(centre + (hi - mid), hi)),
                f"{e}_runs": float(sum(len(v) for v in mine.values())),
                f"{e}_sources": float(len(mine)),
            }
        for axis in ("gpu", "moe", "mla"):
            seen: dict[str, set[str]] = {}
            for source, members in by_source.items():
                for r, _ in members:
                    seen.setdefault(_levels(r)[axis], set()).add(source)
            out |= {f"{c}_{axis}_{level}_sources": float(len(s)) for level, s in sorted(seen.items())}
        for axis in AXES:
            widths[(c, axis)] = unseen_width(by_source, axis)
    every = [w for w in widths.values() if w is not None]
    for (c, axis), w in widths.items():
        if w is None:  # one level in the class: the axis's widest elsewhere, else the widest of any axis
            same = [v for (_, a), v in widths.items() if a == axis and v is not None]
            w = max(same or every or [0.0])
        out[f"{c}_unseen_{axis}_log"] = w
    return out


AXES = ("engine", "gpu", "moe", "mla")
"""The levels a question may fall outside of: its engine family, its GPU kind, MoE or not, MLA or not."""


def row_band(r: Measured, band: dict[str, float]) -> Band:
    """The band a question like the row's takes (reports/serve_band.py) from ``band``."""
    moe, mla = model_traits(r.model)
    stated = getattr(r, "engine_stated", True)
    return band_for(band, r.metric_class, engine=r.engine, gpu=r.gpu, moe=moe, mla=mla, stated=stated)


def inside(r: Measured, band: dict[str, float], predicted: float | None = None) -> bool:
    """Whether the row's measured over predicted time lies within the P10-P90 a question like it takes."""
    b = row_band(r, band)
    return b.lo <= time_ratio(r, predicted) <= b.hi


def band_without(rows: Sequence[Measured], source: str) -> dict[str, float]:
    """The band built as ``held_out_band`` builds it, from every source but ``source`` (its rows removed)."""
    return held_out_band([r for r in rows if r.source != source])
