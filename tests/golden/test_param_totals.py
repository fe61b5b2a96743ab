"""Parameter totals against published checkpoint sizes, with the arithmetic re-derived here from the shapes.

Published totals are the element counts of the released checkpoints (safetensors index ``total_size`` in
bytes divided by the bytes per element, or a tensor-by-tensor recount); each catalog file names its
source in ``[meta]``. Totals must match exactly: a parameter count has no tolerance.
"""

import pytest

from meshplan.core.params import count_params
from meshplan.io import list_models, load_model, model_meta

# The totals this suite pins, independent of what the catalog files say about themselves.
PINNED_TOTALS = {
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
    "mixtral-8x7b": 46_702_792_704,
    "qwen2.5-7b": 7_615_616_512,
    "deepseek-v3": 671_026_419_200,  # main model only; the MTP module is reported apart
}

PUBLISHED = {
    name: meta["published_total_params"]
    for name in list_models()
    if "published_total_params" in (meta := model_meta(name))
}


@pytest.mark.parametrize("name", sorted(PINNED_TOTALS))
def test_pinned_totals(name: str) -> None:
    assert count_params(load_model(name)).total == PINNED_TOTALS[name]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_catalog_published_totals(name: str) -> None:
    assert count_params(load_model(name)).total == PUBLISHED[name]


def test_pinned_totals_are_recorded_in_the_catalog() -> None:
    for name, total in PINNED_TOTALS.items():
        assert PUBLISHED.get(name) == total, name


# --- independent re-derivations: one line per tensor of the Hugging Face checkpoint -----------------------------


def test_llama_3_1_8b_by_tensor() -> None:
    L, h, a, k, d, f, V = 32, 4096, 32, 8, 128, 14336, 128256
    per_layer = (
        h * a * d  # q_proj
        + 2 * h * k * d  # k_proj, v_proj
        + a * d * h  # o_proj
        + 3 * h * f  # gate_proj, up_proj, down_proj
        + 2 * h  # input_layernorm, post_attention_layernorm
    )
    total = V * h + L * per_layer + h + V * h  # embed_tokens, layers, norm, lm_head
    assert total == 8_030_261_248
    assert count_params(load_model("llama-3.1-8b")).total == total


def test_mixtral_8x7b_by_tensor() -> None:
    L, h, a, k, d, f, V, E = 32, 4096, 32, 8, 128, 14336, 32000, 8
    attention = h * a * d + 2 * h * k * d + a * d * h
    moe = h * E + E * 3 * h * f  # block_sparse_moe.gate, experts.*.w1/w2/w3
    total = V * h + L * (attention + moe + 2 * h) + h + V * h
    assert total == 46_702_792_704
    assert count_params(load_model("mixtral-8x7b")).total == total


DSV3 = dict(L=61, h=7168, a=128, V=129280, q_lora=1536, kv_lora=512, nope=128, rope=64, v=128)


def _dsv3_attention() -> int:
    h, a, q_lora, kv_lora = DSV3["h"], DSV3["a"], DSV3["q_lora"], DSV3["kv_lora"]
    nope, rope, v = DSV3["nope"], DSV3["rope"], DSV3["v"]
    return (
        h * q_lora  # q_a_proj
        + q_lora  # q_a_layernorm
        + q_lora * a * (nope + rope)  # q_b_proj
        + h * (kv_lora + rope)  # kv_a_proj_with_mqa
        + kv_lora  # kv_a_layernorm
        + kv_lora * a * (nope + v)  # kv_b_proj
        + a * v * h  # o_proj
    )


def _dsv3_moe_mlp() -> int:
    h, E, f_expert = DSV3["h"], 256, 2048
    return (
        E * 3 * h * f_expert  # experts.*.gate_proj/up_proj/down_proj
        + 3 * h * f_expert  # shared_experts (1 expert of the same width)
        + E * h  # gate.weight
        + E  # gate.e_score_correction_bias
    )


def test_deepseek_v3_by_tensor() -> None:
    L, h, V, dense_layers, f_dense = DSV3["L"], DSV3["h"], DSV3["V"], 3, 18432
    layer_common = _dsv3_attention() + 2 * h  # attention and the two RMSNorms
    total = (
        V * h  # embed_tokens
        + dense_layers * (layer_common + 3 * h * f_dense)
        + (L - dense_layers) * (layer_common + _dsv3_moe_mlp())
        + h  # norm
        + V * h  # lm_head
    )
    assert total == 671_026_419_200
    count = count_params(load_model("deepseek-v3"))
    assert count.total == total
    # MTP module (layer 61): enorm, hnorm, eh_proj (2h -> h), one MoE layer, shared_head.norm; it shares
    # the embedding and the output head with the main model.
    mtp = 2 * h + 2 * h * h + _dsv3_attention() + 2 * h + _dsv3_moe_mlp() + h
    assert count.mtp == mtp


