"""The lightest valid layout of a search, by its whole bill: what the planner shows when nothing fits."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from meshplan.core.params import ParamCount
from meshplan.core.training import peak_bill
from meshplan.search.space import LayoutBatch
from meshplan.spec.cluster import Cluster, GpuCalibration
from meshplan.spec.layout import Layout
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload

BLOCK = 4096
"""Layouts billed at once while looking for the lightest (in order of their model state)."""


@dataclass(slots=True)
class Lightest:
    """The valid layout with the smallest bill seen so far, across chunks, and how many valid layouts there
    were (those that pass every rule and pin, fitting or not)."""

    found: Layout | None = None
    bytes_per_gpu: float = float("inf")
    billed: bool = False
    """Whether ``bytes_per_gpu`` is a whole bill; False: the model state alone (no layout got that far)."""
    valid: int = 0

    def offer(self, batch: LayoutBatch, values: npt.NDArray[np.float64], *, billed: bool) -> None:
        if not len(batch) or (self.billed and not billed):
            return
        i = int(np.argmin(values))
        if (billed and not self.billed) or float(values[i]) < self.bytes_per_gpu:
            self.found, self.bytes_per_gpu, self.billed = batch.layout(i), float(values[i]), billed

    def bill_below(
        self,
        model: ModelSpec,
        params: ParamCount,
        valid: LayoutBatch,
        state: npt.NDArray[np.float64],
        workload: Workload,
        *,
        calibration: GpuCalibration,
    ) -> None:
        """Offer the whole bills of every layout of ``valid`` that could be lighter than the lightest so far.

        A layout's model state on its first stage is part of its bill, so a layout whose state is already at
        the lightest whole bill cannot beat it: the layouts are billed in order of their state, a block at a
        time, until the next one's state reaches the lightest bill. The lightest layout of the chunk is then
        known by its whole bill, whatever its state."""
        order = np.argsort(state, kind="stable")
        for start in range(0, len(order), BLOCK):
            block = order[start : start + BLOCK]
            if self.billed:
                block = block[state[block] < self.bytes_per_gpu]
            if not len(block):
                return
            rows = valid.take(block)
            bill = peak_bill(model, params, rows, workload, calibration=calibration)
            self.offer(rows, np.asarray(bill.total_bytes, dtype=np.float64) * np.ones(len(rows)), billed=True)

    def layout(self, model: ModelSpec, params: ParamCount, workload: Workload, cluster: Cluster) -> Layout | None:
        """The lightest layout, its whole bill computed when only its model state was known."""
        if self.found is not None and not self.billed:
            one = LayoutBatch.of([self.found])
            bill = peak_bill(model, params, one, workload, calibration=cluster.gpu.calibration)
            self.bytes_per_gpu, self.billed = float(np.asarray(bill.total_bytes)[0]), True
        if self.found is None:
            self.bytes_per_gpu = 0.0
        return self.found
