"""The figures of ``meshplan serve`` under load on a machine slower or faster than predicted: their P10-P90, and the
warning where Poisson arrivals take most of what a replica serves (docs/formulas.md, "The band under load")."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from meshplan.core.serving.load import LoadPoint, Requests, load_point
from meshplan.reports.serve_band import Band
from meshplan.reports.serve_setup import Setup


def finite_s(x: float | None) -> float | None:
    """A time as the reports give it: None where it is unbounded (a queue that grows without end)."""
    return None if x is None or math.isinf(x) else x


def slower_machine(setup: Setup, req: Requests, pt: LoadPoint) -> Callable[[float], LoadPoint]:
    """The load point of the same traffic on a machine whose every time is r times the model's, on the model's
    own clock (its times are then to be multiplied by r). Rescaling time by r turns a Poisson rate R into R r and
    leaves a closed loop's users (and a static batch) as they are: a closed loop's figures all scale by r, an open
    loop's are re-solved at R r, where the queue may settle on another batch or grow without bound."""
    points: dict[float, LoadPoint] = {1.0: pt}

    def at(r: float) -> LoadPoint:
        if req.rate_per_s is None:
            return pt
        if r not in points:
            faster_rate = dataclasses.replace(req, rate_per_s=req.rate_per_s * r)
            points[r] = load_point(setup.model, setup.shape, setup.hw, setup.layout, faster_rate)
        return points[r]

    return at


NEAR_CAPACITY = 0.8
"""Share of what a replica serves at its batch cap above which an open loop's figures are said to follow the
capacity's error: at 80%, a machine 10% slower than predicted runs at 88% (the batch in flight about doubles)."""


SENSITIVITY_STEP = 1.05
"""The slower machine ``near_capacity`` re-solves the queue on to say how far the batch in flight moves."""


def near_capacity(pt: LoadPoint, req: Requests, slower: Callable[[float], LoadPoint]) -> list[str]:
    """A warning where Poisson arrivals take most of what a replica serves (none in a closed loop or a batch),
    with how much the batch in flight grows on a machine ``SENSITIVITY_STEP`` times slower (``slower``)."""
    if req.rate_per_s is None or pt.saturated:
        return []
    share = pt.output_tokens_per_s / pt.max_output_tokens_per_s
    if share < NEAR_CAPACITY:
        return []
    moved = slower(SENSITIVITY_STEP)
    grows = (
        "cannot keep up"
        if moved.saturated
        else f"holds {moved.batch / pt.batch:.1f} times the sequences ({moved.batch:,.0f} a replica)"
    )
    return [
        f"the arrivals take {share:.0%} of what a replica serves at its batch cap: a machine "
        f"{SENSITIVITY_STEP - 1:.0%} slower than predicted {grows}, and TPOT and TTFT follow the batch (see their "
        "P10-P90)"
    ]


LOAD_FIGURES = {
    "decode": ("tpot_s", "tpot_s_p50", "tpot_s_p99", "itl_s_p99"),
    "prefill": ("ttft_s_p50", "ttft_s_p99", "ttft_s_mean"),
}
"""The figures under load each class's band spans: TPOT's by the decode rows, TTFT's by the prefill rows."""


def load_band(slower: Callable[[float], LoadPoint], bands: dict[str, Band]) -> dict[str, list[float | None]]:
    """P10 and P90 of each figure under load: the figure on a machine P10 and P90 times the model's speed (the
    class's measured over predicted time), the queue re-solved there (``slower_machine``); None where that machine
    cannot keep up with the arrivals (the queue, and so the TTFT, grows without bound). The batch in flight spans
    with the decode rows' ends."""
    out: dict[str, list[float | None]] = {}
    for cls, figures in LOAD_FIGURES.items():
        ends = [(r, slower(r)) for r in (bands[cls].lo, bands[cls].hi)]
        for fig in figures:
            out[fig] = [finite_s(None if getattr(p, fig) is None else r * getattr(p, fig)) for r, p in ends]
        if cls == "decode":
            out["batch_per_replica"] = [p.batch for _, p in ends]
    return out
