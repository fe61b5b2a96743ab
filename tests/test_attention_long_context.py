"""Long-context attention: the kernel each stack runs, and the kernels' rate past the tables' last point (16K).

- Past 16K the shares are held at 16K. NVIDIA's cuDNN-frontend benchmark (benchmark/benchmark_results.csv at
  b740542, May 2024: H200 SXM at 700 W, cuDNN 9.1, PyTorch SDPA's flash backend, head dim 128, causal, batch x
  sequence = 16K-64K tokens) measured both kernels to 64K: the held plateau is compared with it here.
- ``flash`` resolves to what the stack runs: PyTorch SDPA's flash backend (FlashAttention-2) under every
  PyTorch-native stack, compiled or not; Transformer Engine's choice (cuDNN on Hopper, FlashAttention-2 on Ampere)
  under Megatron-Core and NeMo. The Llama 3 405B recipes name FlashAttention-2.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from meshplan import io
from meshplan.cli import main
from meshplan.core.time.attention_kernels import BACKWARD_FLOPS_RATIO, H100_BF16_PEAK, attention_shares
from meshplan.core.time.compute import attention_kernel
from meshplan.spec.cluster import AttentionKernel
from meshplan.spec.workload import Attention, Kernels

H200_LONG = {
    # kernel: {sequence: (forward, backward, forward + backward) TFLOP/s}, causal, head dim 128
    AttentionKernel.FA2: {
        16384: (327.17, 305.19, 311.17),
        32768: (345.64, 316.92, 324.62),
        65536: (338.85, 323.98, 328.09),
    },
    AttentionKernel.CUDNN: {
        16384: (649.99, 488.56, 525.88),
        32768: (636.08, 504.14, 535.90),
        65536: (631.20, 508.07, 538.06),
    },
}
"""The cuDNN-frontend benchmark's H200 rows (the H200's dense bf16 peak is the H100 SXM's, 989.4 TFLOP/s)."""


def _fwd_bwd_tflops(kernel: AttentionKernel, seq: int) -> float:
    """The model's forward + backward rate, counted as the benchmark counts it: backward 2.5x the forward's FLOPs."""
    fwd, bwd = attention_shares(seq_len=seq, head_dim=128, causal=True, kernel=kernel, generation="hopper")
    return (1 + BACKWARD_FLOPS_RATIO) / (1 / fwd + BACKWARD_FLOPS_RATIO / bwd) * H100_BF16_PEAK / 1e12


@pytest.mark.parametrize("kernel", list(H200_LONG))
def test_the_plateau_past_16k_is_the_published_long_sequence_rate(kernel: AttentionKernel) -> None:
    """Published forward + backward rates are re-derived from the benchmark's own forward and backward rates, then
    held against the model: within 6% at 16K (two different benchmarks), within 3% at 32K and 64K, where the model
    extrapolates; the published rate moves less than 6% from 16K to 64K, so holding it flat is no guess."""
    published = H200_LONG[kernel]
    for seq, (fwd, bwd, both) in published.items():
        assert (1 + BACKWARD_FLOPS_RATIO) / (1 / fwd + BACKWARD_FLOPS_RATIO / bwd) == pytest.approx(both, rel=2e-3)
        assert _fwd_bwd_tflops(kernel, seq) == pytest.approx(both, rel=0.06 if seq == 16384 else 0.03)
    assert published[65536][2] / published[16384][2] == pytest.approx(1.0, abs=0.06)
    assert _fwd_bwd_tflops(kernel, 65536) == _fwd_bwd_tflops(kernel, 131072) == _fwd_bwd_tflops(kernel, 16384)


