"""What a linear layer keeps of its input for its weight gradient under FP8: the quantized copy under Transformer
Engine (Megatron-Core, NeMo), the bf16 input under torchao (PyTorch-native stacks). Re-derived tensor by tensor."""

from __future__ import annotations

import pytest

from meshplan import io
from meshplan.core.memory import activations as act
from meshplan.core.memory.stage_activations import linear_inputs
from meshplan.core.plan import evaluate
from meshplan.reports.inputs import resolve_cluster
from meshplan.spec.conditions import Conditions, Fp8Recipe
from meshplan.spec.layout import Layout, Recompute
from meshplan.spec.workload import PRECISIONS, Attention, Framework, Kernels, Workload

LLAMA_8B = io.load_model("llama-3.1-8b")
QWEN3_30B = io.load_model("qwen3-30b-a3b")
DEEPSEEK_V3 = io.load_model("deepseek-v3")


def _work(precision: str, recipe: Fp8Recipe | None, framework: Framework = Framework.MEGATRON) -> Workload:
    return Workload(
        seq_len=4096,
        global_batch=8,
        precision=PRECISIONS[precision],
        conditions=Conditions(fp8_recipe=recipe),
        framework=framework,
    )


@pytest.mark.parametrize(
    ("precision", "recipe", "framework", "own", "copy"),
    [
        ("bf16", None, Framework.MEGATRON, 2.0, 0.0),
        ("fp8", Fp8Recipe.TENSORWISE, Framework.MEGATRON, 1.0, 0.0),
        ("fp8", None, Framework.MEGATRON, 1.0, 0.0),
        ("fp8", Fp8Recipe.DELAYED, Framework.MEGATRON, 1.0, 1.0),  # no set_save_original_input under delayed
        ("fp8", Fp8Recipe.MXFP8, Framework.MEGATRON, 1 + 1 / 32, 0.0),  # an E8M0 byte per 32, one copy
        ("deepseek-fp8", None, Framework.MEGATRON, 1 + 4 / 128, 0.0),  # an fp32 scale per 1 x 128 tile
        ("fp8", Fp8Recipe.TENSORWISE, Framework.TORCH, 2.0, 0.0),  # torchao saves input_hp
        ("fp8", Fp8Recipe.ROWWISE, Framework.TORCH, 2.0, 0.0),
    ],
)
def test_what_a_linear_layer_keeps_of_its_input(
    precision: str, recipe: Fp8Recipe | None, framework: Framework, own: float, copy: float
) -> None:
    lin = linear_inputs(_work(precision, recipe, framework))
    assert (lin.own_bytes, lin.copy_bytes) == pytest.approx((own, copy), rel=1e-12)


def _layer(model, *, moe_layer: bool, inputs: act.LinearInputs | None, tp: int = 2, etp: int = 2) -> float:  # type: ignore[no-untyped-def]
    return float(
        act.layer_bytes(
            model,
            seq_len=4096,
            micro_batch=1,
            tp=tp,
            sp=True,
            cp=1,
            recompute=Recompute.NONE,
            attention=Attention.FLASH,
            act_bytes=2.0,
            moe_layer=moe_layer,
            kernels=Kernels.FUSED,
            framework=Framework.MEGATRON,
            etp=etp,
            inputs=inputs,
        )
    )


def test_a_dense_layer_keeps_its_qkv_fc1_and_fc2_inputs_in_fp8() -> None:
    """QKV and fc1 take their norm's output (h/t per token under SP), fc2 the gated product (f/t): each drops from
    2 bytes an element to 1; the output projection's input is the attention kernel's own bf16 output, kept once."""
    tokens, t, h, f = 4096, 2, LLAMA_8B.hidden, LLAMA_8B.ffn_hidden
    bf16 = _layer(LLAMA_8B, moe_layer=False, inputs=None)
    fp8 = _layer(LLAMA_8B, moe_layer=False, inputs=act.LinearInputs(own_bytes=1.0))
    assert bf16 - fp8 == pytest.approx(tokens * (2 - 1) * (h / t + h / t + f / t), rel=1e-12)
    delayed = _layer(LLAMA_8B, moe_layer=False, inputs=act.LinearInputs(own_bytes=1.0, copy_bytes=1.0))
    assert delayed - fp8 == pytest.approx(tokens * LLAMA_8B.attn_out_width / t, rel=1e-12)  # proj's FP8 copy


def test_a_moe_layer_keeps_each_routed_copys_expert_inputs_in_fp8() -> None:
    """Each routed copy keeps its fc1 input (h) and its fc2 input (f_e) as FP8; the router's input (the norm's
    output) stays bf16, and so does each copy's expert output (the combine's input)."""
    tokens, t, etp = 4096, 2, 1
    moe = QWEN3_30B.moe
    assert moe is not None and moe.num_shared_experts == 0
    copies = moe.experts_per_token * etp / t  # SP: a rank dispatches s/t tokens, the expert-TP group gathers etp
    bf16 = _layer(QWEN3_30B, moe_layer=True, inputs=None, tp=t, etp=etp)
    fp8 = _layer(QWEN3_30B, moe_layer=True, inputs=act.LinearInputs(own_bytes=1.0), tp=t, etp=etp)
    attention = QWEN3_30B.hidden / t  # the QKV input
    routed = copies * (QWEN3_30B.hidden + moe.expert_ffn_hidden / etp)
    assert bf16 - fp8 == pytest.approx(tokens * (2 - 1) * (attention + routed), rel=1e-12)


def test_shared_experts_keep_a_second_copy_of_the_router_input_only_under_delayed_scaling() -> None:
    moe = DEEPSEEK_V3.moe
    assert moe is not None and moe.num_shared_experts > 0
    t = 2
    fp8 = _layer(DEEPSEEK_V3, moe_layer=True, inputs=act.LinearInputs(own_bytes=1.0), tp=t)
    delayed = _layer(DEEPSEEK_V3, moe_layer=True, inputs=act.LinearInputs(own_bytes=1.0, copy_bytes=1.0), tp=t)
    copies = 4096 * (DEEPSEEK_V3.attn_out_width / t + DEEPSEEK_V3.hidden / t)  # proj's and the shared fc1's
    assert delayed - fp8 == pytest.approx(copies, rel=1e-12)


def test_fp8_under_te_bills_fewer_activation_bytes_than_bf16_and_torchao_the_same() -> None:
    layout = Layout(tp=2, sp=True, dp_replicate=4, micro_batch=1)
    cluster = resolve_cluster(gpu="h100-sxm", gpus=8)

    def activations(precision: str, recipe: Fp8Recipe | None, framework: Framework) -> float:
        plan = evaluate(LLAMA_8B, cluster, layout, _work(precision, recipe, framework))
        return float(plan.memory.per_gpu.activations_bytes)

    te = activations("fp8", Fp8Recipe.TENSORWISE, Framework.MEGATRON)
    assert te < activations("bf16", None, Framework.MEGATRON)
    assert activations("fp8", Fp8Recipe.TENSORWISE, Framework.TORCH) == activations("bf16", None, Framework.TORCH)
