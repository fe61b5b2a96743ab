"""search(): every valid layout, evaluated with the core's own formulas as arrays, ranked.

Pipeline: enumerate candidates -> each rule of core.constraints as a mask
(every rejection keeps its reason) -> TP placement -> the heaviest-stage
memory bill against HBM minus headroom -> step time -> objective -> top-k and
the Pareto front of step time against memory per GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from meshplan.core.constraints import RULES
from meshplan.core.memory.bill import MemoryBill, state_bytes
from meshplan.core.params import ParamCount, count_params
from meshplan.core.placement import DEFAULT_ORDER
from meshplan.core.time.step_time import StepTime
from meshplan.search.bills import fitting_bill as fitting_bill
from meshplan.search.lightest import Lightest
from meshplan.search.limits import check_deadline, progress_report
from meshplan.search.order import Objective, pareto_front, rank
from meshplan.search.passes import OOM as OOM
from meshplan.search.passes import Part, all_gathered, larger_micro_batches, timed
from meshplan.search.space import LayoutBatch, SearchSpace, layout_chunks
from meshplan.spec.cluster import Cluster
from meshplan.spec.layout import ContextParallel, Layout
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload

TP_CROSSES = "TP crosses node"


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
    valid: int = 0
    """Layouts that pass every rule and pin, fitting or not (0: the pins or the rules leave none)."""

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


HEADROOM = 0.10
"""The share of HBM a layout the planner keeps leaves free, unless told otherwise (``--headroom``)."""


def search(
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    *,
    space: SearchSpace | None = None,
    headroom: float = HEADROOM,
    allow_cross_node_tp: bool = False,
    order: tuple[str, ...] = DEFAULT_ORDER,
    objective: Objective = Objective.STEP_TIME,
    pins: Mapping[str, int] | None = None,
    lightest: bool = True,
) -> SearchResult:
    """Search every layout of ``model`` on ``cluster`` for ``workload``; the fastest that fit come first.

    Candidates are evaluated a chunk at a time (``space.layout_chunks``) and only the feasible ones are kept, so
    memory stays bounded however large the fleet. ``pins`` keeps only layouts whose column (a LayoutBatch
    field: tp, zero, recompute as its enum value...) equals the value given; the others are rejected as
    "not the pinned <field>". ``lightest``: when nothing fits, walk the layouts again for the lightest one by its
    whole bill (False: a search that only asks whether anything fits skips that walk; ``lightest`` is None).
    """
    start = time.perf_counter()
    wide = max(MAX_TP_DOMAINS * cluster.domain_size, 8)
    space = space or SearchSpace(max_tp=wide if not allow_cross_node_tp else None)
    gather = space.cp_all_gather and space.cp_kind is ContextParallel.RING and "cp_kind" not in (pins or {})
    rules = Rules(allow_cross_node_tp=allow_cross_node_tp, pins=dict(pins or {}), cp_all_gather=gather)
    params = count_params(model)
    budget = cluster.gpu.hbm_bytes * (1 - headroom)
    walk = functools.partial(_walk, model, params, workload, cluster, space, rules, order, budget, start)
    evaluated, kept, counts, light = walk(exact_lightest=False)
    if not kept and lightest:  # nothing fits: walk again billing the layouts that may be the lightest
        evaluated, kept, counts, light = walk(exact_lightest=True)
    feasible, step, bill = _concatenate(kept)
    kept.clear()  # the chunks' copies: only the joined arrays are needed from here
    return SearchResult(
        **_ranked(feasible, step, bill, objective),
        evaluated=evaluated,
        rejections=counts,
        elapsed_s=time.perf_counter() - start,
        lightest=light.layout(model, params, workload, cluster) if lightest else None,
        lightest_bytes=light.bytes_per_gpu if lightest else 0.0,
        valid=light.valid,
    )


def _walk(
    model: ModelSpec,
    params: ParamCount,
    workload: Workload,
    cluster: Cluster,
    space: SearchSpace,
    rules: Rules,
    order: tuple[str, ...],
    budget: float,
    start: float,
    *,
    exact_lightest: bool,
) -> tuple[int, list[Part], dict[str, int], Lightest]:
    """Every layout of the space, a chunk at a time: how many, those that fit, the rejections, the lightest.

    Two passes follow the chunks' own: ring-CP layouts near the fastest tried with all-gathered K/V (each chunk,
    ``ALL_GATHER_WINDOW``), and, once every chunk is done, the layouts that fit at the space's largest
    micro-batch within the same window of the fastest tried with it doubled while they fit
    (``SearchSpace.micro_batch_ladder``: a larger micro-batch runs its matmuls a few per cent faster, so a layout
    30% behind does not reach the top with it)."""
    counts: dict[str, int] = {}
    lightest, evaluated = Lightest(), 0
    kept: list[Part] = []
    num_chunks, chunks = layout_chunks(
        model,
        num_gpus=cluster.num_gpus,
        global_batch=workload.global_batch,
        space=space,
        domain=cluster.domain_size,
        allow_cross_node_tp=True,
    )
    fastest_s = float("inf")  # the fastest layout kept so far: where all-gathered K/V is worth trying
    gather = functools.partial(_gathered, model, params, workload, cluster, rules, order, budget, counts)
    top = max(space.micro_batch_choices)
    at_top: list[Part] = []  # the layouts that fit at the largest micro-batch: the ladder's first rung
    for done, batch in enumerate(chunks, start=1):
        check_deadline()
        evaluated += len(batch)
        part = _evaluate_chunk(
            model, params, batch, workload, cluster, budget, rules, order, counts, lightest, exact_lightest
        )
        if part is not None:
            tried, parts, fastest_s = gather(part, fastest_s)
            evaluated += tried
            kept += parts
            if space.micro_batch_ladder:
                at_top.append(_rows_of_part(part, np.flatnonzero(part[0].micro_batch == top)))
        report = progress_report()
        if report is not None:
            report(evaluated, done / num_chunks, time.perf_counter() - start)
    if at_top:
        rung = _concatenate(at_top)
        near = np.flatnonzero(_times(rung) <= (1 + ALL_GATHER_WINDOW) * fastest_s)
        tried, more = larger_micro_batches(
            model, params, rung[0].take(near), workload, cluster, budget, order, counts, top=top
        )
        evaluated += tried
        for part in more:
            tried, parts, fastest_s = gather(part, fastest_s)
            evaluated += tried
            kept += parts
    return evaluated, kept, counts, lightest


def _times(part: Part) -> npt.NDArray[np.float64]:
    return np.asarray(part[1].step_time_s, dtype=np.float64) * np.ones(len(part[0]))


def _rows_of_part(part: Part, index: npt.NDArray[np.int64]) -> Part:
    return part[0].take(index), _take(part[1], index), _take(part[2], index)


def _gathered(
    model: ModelSpec,
    params: ParamCount,
    workload: Workload,
    cluster: Cluster,
    rules: Rules,
    order: tuple[str, ...],
    budget: float,
    counts: dict[str, int],
    part: Part,
    fastest_s: float,
) -> tuple[int, list[Part], float]:
    """A part that fits, and its ring-CP layouts near the fastest so far tried with all-gathered K/V
    (``ALL_GATHER_WINDOW``): how many more were tried, the parts that fit, and the fastest step so far."""
    times = _times(part)
    fastest_s = min(fastest_s, float(times.min()))
    if not rules.cp_all_gather:
        return 0, [part], fastest_s
    near = times <= (1 + ALL_GATHER_WINDOW) * fastest_s
    tried, gathered = all_gathered(model, params, part[0].take(near), workload, cluster, budget, order, counts)
    if gathered is None:
        return tried, [part], fastest_s
    return tried, [part, gathered], min(fastest_s, float(_times(gathered).min()))


def _ranked(feasible: LayoutBatch, step: StepTime, bill: MemoryBill, objective: Objective) -> dict[str, Any]:
    """The feasible layouts, their step times and bills in the objective's order, and their Pareto front."""
    times = np.asarray(step.step_time_s, dtype=np.float64) * np.ones(len(feasible))
    total = np.asarray(bill.total_bytes, dtype=np.float64) * np.ones(len(feasible))
    ranking = rank(times, total, objective)
    step, bill = _take(step, ranking), _take(bill, ranking)
    front = pareto_front(np.asarray(step.step_time_s) * np.ones(len(ranking)), np.asarray(bill.total_bytes))
    return {"candidates": feasible.take(ranking), "step": step, "memory": bill, "pareto": front}