def test_flash_under_pytorch_is_sdpas_flash_backend_compiled_or_not() -> None:
    h100 = io.load_gpu("h100-sxm").calibration
    a100 = io.load_gpu("a100-80gb").calibration
    assert attention_kernel(Attention.FLASH, Kernels.FUSED, h100, sdpa=True) is AttentionKernel.FA2
    assert attention_kernel(Attention.FLASH, Kernels.EAGER, h100, sdpa=True) is AttentionKernel.FA2
    assert attention_kernel(Attention.FLASH, Kernels.FUSED, h100) is AttentionKernel.CUDNN
    assert attention_kernel(Attention.FLASH, Kernels.FUSED, a100) is AttentionKernel.FA2
    assert attention_kernel(Attention.CUDNN, Kernels.FUSED, h100, sdpa=True) is AttentionKernel.CUDNN


def _estimate(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    base = ["estimate", "llama-3.1-8b", "--gpus", "8", "--seq", "8192", "--global-batch", "8"]
    assert main([*base, *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("stack", "gpu", "kernels", "expected"),
    [
        ("megatron-core", "h100-sxm", None, "cudnn"),
        ("megatron-core", "a100-80gb", None, "fa2"),
        ("nemo", "h100-sxm", None, "cudnn"),
        ("torchtitan", "h100-sxm", None, "fa2"),
        ("torchtitan", "h100-sxm", "fused", "fa2"),
        ("fsdp2", "h100-sxm", "fused", "fa2"),
        ("llm-foundry", "h100-sxm", None, "fa2"),
        ("deepspeed", "h100-sxm", "fused", "fa2"),
    ],
)
def test_each_stack_runs_its_own_kernel_by_default(
    capsys: pytest.CaptureFixture[str], stack: str, gpu: str, kernels: str | None, expected: str
) -> None:
    """Transformer Engine prefers cuDNN's fused attention on Hopper; PyTorch SDPA picks its flash backend (the
    stacks as the catalog describes them: torchtitan of its 2024 tables, PyTorch through 2.10)."""
    argv = ["--stack", stack, "--gpu", gpu, *(["--kernels", kernels] if kernels else [])]
    assert _estimate(capsys, *argv)["attention_kernel"] == expected
    if kernels == "fused":  # a compiled PyTorch stack: naming flash changes nothing
        assert _estimate(capsys, *argv, "--attention", "flash")["attention_kernel"] == expected


@pytest.mark.parametrize("recipe", ["llama3-405b-8k", "llama3-405b-128k"])
def test_the_llama_3_recipes_run_flashattention_2(capsys: pytest.CaptureFixture[str], recipe: str) -> None:
    assert main(["recipe", recipe, "--no-rank", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["attention_kernel"] == "fa2"


def test_all_gathered_kv_is_gathered_again_in_backward(capsys: pytest.CaptureFixture[str]) -> None:
    """Llama 3's 128K stage (CP 16, K/V all-gathered): forward gathers K/V, backward gathers them again from the
    local blocks it kept and reduce-scatters their gradients (Transformer Engine's AttnFuncWithCPAndKVAllGather),
    three calls of the whole sequence's K/V a layer, none hidden."""
    assert main(["recipe", "llama3-405b-128k", "--no-rank", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    cp = [c for c in report["collectives"] if c["strategy"] == "cp"]
    assert sorted((c["op"], c["phase"]) for c in cp) == [
        ("all_gather", "backward"),
        ("all_gather", "forward"),
        ("reduce_scatter", "backward"),
    ]
    seq, kv_heads, head_dim, tp, bf16 = 131072, 8, 128, 8, 2
    kv_bytes = seq * 2 * kv_heads * head_dim / tp * bf16  # K and V of the whole sequence, this rank's heads
    assert kv_bytes == 67_108_864
    for c in cp:
        assert c["size_bytes_per_call"] == kv_bytes and c["group_size"] == 16
        assert c["count_per_step"] == cp[0]["count_per_step"] > 0  # once a layer and micro-batch, no recompute
        assert c["exposed_s_per_step"] == c["time_s_per_step"] > 0
    assert report["breakdown"]["exposed_cp_s"] == pytest.approx(sum(c["time_s_per_step"] for c in cp))
