"""Training memory of a whole layout: every pipeline stage, the heaviest one, and whether it fits."""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.core.constraints import check_layout
from meshplan.core.memory.bill import TERMS, MemoryBill, candidates, stage_bill
from meshplan.core.memory.stage_activations import layer_activations
from meshplan.core.num import Num, where
from meshplan.core.params import ParamCount, count_params
from meshplan.spec.cluster import GPU, GpuCalibration
from meshplan.spec.layout import Layout, LayoutLike
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingMemory:
    """The bill of every pipeline stage of a layout, on one GPU kind."""

    stages: tuple[MemoryBill, ...]
    heaviest_stage: int
    hbm_bytes: float

    @property
    def per_gpu(self) -> MemoryBill:
        """The heaviest stage's bill: what decides whether the layout fits."""
        return self.stages[self.heaviest_stage]

    @property
    def fits(self) -> bool:
        return bool(self.per_gpu.total_bytes <= self.hbm_bytes)

    @property
    def free_bytes(self) -> float:
        return float(self.hbm_bytes - self.per_gpu.total_bytes)


def training_memory(model: ModelSpec, layout: Layout, workload: Workload, *, gpu: GPU) -> TrainingMemory:
    """Bill every stage of ``layout``; raises ValueError if the layout does not suit the model or batch."""
    check_layout(model, layout, workload, layout.num_gpus)
    params = count_params(model)
    stages = tuple(
        stage_bill(model, params, layout, workload, calibration=gpu.calibration, stage=i) for i in range(layout.pp)
    )
    heaviest = max(range(layout.pp), key=lambda i: stages[i].total_bytes)
    return TrainingMemory(stages=stages, heaviest_stage=heaviest, hbm_bytes=gpu.hbm_bytes)


def peak_bill(
    model: ModelSpec, params: ParamCount, layouts: LayoutLike, workload: Workload, *, calibration: GpuCalibration
) -> MemoryBill:
    """The heaviest-stage bill of each layout in a batch, from the stages that can be heaviest (``candidates``)."""
    best: MemoryBill | None = None
    acts = layer_activations(model, layouts, workload)
    for stage in candidates(model, layouts, workload):
        bill = stage_bill(model, params, layouts, workload, calibration=calibration, stage=stage, layer_acts=acts)
        best = bill if best is None else _heavier(best, bill)
    assert best is not None
    return best


def _heavier(a: MemoryBill, b: MemoryBill) -> MemoryBill:
    take_b: Num = b.total_bytes > a.total_bytes
    return MemoryBill(**{name: where(take_b, getattr(b, name), getattr(a, name)) for name in TERMS})
