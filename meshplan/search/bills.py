"""Memory bills of many layouts at once, stage by stage: the planner's verdict of which fit, and their bills."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt

from meshplan.core.groups import model_parallel_groups, take_rows
from meshplan.core.memory.bill import TERMS, MemoryBill, candidates, stage_bill
from meshplan.core.memory.stage_activations import (
    LayerActivations,
    StageActivations,
    layer_activations,
    stage_activations,
)
from meshplan.core.memory.stage_params import StageParams, layout_stage_params
from meshplan.core.params import ParamCount
from meshplan.search.space import LayoutBatch
from meshplan.spec.cluster import GpuCalibration
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload


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
        alive, best = alive[keep], bill_rows(best, keep)
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


def bill_rows(bill: MemoryBill, index: npt.NDArray[np.int64]) -> MemoryBill:
    """The rows ``index`` of a bill (a scalar term stays a scalar)."""
    return MemoryBill(**{name: _rows(np.asarray(getattr(bill, name)), index) for name in TERMS})
