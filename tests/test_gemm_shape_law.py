"""The GEMM shape law (core/compute.py): a GEMM's efficiency falls with a short K or a narrow N, in units of the
GPU kind's ridge point, re-derived here from the peak and the bandwidth of the catalog."""

from __future__ import annotations

import pytest

from meshplan import io
from meshplan.core.compute import gemm_time
from meshplan.core.flops import Gemm
from meshplan.units import DType


def _time(gpu: str, m: int, n: int, k: int, dtype: DType = DType.BF16) -> float:
    g = io.load_gpu(gpu)
    gemm = Gemm(name="x", m=m, n=n, k=k)
    peak = g.peak(dtype)
    return float(gemm_time(gemm, peak_flops=peak, hbm_bytes_per_s=g.hbm_bandwidth_bytes_per_s, cal=g.calibration,
                           act_bytes=2.0))  # fmt: skip


def _law(gpu: str, n: int, k: int, dtype: DType = DType.BF16) -> float:
    """1 + 0.63 R/K + 0.23 R/N with R = peak / HBM bandwidth, written out again."""
    g = io.load_gpu(gpu)
    ridge = g.peak(dtype) / g.hbm_bandwidth_bytes_per_s
    return 1 + 0.63 * ridge / k + 0.23 * ridge / n


@pytest.mark.parametrize("gpu", ["h100-sxm", "a100-80gb", "b200"])
@pytest.mark.parametrize(("n", "k"), [(2048, 2048), (896, 7168), (7168, 896), (768, 3072)])
def test_narrow_gemms_take_the_law_over_a_wide_one(gpu: str, n: int, k: int) -> None:
    m = 16384
    wide = _time(gpu, m, 16384, 16384) / (2 * m * 16384 * 16384)  # seconds per FLOP
    narrow = _time(gpu, m, n, k) / (2 * m * n * k)
    assert narrow / wide == pytest.approx(_law(gpu, n, k) / _law(gpu, 16384, 16384), rel=1e-9)


def test_the_law_is_openxla_s_h100_fit_and_scales_with_the_ridge() -> None:
    """On H100 bf16 the law is T = T_max / (1 + 186/K + 69/N) (OpenXLA's sweep); A100's lower ridge loses less at
    the same shape, FP8's doubled one more."""
    g = io.load_gpu("h100-sxm")
    ridge = g.peak(DType.BF16) / g.hbm_bandwidth_bytes_per_s
    assert 0.63 * ridge == pytest.approx(186, rel=0.01) and 0.23 * ridge == pytest.approx(69, rel=0.02)
    assert _law("a100-80gb", 2048, 2048) < _law("h100-sxm", 2048, 2048) < _law("h100-sxm", 2048, 2048, DType.FP8)
    assert 1 / _law("h100-sxm", 2048, 2048) == pytest.approx(0.889, abs=0.005)
