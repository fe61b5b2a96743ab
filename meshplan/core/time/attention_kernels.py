"""Fused attention's share of peak by sequence length, head dim, causal mask and kernel, as published.

Each table is a kernel's measured TFLOP/s on one GPU at sequence lengths 512 to 16K (batch x sequence = 16K
tokens, 16 heads x head dim = 2,048 wide, fp16/bf16), the FLOPs counted as the kernels' own benchmarks count
them: 4 s^2 d h per forward, halved under a causal mask, backward 2.5x forward
(flash-attention benchmarks/benchmark_flash_attention.py). Divided by the measuring GPU's dense peak they
are shares of peak; a GPU kind's calibration names the generation whose tables describe it. Between the
points the share is linear in log2(sequence) and in log2(head dim); outside them it is held at the end
point (at 16K every kernel has reached its plateau). Forward-only tables get their backward share from the
same GPU's FlashAttention-2 pair (forward and forward + backward at the same point): backward / forward rate
0.70-0.97 there, rising with the sequence. A kernel no table measures is priced as the forward of one published
kernel and the backward of another where its code says so (``COMPOSED``). Every function runs on scalars and on
numpy arrays of layouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from meshplan.core.num import Num
from meshplan.spec.cluster import AttentionKernel

SEQ_POINTS = (512, 1024, 2048, 4096, 8192, 16384)
"""Successive powers of two (the lookup relies on it)."""
_LOG_SEQ = np.log2(np.array(SEQ_POINTS, dtype=np.float64))
BACKWARD_FLOPS_RATIO = 2.5
"""Backward FLOPs of fused attention over forward: 5 matmuls against 2 (Dao 2023, FlashAttention-2 Sec. 3)."""

A100_BF16_PEAK = 312e12
H100_BF16_PEAK = 989.4e12


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelTable:
    """One kernel's published TFLOP/s on one GPU, per (head dim, causal), at ``SEQ_POINTS``."""

    generation: str
    kernel: AttentionKernel
    forward_only: bool
    """True: forward pass alone; False: forward + backward (FLOPs 3.5x the forward's)."""
    peak_flops: float
    """Dense bf16 peak of the measuring GPU."""
    tflops: dict[tuple[int, bool], tuple[float, ...]]
    source: str


