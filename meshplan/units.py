"""Units and dtype sizes: constants only, no logic.

Internally meshplan counts bytes, seconds, FLOPs, FLOP/s and bytes/s as plain
numbers whose names carry the unit (``weights_bytes``, ``step_time_s``).
Vendors quote HBM and link speeds in decimal units (an H200 has 141 GB =
141e9 bytes; NVLink 4 moves 450 GB/s = 450e9 bytes/s per direction). GiB
(2**30) appears only where a source states binary units.
"""

from enum import StrEnum

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KiB = 2**10
MiB = 2**20
GiB = 2**30

TFLOP = 1e12
PFLOP = 1e15

GBIT = 1e9 / 8  # bytes in one gigabit

SECONDS_PER_DAY = 86400.0
SECONDS_PER_HOUR = 3600.0


class DType(StrEnum):
    """Numeric formats of weights, activations, gradients and optimizer state."""

    FP32 = "fp32"
    """IEEE single precision, 4 bytes."""
    TF32 = "tf32"
    """Tensor-core input format of fp32 matmuls; stored as 4 bytes."""
    BF16 = "bf16"
    """bfloat16, 2 bytes."""
    FP16 = "fp16"
    """IEEE half precision, 2 bytes."""
    FP8 = "fp8"
    """8-bit float (E4M3 / E5M2), 1 byte."""
    INT8 = "int8"
    """8-bit integer, 1 byte."""
    FP4 = "fp4"
    """4-bit float (MXFP4 / NVFP4), half a byte."""
    INT4 = "int4"
    """4-bit integer, half a byte."""
    NF4 = "nf4"
    """4-bit NormalFloat of QLoRA, half a byte (block scales counted apart)."""


DTYPE_BYTES: dict[DType, float] = {
    DType.FP32: 4.0,
    DType.TF32: 4.0,
    DType.BF16: 2.0,
    DType.FP16: 2.0,
    DType.FP8: 1.0,
    DType.INT8: 1.0,
    DType.FP4: 0.5,
    DType.INT4: 0.5,
    DType.NF4: 0.5,
}
FP32_BYTES = DTYPE_BYTES[DType.FP32]
"""Accumulators, optimizer moments, losses: the width that stays fp32 whatever the training dtype."""
