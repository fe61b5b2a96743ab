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


def test_one_adapter_count_for_the_whole_model_and_each_gpu() -> None:
    """The count users see (trainable_params) and the one the memory bill holds per GPU come from one formula:
    over the stages of a pp=4 layout at tp=1 they add up to the whole; at tp=4 each matrix keeps one side whole
    and splits the other (column-parallel q, k, v, gate, up split B; row-parallel o, down split A)."""
    from meshplan.core.memory.bill import stage_bill
    from meshplan.core.params import count_params
    from meshplan.spec.cluster import GpuCalibration
    from meshplan.spec.layout import Layout
    from meshplan.spec.workload import Workload

    m = io.load_model("llama-3.1-8b")
    ft = Finetune(mode=FinetuneMode.LORA, lora_rank=16)
    work = Workload(seq_len=1024, global_batch=8, finetune=ft)
    calib = GpuCalibration(framework_bytes=0.0, fragmentation=0.0)
    weight_bytes = work.precision.weight_bytes

    def adapters(lay: Layout, stage: int) -> float:
        bill = stage_bill(m, count_params(m), lay, work, calibration=calib, stage=stage)
        return float(bill.adapter_weights_bytes) / weight_bytes

    whole = trainable_params(m, ft).adapters
    assert sum(adapters(Layout(pp=4), s) for s in range(4)) == pytest.approx(whole, rel=1e-12)
    h, q, kv, f, r, t = 4096, 4096, 1024, 14336, 16, 4
    by_hand = r * ((h + q / t) + 2 * (h + kv / t) + (q / t + h) + 2 * (h + f / t) + (f / t + h))
    assert adapters(Layout(tp=t), 0) == pytest.approx(32 * by_hand, rel=1e-12)
