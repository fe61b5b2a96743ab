"""search(): every valid layout, evaluated with the core's own formulas as arrays, ranked.

Pipeline: enumerate candidates -> each rule of core.constraints as a mask
(every rejection keeps its reason) -> TP placement -> the heaviest-stage
memory bill against HBM minus headroom -> step time -> objective -> top-k and
the Pareto front of step time against memory per GPU.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from meshplan.core.constraints import RULES
from meshplan.core.memory import MemoryBill, state_bytes
from meshplan.core.params import count_params
from meshplan.core.placement import DEFAULT_ORDER, place
from meshplan.core.plan import mesh_sizes
from meshplan.core.step_time import StepTime, step_time
from meshplan.core.training import peak_bill
from meshplan.search.space import LayoutBatch, SearchSpace, enumerate_layouts
from meshplan.spec.cluster import Cluster
from meshplan.spec.layout import Layout
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload

OOM = "OOM"
TP_CROSSES = "TP crosses node"


class Objective(StrEnum):
    """What the planner ranks by."""

    STEP_TIME = "step-time"
    """Fastest optimizer step on the given fleet (highest throughput), memory headroom breaking ties."""
    TOKENS_PER_GPU = "tokens-per-gpu"
    """Most tokens per second per GPU (equal to step time on a fixed fleet)."""
    HEADROOM = "headroom"
    """Most free memory per GPU among layouts within 5% of the fastest."""


MAX_TP_DOMAINS = 4
"""TP groups spanning more scale-up domains than this are not enumerated: every one of their per-layer
collectives crosses the fabric, and tensor parallelism pays off up to the size of one server's NVLink domain
(Narayanan et al. 2021, Sec. 3.3, takeaway 1). Beyond one domain they are still enumerated, and refused
unless --allow-cross-node-tp, so the rejection table says how many there were."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchResult:
    """The ranked feasible layouts and the count of every rejection."""

    candidates: LayoutBatch
    """Feasible layouts, best first."""
    step: StepTime
    memory: MemoryBill
    evaluated: int
    rejections: dict[str, int]
    elapsed_s: float
    pareto: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Indices (into ``candidates``) of the step-time / memory Pareto front, fastest first."""
    lightest: Layout | None = None
    """The valid layout with the smallest bill, fitting or not (what to show when nothing fits)."""
    lightest_bytes: float = 0.0
    """Its whole bill per GPU (the heaviest stage)."""

    @property
    def feasible(self) -> int:
        return len(self.candidates)


def _reject(mask: npt.NDArray[np.bool_], alive: npt.NDArray[np.bool_], reason: str, counts: dict[str, int]) -> None:
    """Kill the alive candidates that fail ``mask``, counting them under ``reason``."""
    failed = alive & ~mask
    n = int(failed.sum())
    if n:
        counts[reason] = counts.get(reason, 0) + n
        alive &= mask


def pareto_front(times: npt.NDArray[np.float64], memory: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Indices of the points no other point beats on both step time and memory, fastest first."""
    order = np.lexsort((memory, times))
    mem = memory[order]
    best_before = np.concatenate(([np.inf], np.minimum.accumulate(mem)[:-1]))
    return order[mem < best_before].astype(np.int64)


