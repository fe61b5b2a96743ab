"""The FP8 casts around a layer's linear layers: what Transformer Engine's and torchao's recipes read and write
at HBM speed per input, output-gradient and saved-input element (delayed and dynamic scales, rowwise, MXFP8)."""

from __future__ import annotations

from meshplan.core.num import Num
from meshplan.core.pytorch.overheads import (
    DYNAMIC_AMAX_BYTES,
    DYNAMIC_CAST_BYTES,
    ROWWISE_CAST_BYTES,
    ROWWISE_WEIGHT_CAST_BYTES,
)
from meshplan.core.time.flops import Gemm

FP8_CAST_BYTES_FWD = {False: 3.0, True: 0.0}
"""Bytes per input element an FP8 linear layer adds in forward (Transformer Engine), unfused (False): the bf16
input read and its FP8 copy written, amax fused in; fused kernels (True: LayerNormLinear, the fused activation)
write the FP8 copy in place of the bf16 one, at no extra cost. Weights are cast once per step, not counted."""
FP8_CAST_BYTES_BWD_GRAD = {False: 5.0, True: 4.0}
"""Per output-gradient element in backward: cast and transpose (read bf16, write the FP8 copy and its
transpose: 4 bytes fused in TE's cast_transpose, 3 + 2 as two kernels)."""
FP8_CAST_BYTES_GRAD_ONLY = 3.0
"""Per output-gradient element in backward when the weight is frozen: the input gradient's GEMM alone reads it,
so one cast (read bf16, write FP8) and no transpose."""
FP8_TRANSPOSE_BYTES_INPUT = 2.0
"""Per saved-input element in backward: the FP8 transpose the weight-gradient GEMM reads (read and write 1 byte)."""
MX_SCALE_BYTES = 2 / 32
"""Per element of a block-scaled (MXFP8) cast: one E8M0 scale byte per 32 elements, for each of its two copies."""
MX_CAST_BYTES = 4.0 + MX_SCALE_BYTES
"""Per element an MXFP8 cast moves: the bf16 tensor read (2), its row-wise and column-wise FP8 copies written
(1 + 1; each scaled along its own reduction dimension, so one cannot be the other's transpose) and their scales.
Transformer Engine's MXFP8 quantizer writes both copies in one pass, in forward for an input (no transpose in
backward) and in backward for an output gradient; a fused producer (LayerNormLinear, the fused activation) writes
them in place of its bf16 output, for the scales' bytes alone."""


def fp8_cast_time(
    gemms: list[Gemm],
    *,
    fused: bool,
    hbm: Num,
    dynamic: bool = False,
    weights_cast: bool = True,
    block_scaled: bool = False,
    rowwise: bool = False,
    frozen: bool = False,
) -> tuple[Num, Num]:
    """(forward, backward) HBM time of the casts and transposes around FP8 linear layers.

    Transformer Engine (``dynamic`` False) fuses the casts of the inputs into the kernels that write them and
    casts the weights once per step. torchao (``dynamic``) casts every input, every output gradient and, unless
    FSDP gathered them in FP8 already (``weights_cast`` False: cast on the shard, not counted), every weight on
    each forward, after an amax pass of its own; one cast per distinct input (Inductor merges the identical
    casts of wq, wk and wv). Block-scaled (MXFP8) casts find each block's scale inside the cast, so no amax pass,
    and write both copies at once (``MX_CAST_BYTES``). A ``frozen`` weight has no weight gradient, so Transformer
    Engine makes no column-wise copy (``columnwise=... weight_requires_grad``): no input transposes, and the
    output gradient cast once for the input gradient (``FP8_CAST_BYTES_GRAD_ONLY``; MXFP8: its row-wise copy).
    """
    inputs = sum(g.m * g.k * g.count for g in gemms)
    outputs = sum(g.m * g.n * g.count for g in gemms)
    if dynamic and rowwise:
        # the cast along dim 1 (read the bf16 transpose, write FP8: 3 bytes) serves a backward GEMM; an input's
        # first cast and a weight's forward cast (read 2, write 1) run in forward, an output gradient's in backward
        act, later = ROWWISE_CAST_BYTES[fused], 3.0
        weights = sum(g.n * g.k * g.count for g in gemms) if weights_cast else 0.0
        fwd = inputs * (act - later) + weights * 3.0
        bwd = inputs * later + outputs * act + weights * (ROWWISE_WEIGHT_CAST_BYTES - 3.0)
        return fwd / hbm, bwd / hbm
    if dynamic:
        cast = DYNAMIC_CAST_BYTES + (MX_SCALE_BYTES if block_scaled else 0.0)
        amax = 0.0 if block_scaled else DYNAMIC_AMAX_BYTES
        per_element = cast + (0.0 if fused else amax)
        weights = sum(g.n * g.k * g.count for g in gemms) if weights_cast else 0.0
        fwd = (inputs * per_element + weights * (cast + amax)) / hbm
        return fwd, outputs * per_element / hbm
    if block_scaled:
        one_copy = MX_CAST_BYTES - 1 - MX_SCALE_BYTES / 2  # read bf16, write one FP8 copy and its scales
        cast = one_copy if frozen else MX_CAST_BYTES
        fwd = inputs * (MX_SCALE_BYTES / (2 if frozen else 1) if fused else cast) / hbm
        return fwd, outputs * cast / hbm
    fwd = inputs * FP8_CAST_BYTES_FWD[fused] / hbm
    if frozen:
        return fwd, outputs * FP8_CAST_BYTES_GRAD_ONLY / hbm
    return fwd, (outputs * FP8_CAST_BYTES_BWD_GRAD[fused] + inputs * FP8_TRANSPOSE_BYTES_INPUT) / hbm
