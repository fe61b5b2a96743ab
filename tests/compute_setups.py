"""A GPU's compute setup as the layer-time tests build it: its catalog constants, 2-byte activations."""

from __future__ import annotations

from typing import Any

from meshplan import io
from meshplan.core.time.compute import ComputeSetup
from meshplan.units import DType


def gpu_setup(gpu: str = "h100-sxm", *, compute: DType = DType.BF16, **kwargs: Any) -> ComputeSetup:
    """``gpu``'s catalog constants at its ``compute`` peak (``kwargs``: kernels, attention, FP8 and ring options)."""
    g = io.load_gpu(gpu)
    return ComputeSetup(
        peak_flops=g.peak(compute),
        bf16_peak_flops=g.peak(DType.BF16),
        hbm_bytes_per_s=g.hbm_bandwidth_bytes_per_s,
        cal=g.calibration,
        act_bytes=2.0,
        **kwargs,
    )