def search(
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    *,
    space: SearchSpace | None = None,
    headroom: float = 0.10,
    allow_cross_node_tp: bool = False,
    order: tuple[str, ...] = DEFAULT_ORDER,
    objective: Objective = Objective.STEP_TIME,
    pins: Mapping[str, int] | None = None,
) -> SearchResult:
    """Search every layout of ``model`` on ``cluster`` for ``workload``; the fastest that fit come first.

    ``pins`` keeps only layouts whose column (a LayoutBatch field: tp, zero, recompute as its enum value...)
    equals the value given; the others are rejected as "not the pinned <field>".
    """
    start = time.perf_counter()
    wide = max(MAX_TP_DOMAINS * cluster.domain_size, 8)
    space = space or SearchSpace(max_tp=wide if not allow_cross_node_tp else None)
    batch = enumerate_layouts(
        model,
        num_gpus=cluster.num_gpus,
        global_batch=workload.global_batch,
        space=space,
        domain=cluster.domain_size,
        allow_cross_node_tp=True,
    )
    counts: dict[str, int] = {}
    alive = np.ones(len(batch), dtype=np.bool_)
    for rule in RULES:
        _reject(
            np.asarray(rule.holds(model, batch, workload, cluster.num_gpus), dtype=np.bool_), alive, rule.reason, counts
        )
    if not allow_cross_node_tp:
        _reject(batch.tp <= cluster.domain_size, alive, TP_CROSSES, counts)
    for name, value in (pins or {}).items():
        _reject(np.asarray(getattr(batch, name)) == value, alive, f"not the pinned {name}", counts)
    params = count_params(model)
    budget = cluster.gpu.hbm_bytes * (1 - headroom)
    valid = batch.take(alive)
    # the first stage's model state is part of its bill: over budget alone, the layout cannot fit
    state = np.asarray(state_bytes(model, params, valid, workload, stage=0), dtype=np.float64) * np.ones(len(valid))
    light = state <= budget
    counts[OOM] = int((~light).sum())
    batch_ok = valid.take(light)
    cal = cluster.gpu.calibration
    bill = peak_bill(model, params, batch_ok, workload, calibration=cal)
    billed = np.asarray(bill.total_bytes, dtype=np.float64) * np.ones(len(batch_ok))
    lightest, lightest_bytes = _lightest(valid, state, batch_ok, billed)
    if lightest is not None and not len(batch_ok):  # every layout's state alone overflowed: bill the lightest whole
        one = LayoutBatch.of([lightest])
        lightest_bytes = float(np.asarray(peak_bill(model, params, one, workload, calibration=cal).total_bytes)[0])
    fits = np.asarray(bill.total_bytes <= budget, dtype=np.bool_)
    still = np.ones(len(batch_ok), dtype=np.bool_)
    _reject(fits, still, OOM, counts)
    feasible = batch_ok.take(still)
    bill = MemoryBill(
        **{k: np.asarray(v)[still] for k, v in bill.as_dict().items() if k in MemoryBill.__dataclass_fields__}
    )
    placement = place(mesh_sizes(feasible), order=order, domain=cluster.domain_size)
    step, _ = step_time(model, params, feasible, workload, cluster, placement)
    times = np.asarray(step.step_time_s, dtype=np.float64) * np.ones(len(feasible))
    total = np.asarray(bill.total_bytes, dtype=np.float64)
    ranking = _rank(times, total, objective)
    result_batch = feasible.take(ranking)
    step = _take(step, ranking)
    bill = _take(bill, ranking)
    front = pareto_front(np.asarray(step.step_time_s) * np.ones(len(ranking)), np.asarray(bill.total_bytes))
    return SearchResult(
        candidates=result_batch,
        step=step,
        memory=bill,
        evaluated=len(batch),
        rejections=counts,
        elapsed_s=time.perf_counter() - start,
        pareto=front,
        lightest=lightest,
        lightest_bytes=lightest_bytes,
    )


def _lightest(
    valid: LayoutBatch, state: npt.NDArray[np.float64], billed_batch: LayoutBatch, billed: npt.NDArray[np.float64]
) -> tuple[Layout | None, float]:
    """The layout with the smallest whole bill, or, when none was billed, the one with the smallest model state."""
    if len(billed_batch):
        i = int(np.argmin(billed))
        return billed_batch.layout(i), float(billed[i])
    if len(valid):
        i = int(np.argmin(state))
        return valid.layout(i), float(state[i])
    return None, 0.0


def _rank(
    times: npt.NDArray[np.float64], memory: npt.NDArray[np.float64], objective: Objective
) -> npt.NDArray[np.int64]:
    """Candidate order: fastest first with less memory breaking ties, or most headroom near the fastest."""
    if objective is Objective.HEADROOM and len(times):
        near = times <= times.min() * 1.05
        return np.lexsort((times, memory, ~near))
    return np.lexsort((memory, np.round(times, 9)))


def _take(obj: Any, index: npt.NDArray[np.int64]) -> Any:
    """A StepTime or MemoryBill restricted to ``index``: per-layout arrays are indexed, scalars kept."""
    values = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        values[f.name] = v[index] if isinstance(v, np.ndarray) and v.ndim == 1 else v
    return type(obj)(**values)
