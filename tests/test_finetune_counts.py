"""Trainable parameter counts of fine-tuning modes, re-derived from the shapes in the test."""

import pytest

from meshplan import io
from meshplan.core.finetune import nf4_bytes_per_param, trainable_params, validate_finetune
from meshplan.spec.finetune import Finetune, FinetuneMode

ALL = ("q", "k", "v", "o", "gate", "up", "down")


def lora_by_hand(layers: int, h: int, q: int, kv: int, f: int, r: int, targets: tuple[str, ...]) -> int:
    """r (d_in + d_out) per adapted matrix; K and V are kv wide (GQA)."""
    shapes = {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h), "gate": (h, f), "up": (h, f), "down": (f, h)}
    return layers * sum(r * (shapes[t][0] + shapes[t][1]) for t in targets)


def test_issue_example_llama_3_1_8b_rank_16_all_linear() -> None:
    got = trainable_params(io.load_model("llama-3.1-8b"), Finetune(mode=FinetuneMode.LORA, lora_rank=16))
    assert got.trainable == 41_943_040
    assert got.trainable == lora_by_hand(32, 4096, 4096, 8 * 128, 14336, 16, ALL)


@pytest.mark.parametrize("name", ["llama-3.1-70b", "qwen2.5-7b", "mistral-7b", "llama-2-13b"])
@pytest.mark.parametrize(("rank", "targets"), [(8, ("q", "v")), (64, ALL), (16, ("gate", "up", "down"))])
def test_dense_models(name: str, rank: int, targets: tuple[str, ...]) -> None:
    m = io.load_model(name)
    want = lora_by_hand(
        m.num_layers, m.hidden, m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim, m.ffn_hidden, rank, targets
    )
    got = trainable_params(m, Finetune(mode=FinetuneMode.QLORA, lora_rank=rank, lora_targets=targets))
    assert got.trainable == want and got.adapters == want


def test_experts_each_get_an_adapter() -> None:
    m = io.load_model("mixtral-8x7b")
    attention = lora_by_hand(32, 4096, 4096, 1024, 0, 16, ("q", "k", "v", "o"))
    experts = 32 * 8 * 16 * 3 * (4096 + 14336)
    got = trainable_params(m, Finetune(mode=FinetuneMode.LORA, lora_rank=16))
    assert got.trainable == attention + experts


def test_full_fine_tuning_with_frozen_parts() -> None:
    m = io.load_model("llama-3.1-8b")
    layer = 218_112_000  # 4h^2 GQA attention + 3 h f MLP + 2 norms for this model
    got = trainable_params(m, Finetune(freeze_embeddings=True, freeze_layers=4))
    assert got.frozen == 128256 * 4096 + 4 * layer
    assert got.trainable == 8_030_261_248 - got.frozen


def test_nf4_with_and_without_double_quantization() -> None:
    """QLoRA paper Sec. 3: double quantization cuts the scales from 0.5 to 0.127 bits per parameter."""
    assert nf4_bytes_per_param(double_quant=False) * 8 == pytest.approx(4.5)
    assert nf4_bytes_per_param(double_quant=True) * 8 == pytest.approx(4.127, abs=5e-4)


@pytest.mark.parametrize(
    ("finetune", "fragment"),
    [
        (Finetune(mode=FinetuneMode.LORA, lora_rank=1024), "lora_rank=1024 is not below"),
        (Finetune(freeze_layers=99), "freeze_layers=99 exceeds"),
    ],
)
def test_bad_combinations_are_refused(finetune: Finetune, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        validate_finetune(io.load_model("llama-3.1-8b"), finetune)


def test_bad_specs_are_refused_at_creation() -> None:
    with pytest.raises(ValueError, match="unknown LoRA target 'wq'"):
        Finetune(mode=FinetuneMode.LORA, lora_targets=("wq",))
    with pytest.raises(ValueError, match="already freezes the whole base"):
        Finetune(mode=FinetuneMode.LORA, freeze_layers=2)
