"""Plans an engine cannot express are refused with one line naming the gap and the closest plan."""

from __future__ import annotations

from dataclasses import replace

import pytest
from export_cases import LLAMA2_7B, LLAMA_8B, LLAMA_70B, QWEN3_30B_A3B

from meshplan.exports import (
    Engine,
    ServingPlan,
    UnsupportedByEngine,
    export_deepspeed,
    export_megatron,
    export_sglang,
    export_torchtitan,
    export_vllm,
)
from meshplan.spec.conditions import Conditions, EpDispatch
from meshplan.spec.layout import ContextParallel, Layout, Recompute, Schedule, ZeroStage
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import PRECISIONS, Optimizer, OptimizerKind, Workload
from meshplan.units import DType

WORKLOAD = Workload(seq_len=4096, global_batch=64)


def refusal(call: object, *args: object, **kwargs: object) -> UnsupportedByEngine:
    assert callable(call)
    with pytest.raises(UnsupportedByEngine) as info:
        call(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message and "; closest: " in message
    assert isinstance(info.value, ValueError)
    return info.value


@pytest.mark.parametrize(
    ("layout", "missing", "closest"),
    [
        (Layout(dp_shard=8, zero=ZeroStage.OPTIMIZER), "ZeRO-1", 'zero=2 (fsdp_reshard_after_forward="never")'),
        (
            Layout(pp=4, dp_shard=2, zero=ZeroStage.PARAMETERS, schedule=Schedule.ZERO_BUBBLE),
            "zero_bubble",
            "schedule=1f1b",
        ),
        (Layout(pp=4, dp_shard=2, zero=ZeroStage.PARAMETERS, schedule=Schedule.DUALPIPE), "dualpipe", "schedule=1f1b"),
        (
            Layout(cp=4, dp_shard=2, zero=ZeroStage.PARAMETERS, cp_kind=ContextParallel.RING),
            "ring",
            "cp_kind=all-gather",
        ),
    ],
)
def test_torchtitan_refusals(layout: Layout, missing: str, closest: str) -> None:
    error = refusal(export_torchtitan, LLAMA_8B, layout, WORKLOAD)
    assert error.engine is Engine.TORCHTITAN and missing in error.missing and error.closest == closest


def test_torchtitan_refuses_unregistered_models_and_fp16() -> None:
    odd = ModelSpec(
        name="odd",
        num_layers=30,
        hidden=3000,
        num_heads=24,
        num_kv_heads=8,
        head_dim=125,
        ffn_hidden=8000,
        vocab_size=32000,
    )
    assert "registers no such model" in str(refusal(export_torchtitan, odd, Layout(), WORKLOAD))
    fp16 = Workload(seq_len=4096, global_batch=64, precision=PRECISIONS["fp16"])
    assert refusal(export_torchtitan, LLAMA_8B, Layout(), fp16).closest == "precision bf16"


def test_torchtitan_expert_groups_come_from_dp_shard_cp_tp() -> None:
    # ep=4 divides dp_replicate*dp_shard*cp = 4*2 (meshplan's rule) but not dp_shard*cp*tp = 2.
    layout = Layout(dp_replicate=4, dp_shard=2, zero=ZeroStage.PARAMETERS, ep=4)
    assert "dp_shard*cp*tp = 2" in str(refusal(export_torchtitan, QWEN3_30B_A3B, layout, WORKLOAD))


def test_expert_parallel_needs_experts() -> None:
    layout = Layout(dp_shard=8, ep=8, zero=ZeroStage.PARAMETERS)
    for export in (export_torchtitan, export_megatron, export_deepspeed):
        assert refusal(export, LLAMA_8B, layout, WORKLOAD).closest == "ep=1"


@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ZERO_BUBBLE, Schedule.DUALPIPE])
def test_megatron_runs_only_1f1b_schedules(schedule: Schedule) -> None:
    layout = Layout(tp=8, pp=4, schedule=schedule)
    error = refusal(export_megatron, LLAMA_70B, layout, WORKLOAD)
    assert schedule.name.lower() in error.missing and error.closest.startswith("schedule=1f1b")


