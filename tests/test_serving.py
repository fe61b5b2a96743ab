"""The serving bill: weights per GPU by dtype, the KV budget, and what fits."""

import pytest

from meshplan import io
from meshplan.core.params import count_params
from meshplan.core.serving.bill import (
    EngineMemory,
    MemoryFraction,
    serving_bill,
    weight_bytes_per_param,
    weights_bytes_total,
)
from meshplan.units import DType

H200 = io.load_gpu("h200")
L70 = io.load_model("llama-3.3-70b")


def test_bf16_weights_are_two_bytes_per_parameter() -> None:
    assert weights_bytes_total(L70, DType.BF16) == 2 * count_params(L70).total


def test_int4_carries_group_scales_and_keeps_embeddings_in_16_bits() -> None:
    p = count_params(L70)
    plain = p.embedding + p.lm_head + p.final_norm + p.num_dense_layers * p.dense_layer.norms
    expected = (p.total - plain) * (0.5 + 4 / 128) + plain * 2
    assert weights_bytes_total(L70, DType.INT4) == pytest.approx(expected)


def test_tp8_holds_an_eighth_of_the_matmul_weights() -> None:
    one = serving_bill(L70, gpu=H200, tp=1, context=8192)
    eight = serving_bill(L70, gpu=H200, tp=8, context=8192)
    # norms are copied on every rank, so slightly more than an eighth
    assert one.weights_bytes / 8 < eight.weights_bytes < one.weights_bytes / 8 * 1.001


def test_capacity_is_the_budget_over_the_cache_per_token() -> None:
    bill = serving_bill(L70, gpu=H200, tp=8, context=8192)
    budget = H200.hbm_bytes * 0.9 - bill.weights_bytes - bill.activations_bytes - bill.runtime_reserve_bytes
    assert bill.kv_capacity_tokens == int(budget // bill.kv_bytes_per_token)
    assert bill.max_concurrent_sequences == int(budget // (8192 * bill.kv_bytes_per_token))


def test_a_model_too_big_for_one_gpu_does_not_fit() -> None:
    bill = serving_bill(io.load_model("llama-3.1-405b"), gpu=H200, tp=1, context=8192)
    assert not bill.fits and bill.kv_capacity_tokens == 0


@pytest.mark.parametrize("dtype", [DType.FP32, DType.NF4])
def test_unsupported_weight_dtype_is_refused(dtype: DType) -> None:
    with pytest.raises(ValueError, match="serving weights cannot be"):
        weight_bytes_per_param(dtype, hidden=4096)


@pytest.mark.parametrize("of", list(MemoryFraction))
def test_serving_terms_sum_to_the_device(of: MemoryFraction) -> None:
    """Weights + activations + runtime reserve + engine headroom + KV budget = HBM, whatever the engine's rule."""
    memory = EngineMemory(fraction=0.85, of=of, runtime_reserve_bytes=2e9)
    bill = serving_bill(L70, gpu=H200, tp=2, context=8192, memory=memory)
    held = bill.weights_bytes + bill.activations_bytes + bill.runtime_reserve_bytes + bill.headroom_bytes
    assert held + bill.kv_budget_bytes == pytest.approx(H200.hbm_bytes)


def test_each_engine_reads_its_fraction_as_its_docs_say() -> None:
    """vLLM: f x HBM holds everything; TensorRT-LLM: KV = f x what is free after load; SGLang: f x HBM holds
    weights and KV only (activations and the runtime live in the rest)."""
    hbm, reserve = H200.hbm_bytes, 2e9

    def budget(of: MemoryFraction) -> tuple[float, float, float]:
        bill = serving_bill(
            L70, gpu=H200, tp=2, context=8192, memory=EngineMemory(fraction=0.8, of=of, runtime_reserve_bytes=reserve)
        )
        return bill.kv_budget_bytes, bill.weights_bytes, bill.activations_bytes

    kv, w, a = budget(MemoryFraction.HBM)
    assert kv == pytest.approx(0.8 * hbm - w - a - reserve)
    kv, w, a = budget(MemoryFraction.FREE)
    assert kv == pytest.approx(0.8 * (hbm - w - a - reserve))
    kv, w, a = budget(MemoryFraction.STATIC)
    assert a + reserve < 0.2 * hbm and kv == pytest.approx(0.8 * hbm - w)


def test_node_size_bounds_the_tp_serving_picks_and_warns_past_it() -> None:
    """--node-size replaces the GPU kind's scale-up domain: 8 PCIe H100s in pairs (an NVLink bridge per two cards)
    serve with TP 2 x 4 replicas, and an asked TP 4 spans two domains and says so."""
    from meshplan.reports import serving_report

    paired = serving_report("llama-3.1-8b", gpu="h100-pcie", gpus=8, node_size=2)
    assert (paired["tp"], paired["replicas"]) == (2, 4)
    assert (serving_report("llama-3.1-8b", gpu="h100-pcie", gpus=8)["tp"]) == 8
    wide = serving_report("llama-3.1-8b", gpu="h100-pcie", gpus=8, tp=4, node_size=2)
    assert any("spans 2 NVLink domains of 2 GPUs" in w for w in wide["warnings"])
