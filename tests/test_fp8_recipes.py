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
from meshplan.units import DType

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


def test_distributed_optimizer_gathers_fp8_parameters() -> None:
    """ZeRO-1 with FP8 parameters (Megatron's --fp8-param-gather under the distributed optimizer): the all-gather
    after the optimizer step carries 1 byte a parameter instead of 2; the gradients' reduce-scatter is unchanged."""

    def step_calls(conditions: Conditions) -> dict[str, float]:
        work = Workload(seq_len=4096, global_batch=8, precision=PRECISIONS["fp8"], conditions=conditions)
        plan = evaluate(
            LLAMA_8B, resolve_cluster(gpu="h100-sxm", gpus=8), Layout(zero=ZeroStage.OPTIMIZER, dp_shard=8), work
        )
        return {c.op.name: float(c.size_bytes) for c in plan.collectives if c.strategy == "dp"}

    bf16, fp8 = step_calls(TENSORWISE), step_calls(GATHER_FP8)
    assert fp8["ALL_GATHER"] == pytest.approx(bf16["ALL_GATHER"] / 2, rel=1e-12)
    assert fp8["REDUCE_SCATTER"] == pytest.approx(bf16["REDUCE_SCATTER"], rel=1e-12)
    # a per-tensor recipe left unstated (as `--precision fp8 --fp8-all-gather on` types it), or delayed scaling
    # (Transformer Engine's FP8 parameters), gathers the same single byte a parameter
    for recipe in (None, Fp8Recipe.DELAYED):
        gathered = step_calls(Conditions(fp8_recipe=recipe, fp8_all_gather=True))
        assert gathered["ALL_GATHER"] == pytest.approx(fp8["ALL_GATHER"], rel=1e-12)


def test_refused_combinations() -> None:
    for recipe in (Fp8Recipe.ROWWISE, Fp8Recipe.MXFP8):
        with pytest.raises(ValueError, match="needs one scale per tensor"):
            Conditions(fp8_recipe=recipe, fp8_all_gather=True)
    with pytest.raises(ValueError, match="fp8_all_gather needs FP8 matmuls"):
        Workload(seq_len=4096, global_batch=8, conditions=Conditions(fp8_all_gather=True))
    with pytest.raises(ValueError, match="needs FP8 matmuls"):
        Workload(seq_len=4096, global_batch=8, conditions=TENSORWISE)


def test_activation_offload() -> None:
    """--offload-layers 16 on Llama 3.1 8B (32 layers, one stage): 16 layers' activations go to the host, one of
    them on its way at any time, so the GPU keeps 32 - 16 + 1 = 17 layers' worth; the layer bytes themselves
    come from the activation bill (layer_activations)."""
    from meshplan.core.memory.stage_activations import layer_activations

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


def _fp8_layer(*, dynamic: bool, gathered: bool = False, tokens: int = 16384):  # type: ignore[no-untyped-def]
    from compute_setups import gpu_setup

    from meshplan.core.time.compute import layer_time
    from meshplan.spec.workload import Kernels

    setup = gpu_setup(
        compute=DType.FP8, kernels=Kernels.FUSED, fp8=True, fp8_dynamic=dynamic, fp8_weights_gathered=gathered
    )
    lt = layer_time(LLAMA_8B, setup=setup, tokens=tokens, seq_len=8192, tp=1, sp=False, ep=1, moe_layer=False)
    return lt, setup.hbm


def test_torchao_dynamic_casts() -> None:
    """torchao's Float8Linear under torch.compile (roofline_utils): each input, output gradient and weight is cast
    after its amax, 4 bytes an element (read bf16, write FP8 row- and column-major), weights 2 more for their own
    amax pass; Transformer Engine's fused casts: no forward input cast, 4 bytes per output-gradient element and
    2 per saved input's transpose in backward (the output gradients' 4 bytes are common to both). Llama 3.1 8B
    per token: inputs 3 x 4,096 + 14,336; weights 218,103,808 (the layer less its norms)."""
    tokens = 16384
    inputs, weights = tokens * (3 * 4096 + 14336), LAYER - 2 * 4096
    te, hbm = _fp8_layer(dynamic=False)
    torchao, _ = _fp8_layer(dynamic=True)
    gathered, _ = _fp8_layer(dynamic=True, gathered=True)
    assert torchao.memory_s - te.memory_s == pytest.approx((4 * inputs + 6 * weights) / hbm, rel=1e-9)
    assert torchao.backward_s - te.backward_s == pytest.approx(-2 * inputs / hbm, rel=1e-9)
    # weights gathered in FP8 arrive cast (on the shard, before the all-gather)
    assert torchao.memory_s - gathered.memory_s == pytest.approx(6 * weights / hbm, rel=1e-9)