# --- active parameters per token: published figures are rounded, so a tolerance is stated -------------------------


def test_deepseek_v3_active_params() -> None:
    # DeepSeek-V3 report (arXiv:2412.19437) abstract: "37B activated for each token". Rounded to 1B, and
    # conventions differ on counting the 0.93B input embedding, so 3% is allowed.
    active = count_params(load_model("deepseek-v3")).active_per_token
    assert active == pytest.approx(37e9, rel=0.03)
    h, E, k, f_expert = DSV3["h"], 256, 8, 2048
    skipped = (DSV3["L"] - 3) * (E - k) * 3 * h * f_expert
    assert active == 671_026_419_200 - skipped


def test_mixtral_8x7b_active_params() -> None:
    # Mistral AI, "Mixtral of experts" announcement: 46.7B total, 12.9B used per token; 1% tolerance for rounding.
    active = count_params(load_model("mixtral-8x7b")).active_per_token
    assert active == pytest.approx(12.9e9, rel=0.01)
    assert active == 46_702_792_704 - 32 * 6 * 3 * 4096 * 14336


# The Megatron-LM README's H100 weak-scaling table (images/model_table.png at core_r0.8.0) names each model by
# its size in billions; its shapes alone do not say whether the output layer shares the input embedding.
MEGATRON_WEAK_SIZES = {
    "1.7b": 1.7, "7.1b": 7.1, "16b": 16, "32b": 32, "70b": 70, "119b": 119, "177b": 177, "314b": 314, "462b": 462,
}  # fmt: skip


@pytest.mark.parametrize("size", sorted(MEGATRON_WEAK_SIZES))
def test_megatron_weak_scaling_sizes_are_untied(size: str) -> None:
    """Each stated size is the count with a separate output layer (12 L h^2 + 2 V h + ...: 1.75B for "1.7B",
    where a tied one would be 1.49B), closer than the tied count for all nine."""
    import dataclasses

    model = load_model(f"megatron-gpt-{size}")
    stated = MEGATRON_WEAK_SIZES[size] * 1e9
    untied = count_params(model).total
    tied = count_params(dataclasses.replace(model, tied_embeddings=True)).total
    L, h, V = model.num_layers, model.hidden, model.vocab_size
    assert untied - tied == V * h  # the output layer's weight, once more
    assert not model.tied_embeddings
    assert abs(untied / stated - 1) < 0.035
    assert abs(untied - stated) < abs(tied - stated)
    assert abs(12 * L * h * h + 2 * V * h - untied) / untied < 0.01  # the back-of-envelope count


# gpt-oss (OpenAI's model card, 2025): 116.83B and 20.91B parameters, 5.13B and 3.61B active, rounded to 10M; its
# checkpoint keeps the experts in MXFP4, so the count is re-derived here from transformers' GptOss modules.
@pytest.mark.parametrize(("name", "layers", "experts", "card_total", "card_active"), [
    ("gpt-oss-120b", 36, 128, 116.83e9, 5.13e9),
    ("gpt-oss-20b", 24, 32, 20.91e9, 3.61e9),
])  # fmt: skip
def test_gpt_oss_by_tensor(name: str, layers: int, experts: int, card_total: float, card_active: float) -> None:
    h, a, k, d, f, V, top = 2880, 64, 8, 64, 2880, 201088, 4
    attention = (
        (h * a * d + a * d)  # q_proj and its bias
        + 2 * (h * k * d + k * d)  # k_proj, v_proj and their biases
        + (a * d * h + h)  # o_proj and its bias
        + a  # sinks, one per head
    )
    expert = h * 2 * f + 2 * f + f * h + h  # gate_up_proj (h x 2f) and its bias, down_proj and its bias
    router = h * experts + experts  # GptOssTopKRouter: weight and bias
    per_layer = attention + experts * expert + router + 2 * h  # input and post-attention RMSNorms
    total = V * h + layers * per_layer + h + V * h  # embed_tokens, layers, norm, lm_head (untied)
    count = count_params(load_model(name))
    assert count.total == total
    assert count.total == pytest.approx(card_total, abs=0.005e9)
    # the card's active count leaves out the input embedding
    active = total - layers * (experts - top) * expert
    assert count.active_per_token == active
    assert active - V * h == pytest.approx(card_active, abs=0.005e9)
