"""The serving bill: weights per GPU by dtype, the KV budget, and what fits."""

import pytest

from meshplan import io
from meshplan.core.params import count_params
from meshplan.core.serving import serving_bill, weight_bytes_per_param, weights_bytes_total
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
    budget = H200.hbm_bytes * 0.9 - bill.weights_bytes - bill.activations_bytes - bill.framework_bytes
    assert bill.kv_capacity_tokens == int(budget // bill.kv_bytes_per_token)
    assert bill.max_concurrent_sequences == int(budget // (8192 * bill.kv_bytes_per_token))


def test_a_model_too_big_for_one_gpu_does_not_fit() -> None:
    bill = serving_bill(io.load_model("llama-3.1-405b"), gpu=H200, tp=1, context=8192)
    assert not bill.fits and bill.kv_capacity_tokens == 0


@pytest.mark.parametrize("dtype", [DType.FP32, DType.NF4])
def test_unsupported_weight_dtype_is_refused(dtype: DType) -> None:
    with pytest.raises(ValueError, match="serving weights cannot be"):
        weight_bytes_per_param(dtype, hidden=4096)