def test_torch_stacks_cast_dynamically() -> None:
    """A PyTorch-native stack's FP8 step is slower than the same run with Transformer Engine's fused casts."""
    torch_plan = _plan(TENSORWISE, Framework.TORCH)
    te_plan = _plan(TENSORWISE, Framework.MEGATRON)
    assert torch_plan.step.compute_s > te_plan.step.compute_s


# MXFP8 (--fp8-recipe mxfp8): block-scaled casts, Blackwell only.


def _gemm_list():  # type: ignore[no-untyped-def]
    from meshplan.core.time.flops import Gemm

    return [Gemm(name="a", m=4096, n=1024, k=2048), Gemm(name="b", m=4096, n=2048, k=512, count=3)]


def test_mxfp8_casts_by_hand() -> None:
    """An MXFP8 cast reads bf16 and writes a row-wise and a column-wise FP8 copy, each with one E8M0 byte per 32
    elements: 2 + 2 x (1 + 1/32) bytes an element. Transformer Engine casts each input in forward (nothing left
    for backward) and each output gradient in backward; torchao casts inputs, gradients and weights the same way
    but finds each block's scale in the cast, with no amax pass."""
    from meshplan.core.time.casts import fp8_cast_time as _fp8_cast_time

    inputs = 4096 * 2048 + 3 * 4096 * 512
    outputs = 4096 * 1024 + 3 * 4096 * 2048
    weights = 1024 * 2048 + 3 * 2048 * 512
    per_element = 2 + 2 * (1 + 1 / 32)
    fwd, bwd = _fp8_cast_time(_gemm_list(), fused=False, hbm=1.0, block_scaled=True)
    assert (fwd, bwd) == pytest.approx((inputs * per_element, outputs * per_element), rel=1e-12)
    fwd, bwd = _fp8_cast_time(_gemm_list(), fused=True, hbm=1.0, block_scaled=True)
    assert (fwd, bwd) == pytest.approx((inputs * 2 / 32, outputs * per_element), rel=1e-12)
    # the per-tensor recipe, for contrast: 3 bytes an input in forward, its 2-byte transpose and 5 bytes a
    # gradient in backward
    fwd, bwd = _fp8_cast_time(_gemm_list(), fused=False, hbm=1.0)
    assert (fwd, bwd) == pytest.approx((3 * inputs, 5 * outputs + 2 * inputs), rel=1e-12)
    fwd, bwd = _fp8_cast_time(_gemm_list(), fused=False, hbm=1.0, dynamic=True, block_scaled=True)
    assert (fwd, bwd) == pytest.approx(((inputs + weights) * per_element, outputs * per_element), rel=1e-12)
    fwd, bwd = _fp8_cast_time(_gemm_list(), fused=False, hbm=1.0, dynamic=True)
    assert (fwd, bwd) == pytest.approx(((inputs + weights) * 6, outputs * 6), rel=1e-12)


def test_rowwise_casts_by_hand() -> None:
    """torchao's rowwise recipe scales each operand along both dimensions, as its own roofline counts the kernels:
    an input or output gradient is read (2; 0 fused into its producer), written in FP8 (1) and transposed in bf16
    (2), then the transpose read (2) and written in FP8 (1); a weight cast (2 + 1), transposed (2 + 2) and cast
    again (2 + 1). Per-tensor scaling, for contrast: 4 bytes a tensor and the amax pass (2) where not fused."""
    from meshplan.core.time.casts import fp8_cast_time as _fp8_cast_time

    inputs = 4096 * 2048 + 3 * 4096 * 512
    outputs = 4096 * 1024 + 3 * 4096 * 2048
    weights = 1024 * 2048 + 3 * 2048 * 512
    for fused, read in ((False, 2), (True, 0)):
        first, second = read + 1 + 2, 2 + 1
        fwd, bwd = _fp8_cast_time(_gemm_list(), fused=fused, hbm=1.0, dynamic=True, rowwise=True)
        assert fwd == pytest.approx(inputs * first + weights * 3, rel=1e-12)
        assert bwd == pytest.approx(inputs * second + outputs * (first + second) + weights * (4 + 3), rel=1e-12)
        tensorwise = _fp8_cast_time(_gemm_list(), fused=fused, hbm=1.0, dynamic=True)
        assert sum(tensorwise) == pytest.approx((inputs + outputs) * (4 + read) + weights * 6, rel=1e-12)
        assert fwd + bwd > sum(tensorwise)