@dataclass(frozen=True, slots=True, kw_only=True)
class Rules:
    """What a search refuses beyond the model's rules: TP across the scale-up domain, and unpinned values."""

    allow_cross_node_tp: bool
    pins: dict[str, int]
    cp_all_gather: bool = False
    """Also evaluate the fitting ring-CP layouts near the fastest with all-gathered K/V (``ALL_GATHER_WINDOW``,
    ``SearchSpace.cp_all_gather``)."""


def _evaluate_chunk(
    model: ModelSpec,
    params: ParamCount,
    batch: LayoutBatch,
    workload: Workload,
    cluster: Cluster,
    budget: float,
    rules: Rules,
    order: tuple[str, ...],
    counts: dict[str, int],
    lightest: Lightest,
    exact_lightest: bool = False,
) -> Part | None:
    """The layouts of one chunk that pass every rule and fit, with their step time and bill (None: none do).

    ``exact_lightest``: also bill whole every valid layout that may be lighter than the lightest so far
    (``Lightest.bill_below``), fitting or not, so that the lightest layout is known by its whole bill.
    """
    alive = np.ones(len(batch), dtype=np.bool_)
    for rule in RULES:
        _reject(
            np.asarray(rule.holds(model, batch, workload, cluster.num_gpus), dtype=np.bool_), alive, rule.reason, counts
        )
    if not rules.allow_cross_node_tp:
        _reject(batch.tp <= cluster.domain_size, alive, TP_CROSSES, counts)
    for name, value in rules.pins.items():
        _reject(np.asarray(getattr(batch, name)) == value, alive, f"not the pinned {name}", counts)
    valid = batch.take(alive)
    lightest.valid += len(valid)
    # the first stage's model state is part of its bill: over budget alone, the layout cannot fit
    state = np.asarray(state_bytes(model, params, valid, workload, stage=0), dtype=np.float64) * np.ones(len(valid))
    light = state <= budget
    counts[OOM] = counts.get(OOM, 0) + int((~light).sum())
    lightest.offer(valid, state, billed=False)
    if exact_lightest:  # the layouts that may be the lightest billed whole, fitting or not
        lightest.bill_below(model, params, valid, state, workload, calibration=cluster.gpu.calibration)
    batch_ok = valid.take(light)
    if not len(batch_ok):
        return None
    fits, bill = fitting_bill(model, params, batch_ok, workload, calibration=cluster.gpu.calibration, budget=budget)
    still = np.ones(len(batch_ok), dtype=np.bool_)
    _reject(fits, still, OOM, counts)
    if not still.any():
        return None
    return timed(model, params, batch_ok.take(still), workload, cluster, order, bill)


