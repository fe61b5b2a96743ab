"""Second passes over the layouts of a chunk that fit: their ring-CP K/V all-gathered instead, and micro-batches
past the space's largest where memory allows them."""

from __future__ import annotations

import dataclasses

import numpy as np

from meshplan.core.memory.bill import MemoryBill
from meshplan.core.params import ParamCount
from meshplan.core.placement import place
from meshplan.core.plan import mesh_sizes
from meshplan.core.time.step_time import StepTime, step_time
from meshplan.search.bills import fitting_bill
from meshplan.search.space import MAX_MICRO_BATCH, LayoutBatch, dualpipe_runs
from meshplan.spec.cluster import Cluster
from meshplan.spec.layout import ContextParallel, Schedule
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload

OOM = "OOM"

Part = tuple[LayoutBatch, StepTime, MemoryBill]
"""Layouts that fit, with their step time and bill."""


def timed(
    model: ModelSpec,
    params: ParamCount,
    feasible: LayoutBatch,
    workload: Workload,
    cluster: Cluster,
    order: tuple[str, ...],
    bill: MemoryBill,
) -> Part:
    """Layouts that fit with their step time (TP placed on the fleet in ``order``) and bill."""
    placement = place(mesh_sizes(feasible), order=order, domain=cluster.domain_size)
    step, _ = step_time(model, params, feasible, workload, cluster, placement, calls=False)
    return feasible, step, bill


def _fitting(
    model: ModelSpec,
    params: ParamCount,
    tried: LayoutBatch,
    workload: Workload,
    cluster: Cluster,
    budget: float,
    order: tuple[str, ...],
    counts: dict[str, int],
) -> Part | None:
    """Those of ``tried`` that fit, timed (None: none do); the others are counted as OOM."""
    fits, bill = fitting_bill(model, params, tried, workload, calibration=cluster.gpu.calibration, budget=budget)
    counts[OOM] = counts.get(OOM, 0) + int((~fits).sum())
    if not fits.any():
        return None
    return timed(model, params, tried.take(fits), workload, cluster, order, bill)


def all_gathered(
    model: ModelSpec,
    params: ParamCount,
    feasible: LayoutBatch,
    workload: Workload,
    cluster: Cluster,
    budget: float,
    order: tuple[str, ...],
    counts: dict[str, int],
) -> tuple[int, Part | None]:
    """The ring-CP layouts of ``feasible`` (a chunk's that fit, near the fastest), tried again with all-gathered
    K/V: how many were tried, and those that fit with their step time and bill (None: none do). The rules do not
    read the CP kind, so only the bill can reject them."""
    ring = np.flatnonzero((feasible.cp > 1) & (feasible.cp_kind == int(ContextParallel.RING)))
    if not len(ring):
        return 0, None
    tried = feasible.take(ring)
    tried = dataclasses.replace(tried, cp_kind=np.full(len(tried), int(ContextParallel.ALL_GATHER), dtype=np.int64))
    return len(tried), _fitting(model, params, tried, workload, cluster, budget, order, counts)


def larger_micro_batches(
    model: ModelSpec,
    params: ParamCount,
    feasible: LayoutBatch,
    workload: Workload,
    cluster: Cluster,
    budget: float,
    order: tuple[str, ...],
    counts: dict[str, int],
    *,
    top: int,
) -> tuple[int, list[Part]]:
    """The layouts of ``feasible`` (a chunk's that fit) at micro-batch ``top``, the space's largest, tried again
    with their micro-batch doubled, and those that fit doubled again, while any fits, up to MAX_MICRO_BATCH: how
    many were tried, and those that fit. The batch rule is checked here (a micro-batch must divide the
    sequences of a data-parallel rank; DualPipe needs its even count of micro-batches); no other rule reads the
    micro-batch."""
    rung = feasible.take(feasible.micro_batch == top)
    tried, out = 0, []
    while len(rung):
        doubled = dataclasses.replace(rung, micro_batch=rung.micro_batch * 2)
        keep = doubled.micro_batch <= MAX_MICRO_BATCH
        keep &= workload.global_batch % (doubled.micro_batch * doubled.dp) == 0
        keep &= (doubled.schedule != int(Schedule.DUALPIPE)) | dualpipe_runs(doubled, workload.global_batch)
        doubled = doubled.take(keep)
        tried += len(doubled)
        part = _fitting(model, params, doubled, workload, cluster, budget, order, counts) if len(doubled) else None
        if part is None:
            break
        out.append(part)
        rung = part[0]
    return tried, out
