"""Measured against predicted, quantity by quantity, rank by rank, each with its target.

Targets: parameter, gradient and optimizer bytes (and every other training-state byte count) exact; collective
counts exact and their bytes within 1%; saved-activation bytes within 5%. Quantities that depend on where a
router sends tokens (MoE layouts) are compared as the mean over ranks, which the routing cannot change.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from meshplan.check.predict import (
    ACTIVATION_QUANTITIES,
    BUFFER_QUANTITIES,
    COLLECTIVE_KINDS,
    ROUTING_DEPENDENT,
    STATE_QUANTITIES,
    Prediction,
)


class MeasuredValue(Protocol):
    """What compare needs of a ``meshplan.check.Measurement``."""

    @property
    def layout(self) -> str: ...
    @property
    def rank(self) -> int: ...
    @property
    def quantity(self) -> str: ...
    @property
    def phase(self) -> str: ...
    @property
    def group_ranks(self) -> str: ...
    @property
    def measured(self) -> int: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """How close a prediction must come to its measurement."""

    name: str
    relative: float
    """Largest |predicted / measured - 1| allowed (0: equal)."""

    def holds(self, predicted: float, measured: float) -> bool:
        if measured == 0:
            return predicted == 0
        return abs(predicted / measured - 1) <= self.relative + 1e-12


EXACT = Target(name="exact", relative=0.0)
BYTES_1 = Target(name="1%", relative=0.01)
ACTIVATIONS_5 = Target(name="5%", relative=0.05)
COMPARED = frozenset(
    (
        *STATE_QUANTITIES,
        *ACTIVATION_QUANTITIES,
        *BUFFER_QUANTITIES,
        *(f"{k}_{u}" for k in COLLECTIVE_KINDS for u in ("count", "bytes")),
    )
)


def target_of(quantity: str) -> Target:
    if quantity in ACTIVATION_QUANTITIES:
        return ACTIVATIONS_5
    if quantity in STATE_QUANTITIES or quantity.endswith("_count"):
        return EXACT
    return BYTES_1


Key = tuple[int, str, str, str]
"""(rank, quantity, phase, mesh axis)."""


def _measured(prediction: Prediction, measurements: Iterable[MeasuredValue]) -> dict[Key, float]:
    out: dict[Key, float] = defaultdict(float)
    case = prediction.case
    for m in measurements:
        if m.layout != prediction.layout or m.quantity not in COMPARED or m.phase == "step":
            continue
        axis = case.axis_of_group(frozenset(int(r) for r in m.group_ranks.split(","))) if m.group_ranks else ""
        out[(m.rank, m.quantity, m.phase, axis)] += m.measured
    return out


def _record(
    prediction: Prediction, world_size: int, key: Key, rank: int | None, predicted: float, measured: float
) -> dict[str, Any]:
    _, quantity, phase, axis = key
    target = target_of(quantity)
    ratio = predicted / measured if measured else (1.0 if predicted == 0 else None)
    return {
        "layout": prediction.layout,
        "world_size": world_size,
        "quantity": quantity,
        "phase": phase,
        "axis": axis,
        "rank": rank,
        "predicted": predicted,
        "measured": measured,
        "ratio": ratio,
        "target": target.name,
        "ok": target.holds(predicted, measured),
    }


def compare(prediction: Prediction, measurements: Iterable[MeasuredValue], *, world_size: int) -> list[dict[str, Any]]:
    """One record per rank and quantity (rank None: the mean over ranks of a routing-dependent quantity)."""
    measured = _measured(prediction, measurements)
    predicted: dict[Key, float] = {(p.rank, p.quantity, p.phase, p.axis): p.value for p in prediction.values}
    keys = sorted(set(measured) | set(predicted), key=lambda k: (k[1], k[2], k[3], k[0]))
    records: list[dict[str, Any]] = []
    means: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for key in keys:
        p, m = predicted.get(key, 0.0), measured.get(key, 0.0)
        if p == 0 and m == 0:
            continue
        if prediction.case.moe and key[1] in ROUTING_DEPENDENT:
            total = means[key[1:]]
            total[0] += p / world_size
            total[1] += m / world_size
            continue
        records.append(_record(prediction, world_size, key, key[0], p, m))
    for (quantity, phase, axis), (p, m) in means.items():
        records.append(_record(prediction, world_size, (-1, quantity, phase, axis), None, p, m))
    return records


def all_ok(records: Iterable[dict[str, Any]]) -> bool:
    return all(r["ok"] for r in records)
