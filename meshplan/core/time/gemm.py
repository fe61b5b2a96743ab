"""A matmul's time on one GPU: the larger of its FLOPs at the GPU kind's achievable matmul rate, shaped by its
depth and how many SMs its tiles fill, and its operands' bytes at HBM speed (the roofline every layer's GEMMs
take; compute.py adds the layer's other kernels)."""

from __future__ import annotations

import numpy as np

from meshplan.core.num import Num, maximum, minimum
from meshplan.core.time.flops import Gemm
from meshplan.spec.cluster import GpuCalibration

MATMUL_TILE_M, MATMUL_TILE_N = 256, 128
"""Output tile of cuBLAS's large bf16 kernels on Ampere and Hopper (CUTLASS's 256 x 128 x 64 threadblock): one
tile per SM at a time. With it, cuBLAS's m = n = k sweep on A100 (NVIDIA, 'CUDA 11 Features Revealed' Fig. 6:
88 of 290 TFLOP/s at 1,024, 150 at 1,536) is the 32 tiles of a 1,024 square on 108 SMs (0.30)."""
SPLIT_K_DEPTH = 1024
"""K depth per split when cuBLAS splits K to fill idle SMs (an assumption: 16 main-loop steps of 64)."""


MATMUL_K_RIDGES = 0.63
MATMUL_N_RIDGES = 0.23
"""A GEMM's efficiency falls as 1 / (1 + a R / K + b R / N), R the GPU's ridge point (peak FLOP/s over HBM bytes/s
at the GEMM's dtype): each output tile's epilogue and operand loads cost about R / K of its main loop. From
OpenXLA's measured H100 bf16 sweep at 16,384 rows, T = 800 / (1 + 186 / K + 69 / N) TFLOP/s with R = 295:
a = 186 / 295, b = 69 / 295. Against the sweep's shares of its plateau at N = K (95% at 2,048, 84% at 1,024, 55% at
512) the law gives 89%, 80% and 67%: within 6 points from 1,024 up, 12 points high at 512."""


def depth(g: Gemm, *, ridge: float) -> Num:
    """How many times longer than on the plateau a GEMM of ``g``'s K and N runs: 1 + a R / K + b R / N."""
    return 1 + MATMUL_K_RIDGES * ridge / g.k + MATMUL_N_RIDGES * ridge / g.n


def mean_depth(gemms: list[Gemm], *, ridge: float) -> float:
    """``depth`` over several GEMMs, weighted by their FLOPs (what their summed FLOPs take at one efficiency)."""
    flops = sum(float(g.flops) for g in gemms)
    return sum(float(g.flops * depth(g, ridge=ridge)) for g in gemms) / flops if flops else 1.0


def fill_share(g: Gemm, *, sm_count: int) -> Num:
    """Share of the GPU's SMs a GEMM's output tiles (times its K splits) keep busy: 1 for training GEMMs, below
    it for small ones (short sequences at high TP, decode-sized batches)."""
    tiles = np.maximum(np.ceil(g.m / MATMUL_TILE_M) * np.ceil(g.n / MATMUL_TILE_N) * g.count, 1.0)
    splits = np.clip(np.floor(g.k / SPLIT_K_DEPTH), 1, np.ceil(sm_count / tiles))
    return minimum(tiles * splits / sm_count, 1.0)


def gemm_time(
    g: Gemm, *, peak_flops: float, hbm_bytes_per_s: float, cal: GpuCalibration, act_bytes: float, fp8: bool = False
) -> Num:
    """Roofline time of ``g`` with the shape-dependent efficiency of the GPU kind (FP8: its FP8 share)."""
    d = cal.matmul_half_dim
    shape = (g.m / (g.m + d)) / depth(g, ridge=peak_flops / hbm_bytes_per_s) * fill_share(g, sm_count=cal.sm_count)
    e_max = cal.matmul_efficiency_max * (cal.fp8_matmul_ratio if fp8 else 1.0)
    compute = g.flops / (peak_flops * e_max * shape)
    traffic = act_bytes * (g.m * g.k + g.k * g.n + g.m * g.n) * g.count / (hbm_bytes_per_s * cal.hbm_efficiency)
    return maximum(compute, traffic)