ALL_GATHER_WINDOW = 0.3
"""Ring-CP layouts that fit are tried with all-gathered K/V when their step is within this share of the fastest
layout kept so far: all-gathering drops the ring's bookkeeping and p2p sends but adds its own gather, so a layout
30% slower than the best as a ring does not reach the top gathered. The fastest only falls as chunks go by, so
no layout within the window of the final best is skipped; slower ones are not tried (fewer evaluations)."""


def _concatenate(parts: list[tuple[LayoutBatch, StepTime, MemoryBill]]) -> tuple[LayoutBatch, StepTime, MemoryBill]:
    """The feasible layouts of every chunk as one batch, step time and bill (per-layout arrays joined)."""
    if len(parts) == 1:
        return parts[0]
    if not parts:
        empty = LayoutBatch.of([])
        return empty, _empty(StepTime), _empty(MemoryBill)
    sizes = [len(b) for b, _, _ in parts]
    batch = LayoutBatch(
        **{f.name: np.concatenate([getattr(b, f.name) for b, _, _ in parts]) for f in dataclasses.fields(LayoutBatch)}
    )
    return batch, _join([s for _, s, _ in parts], sizes), _join([m for _, _, m in parts], sizes)


def _join(objs: list[Any], sizes: list[int]) -> Any:
    """Dataclasses of per-layout arrays joined field by field; a scalar field stays a scalar if equal everywhere."""
    values = {}
    for f in dataclasses.fields(objs[0]):
        items = [getattr(o, f.name) for o in objs]
        if all(not isinstance(v, np.ndarray) for v in items) and all(v == items[0] for v in items):
            values[f.name] = items[0]
        else:
            values[f.name] = np.concatenate(
                [np.broadcast_to(np.asarray(v), (n,)) for v, n in zip(items, sizes, strict=True)]
            )
    return type(objs[0])(**values)


def _empty(cls: type[Any]) -> Any:
    return cls(**{f.name: np.zeros(0) for f in dataclasses.fields(cls)})


def _take(obj: Any, index: npt.NDArray[np.int64]) -> Any:
    """A StepTime or MemoryBill restricted to ``index``: per-layout arrays are indexed, scalars kept."""
    values = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        values[f.name] = v[index] if isinstance(v, np.ndarray) and v.ndim == 1 else v
    return type(obj)(**values)