_FA2_REPO = "Dao-AILab/flash-attention README and assets/ (commit 0251105a)"
TABLES = (
    KernelTable(
        generation="ampere",
        kernel=AttentionKernel.FA2,
        forward_only=False,
        peak_flops=A100_BF16_PEAK,
        tflops={
            (64, False): (132, 153, 162, 171, 175, 176),
            (128, False): (151, 173, 187, 196, 201, 203),
            (64, True): (88, 119, 140, 156, 165, 171),
            (128, True): (99, 133, 155, 173, 182, 189),
        },
        source=f"FlashAttention-2 paper (Dao 2023) Fig. 4, A100 80GB SXM4 forward + backward; {_FA2_REPO} "
        "flash2_a100_fwd_bwd_benchmark.png (head dim 128, 512, non-causal: label hidden, read from the bar)",
    ),
    KernelTable(
        generation="ampere",
        kernel=AttentionKernel.FA1,
        forward_only=False,
        peak_flops=A100_BF16_PEAK,
        tflops={
            (64, False): (91, 92, 104, 108, 110, 110),
            (128, False): (76, 72, 76, 80, 82, 83),
            (64, True): (58, 70, 77, 87, 92, 97),
            (128, True): (55, 62, 69, 76, 80, 83),
        },
        source=f"FlashAttention-2 paper (Dao 2023) Fig. 4, 'FlashAttention' bars, A100 80GB SXM4 forward + backward; "
        f"{_FA2_REPO} flash2_a100_fwd_bwd_benchmark.png",
    ),
    KernelTable(
        generation="hopper",
        kernel=AttentionKernel.FA1,
        forward_only=False,
        peak_flops=H100_BF16_PEAK,
        tflops={
            (64, False): (157, 159, 161, 161, 166, 168),
            (128, False): (127, 127, 128, 131, 137, 139),
            (64, True): (104, 123, 136, 138, 149, 156),
            (128, True): (98, 109, 108, 126, 135, 137),
        },
        source=f"FlashAttention-2 paper (Dao 2023) Fig. 7, 'FlashAttention' bars, H100 80GB SXM5 forward + backward; "
        f"{_FA2_REPO} flash2_h100_fwd_bwd_benchmark.png",
    ),
    KernelTable(
        generation="hopper",
        kernel=AttentionKernel.FA2,
        forward_only=False,
        peak_flops=H100_BF16_PEAK,
        tflops={
            (64, False): (215, 254, 274, 288, 294, 296),
            (128, False): (248, 294, 320, 326, 335, 338),
            (64, True): (141, 192, 232, 257, 273, 284),
            (128, True): (163, 221, 265, 294, 308, 328),
        },
        source=f"FlashAttention-2 paper (Dao 2023) Fig. 7, H100 80GB SXM5 forward + backward; {_FA2_REPO} "
        "flash2_h100_fwd_bwd_benchmark.png",
    ),
    KernelTable(
        generation="hopper",
        kernel=AttentionKernel.FA2,
        forward_only=True,
        peak_flops=H100_BF16_PEAK,
        tflops={
            (64, False): (282, 306, 318, 321, 322, 324),
            (128, False): (309, 350, 362, 368, 370, 370),
            (256, False): (275, 313, 321, 323, 324, 326),
            (64, True): (180, 229, 262, 284, 295, 299),
            (128, True): (191, 260, 298, 319, 333, 335),
            (256, True): (208, 251, 278, 293, 297, 298),
        },
        source=f"FlashAttention-3 paper (Shah et al. 2024) Fig. 5, H100 80GB SXM5 forward, fp16; {_FA2_REPO} "
        "flash3_fp16_fwd.png",
    ),
    KernelTable(
        generation="hopper",
        kernel=AttentionKernel.CUDNN,
        forward_only=True,
        peak_flops=H100_BF16_PEAK,
        tflops={
            (64, False): (335, 373, 395, 408, 412, 413),
            (128, False): (497, 574, 617, 609, 600, 595),
            (256, False): (470, 546, 580, 581, 580, 581),
            (64, True): (225, 288, 334, 363, 379, 388),
            (128, True): (315, 410, 484, 518, 529, 539),
            (256, True): (308, 391, 450, 483, 497, 509),
        },
        source=f"FlashAttention-3 paper (Shah et al. 2024) Fig. 5 (cuDNN 9), H100 80GB SXM5 forward, fp16; "
        f"{_FA2_REPO} flash3_fp16_fwd.png",
    ),
    KernelTable(
        generation="hopper",
        kernel=AttentionKernel.FA3,
        forward_only=True,
        peak_flops=H100_BF16_PEAK,
        tflops={
            (64, False): (333, 392, 460, 476, 496, 497),
            (128, False): (467, 565, 625, 638, 646, 648),
            (256, False): (482, 620, 707, 736, 746, 756),
            (64, True): (197, 265, 371, 420, 460, 473),
            (128, True): (292, 423, 521, 579, 602, 616),
            (256, True): (286, 427, 537, 612, 628, 642),
        },
        source=f"FlashAttention-3 paper (Shah et al. 2024) Fig. 5, H100 80GB SXM5 forward, fp16; {_FA2_REPO} "
        "flash3_fp16_fwd.png (head dim 256, 1K, non-causal: label hidden, read from the bar)",
    ),
)


def _table(generation: str, kernel: AttentionKernel, *, forward_only: bool) -> KernelTable | None:
    for t in TABLES:
        if t.generation == generation and t.kernel is kernel and t.forward_only == forward_only:
            return t
    return None


COMPOSED = {AttentionKernel.FA_TRITON: (AttentionKernel.FA2, AttentionKernel.FA1)}
"""Kernels with no published table of their own, priced as (forward of one kernel, backward of another) on the
same GPU generation. flash-attn's Triton kernel (flash_attn/flash_attn_triton.py at eff9fe6b, which llm-foundry
copied and ran on triton-pre-mlir as attn_impl: triton in 2023): its forward runs one program per query block
looping over the key blocks and writes the output once, FlashAttention-2's loop order (FlashAttention 1's CUDA
forward loops over queries inside each key block and rewrites the output every step: Dao et al. 2022, Alg. 1);
its docstring: 'Triton forward is generally faster than CUDA forward, while Triton backward is generally slower
than CUDA backward' (CUDA: FlashAttention 1). So FlashAttention-2's forward and FlashAttention 1's backward (for
the backward an upper bound): at 16K, head dim 128, causal, 98 TFLOP/s forward + backward on A100 against
FlashAttention 1's 83, as llm-foundry's TUTORIAL.md (Aug. 2023) has it: 'triton is slightly faster than flash'
(flash-attn 1.0.3). FlashAttention-2 Fig. 4's 'FlashAttention Triton' bars measure OpenAI's
triton.ops kernel (benchmarks/benchmark_flash_attention.py), a different implementation."""


