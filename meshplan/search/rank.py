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
from meshplan.core.groups import model_parallel_groups, take_rows
from meshplan.core.memory.bill import TERMS, MemoryBill, candidates, stage_bill, state_bytes
from meshplan.core.memory.stage_activations import (
    LayerActivations,
    StageActivations,
    layer_activations,
    stage_activations,
)
from meshplan.core.memory.stage_params import StageParams, layout_stage_params
from meshplan.core.params import ParamCount, count_params
from meshplan.core.placement import DEFAULT_ORDER, place
from meshplan.core.plan import mesh_sizes
from meshplan.core.time.step_time import StepTime, step_time
from meshplan.core.training import peak_bill
from meshplan.search.limits import check_deadline, progress_report
from meshplan.search.order import Objective, pareto_front, rank
from meshplan.search.space import LayoutBatch, SearchSpace, layout_chunks
from meshplan.spec.cluster import Cluster, GpuCalibration
from meshplan.spec.layout import ContextParallel, Layout
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload

OOM = "OOM"
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
) -> SearchResult:
    """Search every layout of ``model`` on ``cluster`` for ``workload``; the fastest that fit come first.

    Candidates are evaluated a chunk at a time (``space.layout_chunks``) and only the feasible ones are kept, so
    memory stays bounded however large the fleet. ``pins`` keeps only layouts whose column (a LayoutBatch
    field: tp, zero, recompute as its enum value...) equals the value given; the others are rejected as
    "not the pinned <field>".
    """
    start = time.perf_counter()
    wide = max(MAX_TP_DOMAINS * cluster.domain_size, 8)
    space = space or SearchSpace(max_tp=wide if not allow_cross_node_tp else None)
    gather = space.cp_all_gather and space.cp_kind is ContextParallel.RING and "cp_kind" not in (pins or {})
    rules = Rules(allow_cross_node_tp=allow_cross_node_tp, pins=dict(pins or {}), cp_all_gather=gather)
    params = count_params(model)
    budget = cluster.gpu.hbm_bytes * (1 - headroom)
    walk = functools.partial(_walk, model, params, workload, cluster, space, rules, order, budget, start)
    evaluated, kept, counts, lightest = walk(exact_lightest=False)
    if not kept:  # nothing fits: walk again billing every stage of every layout, for the lightest one's bill
        evaluated, kept, counts, lightest = walk(exact_lightest=True)
    feasible, step, bill = _concatenate(kept)
    kept.clear()  # the chunks' copies: only the joined arrays are needed from here
    return SearchResult(
        **_ranked(feasible, step, bill, objective),
        evaluated=evaluated,
        rejections=counts,
        elapsed_s=time.perf_counter() - start,
        lightest=lightest.layout(model, params, workload, cluster),
        lightest_bytes=lightest.bytes_per_gpu,
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
) -> tuple[int, list[tuple[LayoutBatch, StepTime, MemoryBill]], dict[str, int], Lightest]:
    """Every layout of the space, a chunk at a time: how many, those that fit, the rejections, the lightest."""
    counts: dict[str, int] = {}
    lightest, evaluated = Lightest(), 0
    kept: list[tuple[LayoutBatch, StepTime, MemoryBill]] = []
    num_chunks, chunks = layout_chunks(
        model,
        num_gpus=cluster.num_gpus,
        global_batch=workload.global_batch,
        space=space,
        domain=cluster.domain_size,
        allow_cross_node_tp=True,
    )
    fastest_s = float("inf")  # the fastest layout kept so far: where all-gathered K/V is worth trying
    for done, batch in enumerate(chunks, start=1):
        check_deadline()
        evaluated += len(batch)
        part = _evaluate_chunk(
            model, params, batch, workload, cluster, budget, rules, order, counts, lightest, exact_lightest
        )
        if part is not None:
            kept.append(part)
            if rules.cp_all_gather:
                times = np.asarray(part[1].step_time_s, dtype=np.float64) * np.ones(len(part[0]))
                fastest_s = min(fastest_s, float(times.min()))
                near = times <= (1 + ALL_GATHER_WINDOW) * fastest_s
                tried, gathered = _all_gathered(
                    model, params, part[0].take(near), workload, cluster, budget, order, counts
                )
                evaluated += tried
                if gathered is not None:
                    kept.append(gathered)
                    fastest_s = min(fastest_s, float(np.min(np.asarray(gathered[1].step_time_s))))
        report = progress_report()
        if report is not None:
            report(evaluated, done / num_chunks, time.perf_counter() - start)
    return evaluated, kept, counts, lightest


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