def test_frozen_weights_skip_the_casts_only_the_weight_gradient_needs() -> None:
    """A frozen weight (LoRA's base, frozen layers) takes no weight gradient: Transformer Engine keeps no
    column-wise copy of the input (no transpose in backward) and casts each output gradient once for the input
    gradient (read 2, write 1); MXFP8 writes its row-wise copy alone (2 + 1 + 1/32). torchao casts the same."""
    from meshplan.core.time.casts import fp8_cast_time as _fp8_cast_time

    inputs = 4096 * 2048 + 3 * 4096 * 512
    outputs = 4096 * 1024 + 3 * 4096 * 2048
    fwd, bwd = _fp8_cast_time(_gemm_list(), fused=False, hbm=1.0, frozen=True)
    assert (fwd, bwd) == pytest.approx((3 * inputs, 3 * outputs), rel=1e-12)
    one_copy = 2 + 1 + 1 / 32
    fwd, bwd = _fp8_cast_time(_gemm_list(), fused=False, hbm=1.0, block_scaled=True, frozen=True)
    assert (fwd, bwd) == pytest.approx((inputs * one_copy, outputs * one_copy), rel=1e-12)
    fwd, bwd = _fp8_cast_time(_gemm_list(), fused=True, hbm=1.0, block_scaled=True, frozen=True)
    assert (fwd, bwd) == pytest.approx((inputs / 32, outputs * one_copy), rel=1e-12)
    assert _fp8_cast_time(_gemm_list(), fused=False, hbm=1.0, dynamic=True, frozen=True) == pytest.approx(
        _fp8_cast_time(_gemm_list(), fused=False, hbm=1.0, dynamic=True), rel=1e-12
    )


def _b200_plan(recipe: Fp8Recipe, framework: Framework = Framework.MEGATRON):  # type: ignore[no-untyped-def]
    work = Workload(
        seq_len=4096,
        global_batch=8,
        precision=PRECISIONS["fp8"],
        conditions=Conditions(fp8_recipe=recipe),
        framework=framework,
    )
    return evaluate(LLAMA_8B, resolve_cluster(gpu="b200", gpus=8), FSDP8, work)


@pytest.mark.parametrize("framework", [Framework.MEGATRON, Framework.TORCH])
def test_mxfp8_runs_at_the_fp8_rate_with_fewer_cast_bytes(framework: Framework) -> None:
    """Block-scaled matmuls run at the FP8 rate: MXFP8 and per-tensor scaling differ only in their casts, which
    move fewer bytes (no input transpose under Transformer Engine, no amax pass under torchao)."""
    mx, tensorwise = _b200_plan(Fp8Recipe.MXFP8, framework), _b200_plan(Fp8Recipe.TENSORWISE, framework)
    assert mx.step.compute_s < tensorwise.step.compute_s
    assert mx.step.compute_s > 0.97 * tensorwise.step.compute_s  # the casts are a few percent of a layer
    if framework is Framework.TORCH:  # torchao keeps the bf16 inputs whatever the recipe
        assert mx.memory.per_gpu.total_bytes == tensorwise.memory.per_gpu.total_bytes
    else:  # TE keeps the FP8 inputs with a scale byte per 32 elements: 1/32 more, on what are under half the bytes
        extra = mx.memory.per_gpu.activations_bytes / tensorwise.memory.per_gpu.activations_bytes - 1
        assert 0 < extra < 1 / 64


def test_mxfp8_needs_block_scaled_tensor_cores() -> None:
    work = Workload(
        seq_len=4096, global_batch=8, precision=PRECISIONS["fp8"], conditions=Conditions(fp8_recipe=Fp8Recipe.MXFP8)
    )
    with pytest.raises(ValueError, match="h100-sxm has none"):
        evaluate(LLAMA_8B, resolve_cluster(gpu="h100-sxm", gpus=8), FSDP8, work)
    with pytest.raises(ValueError, match="needs precision fp8"):
        Workload(
            seq_len=4096,
            global_batch=8,
            precision=PRECISIONS["deepseek-fp8"],
            conditions=Conditions(fp8_recipe=Fp8Recipe.MXFP8),
        )
    with pytest.raises(ValueError, match="MXFP8 parameter gather moves bf16"):
        Conditions(fp8_recipe=Fp8Recipe.MXFP8, fp8_all_gather=True)
    assert [g.name for g in map(io.load_gpu, io.list_gpus()) if g.block_scaled_mma] == ["b200", "gb200"]


def test_mxfp8_cli_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from meshplan.cli import main

    argv = ["estimate", "llama-3.1-8b", "--gpus", "8", "--precision", "fp8", "--fp8-recipe", "mxfp8"]
    assert main([*argv, "--gpu", "h100-sxm"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "block" in err
    assert main([*argv, "--gpu", "b200"]) == 0


def test_rowwise_says_its_gemm_kernels_are_not_priced() -> None:
    """The rowwise recipe's GEMM kernels have no price (docs/validation.md): a rowwise layout warns, tensorwise not."""
    rowwise = _plan(Conditions(fp8_recipe=Fp8Recipe.ROWWISE), Framework.TORCH).warnings()
    tensorwise = _plan(TENSORWISE, Framework.TORCH).warnings()
    assert any(w.startswith("rowwise FP8") and "not" in w for w in rowwise)
    assert not any("rowwise" in w for w in tensorwise)