def has_table(generation: str, kernel: AttentionKernel) -> bool:
    """Whether published tables describe ``kernel`` on ``generation`` (both parts of a composed one)."""
    if kernel in COMPOSED:
        return all(has_table(generation, k) for k in COMPOSED[kernel])
    return any(t.generation == generation and t.kernel is kernel for t in TABLES)


def _share(table: KernelTable, *, log_seq: Num, head_dim: float, causal: bool) -> Num:
    """The table's share of peak at ``log_seq`` (log2 of the clipped sequence), interpolated over head dims."""
    dims = sorted(d for d, c in table.tflops if c == causal)
    lo = max([d for d in dims if d <= head_dim], default=dims[0])
    hi = min([d for d in dims if d >= head_dim], default=dims[-1])
    y_lo = np.interp(log_seq, _LOG_SEQ, np.array(table.tflops[(lo, causal)]) * 1e12 / table.peak_flops)
    if hi == lo:
        return y_lo
    y_hi = np.interp(log_seq, _LOG_SEQ, np.array(table.tflops[(hi, causal)]) * 1e12 / table.peak_flops)
    w = (np.log2(head_dim) - np.log2(lo)) / (np.log2(hi) - np.log2(lo))
    return (1 - w) * y_lo + w * y_hi


def _backward_over_forward(*, log_seq: Num, head_dim: float, causal: bool) -> Num:
    """FlashAttention-2's backward rate over its forward rate on H100 (the one GPU with both published)."""
    fwd_bwd = _table("hopper", AttentionKernel.FA2, forward_only=False)
    fwd = _table("hopper", AttentionKernel.FA2, forward_only=True)
    assert fwd_bwd is not None and fwd is not None
    both = _share(fwd_bwd, log_seq=log_seq, head_dim=head_dim, causal=causal)
    alone = _share(fwd, log_seq=log_seq, head_dim=head_dim, causal=causal)
    backward = BACKWARD_FLOPS_RATIO / ((1 + BACKWARD_FLOPS_RATIO) / both - 1 / alone)
    return backward / alone


@cache
def _curve(generation: str, kernel: AttentionKernel, head_dim: float, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) shares of peak at ``SEQ_POINTS`` for one kernel, head dim and mask."""
    if not has_table(generation, kernel):
        known = sorted({f"{t.generation}/{t.kernel.value}" for t in TABLES})
        raise ValueError(f"no published attention table for {generation}/{kernel.value} (known: {', '.join(known)})")
    if kernel in COMPOSED:
        forward_kernel, backward_kernel = COMPOSED[kernel]
        fwd_of = _curve(generation, forward_kernel, head_dim, causal)[0]
        return fwd_of, _curve(generation, backward_kernel, head_dim, causal)[1]
    ratio = _backward_over_forward(log_seq=_LOG_SEQ, head_dim=head_dim, causal=causal)
    fwd_table = _table(generation, kernel, forward_only=True)
    if fwd_table is not None:
        fwd = _share(fwd_table, log_seq=_LOG_SEQ, head_dim=head_dim, causal=causal)
    else:  # forward + backward only (A100): split it with the backward / forward ratio
        both_table = _table(generation, kernel, forward_only=False)
        assert both_table is not None
        both = _share(both_table, log_seq=_LOG_SEQ, head_dim=head_dim, causal=causal)
        fwd = both * (1 + BACKWARD_FLOPS_RATIO / ratio) / (1 + BACKWARD_FLOPS_RATIO)
    return fwd, ratio * fwd


def attention_shares(
    *, seq_len: Num, head_dim: float, causal: bool, kernel: AttentionKernel, generation: str
) -> tuple[Num, Num]:
    """(forward, backward) share of dense peak of ``kernel`` on a GPU of ``generation``.

    ``seq_len``: the length of the kernel's key blocks (a scalar or an array of layouts); between the
    published points the shares are linear in log2 of it, beyond them held at the end points.
    """
    fwd, bwd = _curve(generation, kernel, float(head_dim), causal)
    # the points are successive powers of two: the segment is the integer part of log2 (np.interp is 20x slower
    # on a search's million layouts)
    x = np.log2(np.clip(seq_len, SEQ_POINTS[0], SEQ_POINTS[-1])) - _LOG_SEQ[0]
    i = np.minimum(np.floor(x).astype(np.int64), len(SEQ_POINTS) - 2)
    w = x - i
    return _scalar(fwd[i] + w * (fwd[i + 1] - fwd[i])), _scalar(bwd[i] + w * (bwd[i + 1] - bwd[i]))


def _scalar(x: Num) -> Num:
    return float(x) if np.ndim(x) == 0 else x