@dataclass(slots=True)
class Lightest:
    """The valid layout with the smallest bill seen so far, across chunks (what to show when nothing fits)."""

    found: Layout | None = None
    bytes_per_gpu: float = float("inf")
    billed: bool = False
    """Whether ``bytes_per_gpu`` is a whole bill; False: the model state alone (no layout got that far)."""

    def offer(self, batch: LayoutBatch, values: npt.NDArray[np.float64], *, billed: bool) -> None:
        if not len(batch) or (self.billed and not billed):
            return
        i = int(np.argmin(values))
        if (billed and not self.billed) or float(values[i]) < self.bytes_per_gpu:
            self.found, self.bytes_per_gpu, self.billed = batch.layout(i), float(values[i]), billed

    def layout(self, model: ModelSpec, params: ParamCount, workload: Workload, cluster: Cluster) -> Layout | None:
        """The lightest layout, its whole bill computed when only its model state was known."""
        if self.found is not None and not self.billed:
            one = LayoutBatch.of([self.found])
            bill = peak_bill(model, params, one, workload, calibration=cluster.gpu.calibration)
            self.bytes_per_gpu, self.billed = float(np.asarray(bill.total_bytes)[0]), True
        if self.found is None:
            self.bytes_per_gpu = 0.0
        return self.found


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
) -> tuple[LayoutBatch, StepTime, MemoryBill] | None:
    """The layouts of one chunk that pass every rule and fit, with their step time and bill (None: none do).

    ``exact_lightest``: bill every candidate stage of every layout (``peak_bill``), so that the lightest layout
    is known by its whole bill; otherwise a layout is dropped at its first stage over budget (``fitting_bill``).
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
    # the first stage's model state is part of its bill: over budget alone, the layout cannot fit
    state = np.asarray(state_bytes(model, params, valid, workload, stage=0), dtype=np.float64) * np.ones(len(valid))
    light = state <= budget
    counts[OOM] = counts.get(OOM, 0) + int((~light).sum())
    lightest.offer(valid, state, billed=False)
    batch_ok = valid.take(light)
    if not len(batch_ok):
        return None
    if exact_lightest:  # every stage of every layout billed: the lightest bill is known when nothing fits
        bill = peak_bill(model, params, batch_ok, workload, calibration=cluster.gpu.calibration)
        lightest.offer(batch_ok, np.asarray(bill.total_bytes, dtype=np.float64) * np.ones(len(batch_ok)), billed=True)
        fits = np.asarray(bill.total_bytes <= budget, dtype=np.bool_)
        bill = _bill_rows(bill, np.flatnonzero(fits))
    else:
        fits, bill = fitting_bill(model, params, batch_ok, workload, calibration=cluster.gpu.calibration, budget=budget)
    still = np.ones(len(batch_ok), dtype=np.bool_)
    _reject(fits, still, OOM, counts)
    if not still.any():
        return None
    feasible = batch_ok.take(still)
    placement = place(mesh_sizes(feasible), order=order, domain=cluster.domain_size)
    step, _ = step_time(model, params, feasible, workload, cluster, placement, calls=False)
    return feasible, step, bill


ALL_GATHER_WINDOW = 0.3
"""Ring-CP layouts that fit are tried with all-gathered K/V when their step is within this share of the fastest
layout kept so far: all-gathering drops the ring's bookkeeping and p2p sends but adds its own gather, so a layout
30% slower than the best as a ring does not reach the top gathered. The fastest only falls as chunks go by, so
no layout within the window of the final best is skipped; slower ones are not tried (fewer evaluations)."""


def _all_gathered(
    model: ModelSpec,
    params: ParamCount,
    feasible: LayoutBatch,
    workload: Workload,
    cluster: Cluster,
    budget: float,
    order: tuple[str, ...],
    counts: dict[str, int],
) -> tuple[int, tuple[LayoutBatch, StepTime, MemoryBill] | None]:
    """The ring-CP layouts of ``feasible`` (a chunk's that fit, near the fastest), tried again with all-gathered
    K/V: how many were tried, and those that fit with their step time and bill (None: none do). The rules do not
    read the CP kind, so only the bill can reject them."""
    ring = np.flatnonzero((feasible.cp > 1) & (feasible.cp_kind == int(ContextParallel.RING)))
    if not len(ring):
        return 0, None
    tried = feasible.take(ring)
    tried = dataclasses.replace(tried, cp_kind=np.full(len(tried), int(ContextParallel.ALL_GATHER), dtype=np.int64))
    fits, bill = fitting_bill(model, params, tried, workload, calibration=cluster.gpu.calibration, budget=budget)
    counts[OOM] = counts.get(OOM, 0) + int((~fits).sum())
    if not fits.any():
        return len(tried), None
    gathered = tried.take(fits)
    placement = place(mesh_sizes(gathered), order=order, domain=cluster.domain_size)
    step, _ = step_time(model, params, gathered, workload, cluster, placement, calls=False)
    return len(tried), (gathered, step, bill)


def fitting_bill(
    model: ModelSpec,
    params: ParamCount,
    layouts: LayoutBatch,
    workload: Workload,
    *,
    calibration: GpuCalibration,
    budget: float,
) -> tuple[npt.NDArray[np.bool_], MemoryBill]:
    """Which layouts of a batch fit in ``budget`` bytes per GPU, and the heaviest-stage bill of those that do.

    The bills of ``peak_bill``, stage by stage over the candidate stages, but a layout whose running maximum is
    over budget is dropped at once and its later stages are not billed: one stage over budget is the verdict.
    """
    n = len(layouts)
    groups = model_parallel_groups(layouts)  # activations read neither the ZeRO stage nor the data-parallel split
    alike = layouts if groups is None else layouts.take(groups.first)
    acts = layer_activations(model, alike, workload)
    alive = np.arange(n)
    best: MemoryBill | None = None
    billed: list[npt.NDArray[np.int64]] = []  # the stages each layout has been billed on, one array per round
    for candidate in candidates(model, layouts, workload):
        stage = np.broadcast_to(np.asarray(candidate, dtype=np.int64), (n,))
        # a run of equal stages names the same stage twice for most layouts: bill each layout's stage once
        fresh = np.arange(len(alive))
        for earlier in billed:
            fresh = fresh[stage[alive[fresh]] != earlier[alive[fresh]]]
        billed.append(stage)
        if not len(fresh):
            continue
        rows = alive[fresh]
        whole = len(rows) == n  # nothing dropped nor skipped yet: no copies
        live = layouts if whole else layouts.take(rows)
        if groups is None:
            held, activations = None, None
            acts_live = acts if whole else _rows_of(acts, rows)
        else:  # billed once per group, then copied to the group's live layouts
            held, activations = _per_group_stage(model, params, alike, workload, stage=stage[groups.first], acts=acts)
            held, activations = take_rows((held, activations), groups.inverse[rows], len(groups))
            acts_live = None
        bill = stage_bill(
            model,
            params,
            live,
            workload,
            calibration=calibration,
            stage=candidate if whole else stage[rows],
            layer_acts=acts_live,
            activations=activations,
            held=held,
        )
        best = bill if best is None else _merge(best, bill, fresh, len(alive))
        keep = np.flatnonzero(np.asarray(best.total_bytes) * np.ones(len(alive)) <= budget)
        alive, best = alive[keep], _bill_rows(best, keep)
        if not len(alive):
            break
    fits = np.zeros(n, dtype=np.bool_)
    fits[alive] = True
    assert best is not None
    return fits, best


def _per_group_stage(
    model: ModelSpec,
    params: ParamCount,
    alike: LayoutBatch,
    workload: Workload,
    *,
    stage: npt.NDArray[np.int64],
    acts: LayerActivations,
) -> tuple[StageParams, StageActivations]:
    """The parameters and activations of one stage of each group's representative (neither reads the ZeRO stage
    or the data-parallel split)."""
    held = layout_stage_params(params, model, alike, workload, stage=stage)
    return held, stage_activations(model, params, alike, workload, stage=stage, layer_acts=acts, held=held)


def _merge(best: MemoryBill, bill: MemoryBill, at: npt.NDArray[np.int64], size: int) -> MemoryBill:
    """``best`` (one row per live layout) with its rows ``at`` taken from ``bill`` where ``bill`` is heavier."""
    win = _column(bill.total_bytes, len(at)) > _column(best.total_bytes, size)[at]
    rows = at[win]
    out = {}
    for name in TERMS:
        column = _column(getattr(best, name), size).copy()
        column[rows] = _column(getattr(bill, name), len(at))[win]
        out[name] = column
    return MemoryBill(**out)


def _column(value: Any, size: int) -> npt.NDArray[np.float64]:
    return np.broadcast_to(np.asarray(value, dtype=np.float64), (size,))


def _rows(value: Any, index: npt.NDArray[np.int64]) -> Any:
    return value[index] if np.ndim(value) else value


def _rows_of(acts: LayerActivations, index: npt.NDArray[np.int64]) -> LayerActivations:
    return dataclasses.replace(acts, **{f.name: _rows(getattr(acts, f.name), index) for f in dataclasses.fields(acts)})


def _bill_rows(bill: MemoryBill, index: npt.NDArray[np.int64]) -> MemoryBill:
    return MemoryBill(**{name: _rows(np.asarray(getattr(bill, name)), index) for name in TERMS})


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