def test_megatron_refuses_adafactor() -> None:
    workload = Workload(seq_len=4096, global_batch=64, optimizer=Optimizer(kind=OptimizerKind.ADAFACTOR))
    assert refusal(export_megatron, LLAMA_8B, Layout(), workload).closest == "optimizer=adamw (--optimizer adam)"


@pytest.mark.parametrize(
    ("layout", "closest"),
    [
        (Layout(tp=8, pp=4), "pp=1"),
        (Layout(cp=2, dp_shard=4, zero=ZeroStage.PARAMETERS), "cp=1"),
        (Layout(tp=2, sp=True, dp_shard=4, zero=ZeroStage.GRADIENTS), "sp=False"),
        (Layout(dp_shard=8, dp_replicate=4, zero=ZeroStage.PARAMETERS), "dp_shard=32, dp_replicate=1"),
        (Layout(dp_shard=8, zero=ZeroStage.PARAMETERS, recompute=Recompute.SELECTIVE), "recompute=full"),
    ],
)
def test_deepspeed_refusals(layout: Layout, closest: str) -> None:
    assert refusal(export_deepspeed, LLAMA2_7B, layout, WORKLOAD).closest == closest


def test_deepspeed_refuses_fp8_matmuls() -> None:
    fp8 = Workload(seq_len=4096, global_batch=64, precision=PRECISIONS["fp8"])
    assert refusal(export_deepspeed, LLAMA2_7B, Layout(dp_shard=8, zero=ZeroStage.PARAMETERS), fp8).closest == (
        "precision bf16"
    )


SERVING = ServingPlan(model_path="m", max_model_len=8192, gpu_memory_utilization=0.9, max_num_seqs=64)


def test_vllm_expert_parallel_spans_tp_times_dp() -> None:
    error = refusal(export_vllm, replace(SERVING, tp=4, dp=2, ep=4))
    assert error.closest == "ep=8 or ep=1"
    assert refusal(export_vllm, replace(SERVING, tp=8, kv_cache_dtype=DType.INT4)).engine is Engine.VLLM
    assert "'nf4'" in refusal(export_vllm, replace(SERVING, quantization="nf4")).missing


def test_sglang_expert_parallel_divides_tp() -> None:
    assert refusal(export_sglang, replace(SERVING, tp=4, ep=8)).closest == "ep=4"
    assert refusal(export_sglang, replace(SERVING, kv_cache_dtype=DType.FP16)).closest == "kv_cache_dtype bf16 or fp8"


def test_user_errors_are_plain_value_errors() -> None:
    with pytest.raises(ValueError, match="global_batch=60 is not a multiple of micro_batch \\* dp = 1 \\* 8"):
        export_megatron(LLAMA_8B, Layout(dp_replicate=8), Workload(seq_len=4096, global_batch=60))
    with pytest.raises(ValueError, match="gpu_memory_utilization must be in"):
        replace(SERVING, gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="max_num_seqs must be a positive integer, got True"):
        replace(SERVING, max_num_seqs=True)
    with pytest.raises(ValueError, match="do not fill whole nodes"):
        export_megatron(LLAMA_8B, Layout(dp_replicate=12), Workload(seq_len=4096, global_batch=48))


def test_deepep_dispatch_exports_as_megatrons_flex_dispatcher_and_is_refused_elsewhere() -> None:
    layout = Layout(dp_shard=8, ep=8, zero=ZeroStage.PARAMETERS)
    deepep = replace(WORKLOAD, conditions=Conditions(ep_dispatch=EpDispatch.DEEPEP))

    def dispatcher(workload: Workload) -> str:
        words = export_megatron(QWEN3_30B_A3B, Layout(ep=8, dp_replicate=8), workload).command.split()
        return words[words.index("--moe-token-dispatcher-type") + 1]

    assert (dispatcher(WORKLOAD), dispatcher(deepep)) == ("alltoall", "flex")
    for export in (export_torchtitan, export_deepspeed):
        error = refusal(export, QWEN3_30B_A3B, layout, deepep)
        assert "DeepEP" in error.missing and error.closest == "ep_dispatch alltoall"
    export_torchtitan(LLAMA_8B, Layout(dp_shard=8, zero=ZeroStage.PARAMETERS), deepep)  # a dense model: nothing
