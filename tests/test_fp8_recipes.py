"""FP8 recipes (--fp8-recipe) and FSDP's FP8 all-gather (--fp8-all-gather): the gathered parameters and the
all-gather bytes, derived by hand."""

from __future__ import annotations

import pytest

from meshplan import io
from meshplan.core.plan import evaluate
from meshplan.reports.inputs import resolve_cluster
from meshplan.spec.conditions import Conditions, Fp8Recipe
from meshplan.spec.layout import Layout, ZeroStage
from meshplan.spec.workload import PRECISIONS, Framework, Workload

LLAMA_8B = io.load_model("llama-3.1-8b")
LAYER = 4096 * (4096 + 2 * 1024) + 4096**2 + 3 * 4096 * 14336 + 2 * 4096  # 218,112,000 parameters
FSDP8 = Layout(zero=ZeroStage.PARAMETERS, dp_shard=8)
TENSORWISE = Conditions(fp8_recipe=Fp8Recipe.TENSORWISE)
GATHER_FP8 = Conditions(fp8_recipe=Fp8Recipe.TENSORWISE, fp8_all_gather=True)


def _plan(conditions: Conditions, framework: Framework = Framework.MEGATRON):  # type: ignore[no-untyped-def]
    work = Workload(
        seq_len=4096, global_batch=8, precision=PRECISIONS["fp8"], conditions=conditions, framework=framework
    )
    return evaluate(LLAMA_8B, resolve_cluster(gpu="h100-sxm", gpus=8), FSDP8, work)


def test_gathered_layers_in_fp8() -> None:
    """ZeRO-3 holds the current and the prefetched layer gathered and one layer's unsharded bf16 gradients:
    P_layer (2 x 2 + 2) bytes in bf16, P_layer (2 x 1 + 2) with the weights gathered in FP8."""
    bf16 = _plan(TENSORWISE).memory.per_gpu.comm_buffers_bytes
    fp8 = _plan(GATHER_FP8).memory.per_gpu.comm_buffers_bytes
    assert bf16 == pytest.approx(LAYER * (2 * 2 + 2), rel=1e-12)
    assert fp8 == pytest.approx(LAYER * (2 * 1 + 2), rel=1e-12)


def _all_gathers(plan) -> list[float]:  # type: ignore[no-untyped-def]
    return [
        float(c.size_bytes)
        for c in plan.collectives
        if c.strategy == "dp" and c.op.name == "ALL_GATHER" and c.phase == "forward"
    ]


def test_all_gather_bytes_halved() -> None:
    """The layers' ZeRO-3 all-gathers carry 1 byte a parameter instead of 2; under FSDP2 the root unit (the
    embedding and the output head, which torchao leaves in bf16) does not change."""
    bf16, fp8 = _all_gathers(_plan(TENSORWISE)), _all_gathers(_plan(GATHER_FP8))
    assert fp8 == pytest.approx([b / 2 for b in bf16], rel=1e-12)
    torch_bf16 = _all_gathers(_plan(TENSORWISE, Framework.TORCH))
    torch_fp8 = _all_gathers(_plan(GATHER_FP8, Framework.TORCH))
    assert torch_fp8[0] == pytest.approx(torch_bf16[0], rel=1e-12)  # root: embedding, norm, head
    assert torch_fp8[1:] == pytest.approx([b / 2 for b in torch_bf16[1:]], rel=1e-12)
    plain = _plan(Conditions(fp8_recipe=Fp8Recipe.DELAYED))
    assert _all_gathers(plain) == pytest.approx(bf16, rel=1e-12)  # the recipe alone gathers in bf16


def test_refused_combinations() -> None:
    with pytest.raises(ValueError, match="needs fp8_recipe tensorwise"):
        Conditions(fp8_recipe=Fp8Recipe.ROWWISE, fp8_all_gather=True)
    with pytest.raises(ValueError, match="needs FP8 matmuls"):
        Workload(seq_len=4096, global_batch=8, conditions=TENSORWISE)


def test_activation_offload() -> None:
    """--offload-layers 16 on Llama 3.1 8B (32 layers, one stage): 16 layers' activations go to the host, one of
    them on its way at any time, so the GPU keeps 32 - 16 + 1 = 17 layers' worth; the layer bytes themselves
    come from the activation bill (layer_activations)."""
    from meshplan.core.memory import layer_activations

    cluster = resolve_cluster(gpu="h100-sxm", gpus=8)
    layout = Layout(zero=ZeroStage.OPTIMIZER, dp_shard=8)
    base = Workload(seq_len=8192, global_batch=8)
    off = Workload(seq_len=8192, global_batch=8, conditions=Conditions(offload_layers=16))
    kept = evaluate(LLAMA_8B, cluster, layout, base).memory.per_gpu.activations_bytes
    offloaded = evaluate(LLAMA_8B, cluster, layout, off).memory.per_gpu.activations_bytes
    per_layer = layer_activations(LLAMA_8B, layout, base).dense
    assert kept - offloaded == pytest.approx(15 * per_layer, rel=1e-12)
    with pytest.raises(ValueError, match="offload_layers=16 with pp=2"):
        evaluate(LLAMA_8B, cluster, Layout(pp=2, dp_replicate=4), off)
