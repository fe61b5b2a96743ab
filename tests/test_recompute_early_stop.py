"""Full recompute under PyTorch's non-reentrant checkpoint with early stop (``--recompute-early-stop``), derived
by hand for MPT-7B (32 layers, hidden 4,096, MLP 16,384, GELU): the re-forward stops once the down projection's
inputs are saved, so that matmul, a third of the block's linear FLOPs, is not repeated; nothing else changes."""

from __future__ import annotations

import pytest

from meshplan import io
from meshplan.core.plan import evaluate
from meshplan.core.time.flops import Gemm
from meshplan.core.time.gemm import gemm_time
from meshplan.reports.inputs import resolve_cluster
from meshplan.spec.conditions import Conditions
from meshplan.spec.layout import Layout, Recompute, ZeroStage
from meshplan.spec.workload import Framework, Workload
from meshplan.units import DType

MPT_7B = io.load_model("mpt-7b")
SEQ, MICRO, GPUS = 2048, 4, 8


def _step(early_stop: bool, recompute: Recompute):  # type: ignore[no-untyped-def]
    work = Workload(
        seq_len=SEQ,
        global_batch=2 * MICRO * GPUS,
        framework=Framework.TORCH,
        conditions=Conditions(recompute_early_stop=early_stop),
    )
    layout = Layout(dp_shard=GPUS, zero=ZeroStage.PARAMETERS, micro_batch=MICRO, recompute=recompute)
    return evaluate(MPT_7B, resolve_cluster(gpu="a100-80gb", gpus=GPUS), layout, work).step


def test_the_down_projection_is_not_recomputed() -> None:
    """Two micro-batches of 8,192 tokens, 32 layers: the saving is 64 down projections (8,192 x 4,096 x 16,384)
    at the A100's matmul roofline, and the hardware FLOPs lose 2 x 4,096 x 16,384 x 32 per token."""
    g = io.load_gpu("a100-80gb")
    down = Gemm(name="mlp_down", m=SEQ * MICRO, n=4096, k=16384)
    one = gemm_time(
        down, peak_flops=g.peak(DType.BF16), hbm_bytes_per_s=g.hbm_bandwidth_bytes_per_s, cal=g.calibration, act_bytes=2
    )
    full, stopped = _step(False, Recompute.FULL), _step(True, Recompute.FULL)
    assert float(full.compute_s - stopped.compute_s) == pytest.approx(2 * 32 * float(one), rel=1e-9)
    tokens = SEQ * MICRO * GPUS * 2
    saved_flops = 2 * 4096 * 16384 * 32 * tokens
    assert float(full.hardware_flops_per_step - stopped.hardware_flops_per_step) == pytest.approx(saved_flops)
    # a third of the block's linear FLOPs: 4 of 12 h^2 per token (QKV 3, output 1, up 4, down 4)
    assert saved_flops == pytest.approx(tokens * 32 * 2 * 12 * 4096**2 / 3)


@pytest.mark.parametrize("recompute", [Recompute.NONE, Recompute.SELECTIVE])
def test_no_effect_without_full_recompute(recompute: Recompute) -> None:
    a, b = _step(False, recompute), _step(True, recompute)
    assert float(a.step_time_s) == float(b.step_time_s)
    assert float(a.hardware_flops_per_step) == float(b.hardware_flops_per_step)


def test_stacks_that_use_it() -> None:
    """Composer's activation checkpointing in the llm-foundry benchmark yamls is non-reentrant
    (activation_checkpointing_reentrant: false); Megatron's is its own reentrant checkpoint."""
    assert io.load_stack("llm-foundry").defaults["recompute_early_stop"] == "on"
    assert "recompute_early_stop" not in io.load_stack("megatron-core").defaults
