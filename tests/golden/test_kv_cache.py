"""KV-cache bytes per token against published and derived figures (published_runs.json, kind "kv").

KV per token = layers * 2 (K and V) * kv_heads * head_dim * bytes; MLA caches
the latent plus the RoPE key, layers * (d_c + d_R) * bytes. Exact.
"""

import pytest

from meshplan import io
from meshplan.core.serving.bill import serving_bill
from meshplan.units import DType

CASES = [
    ("llama-3.1-8b", 131_072),  # 32 layers x 2 x 8 x 128 x 2
    ("llama-3.1-70b", 327_680),
    ("llama-3.1-405b", 516_096),
    ("llama-2-13b", 819_200),  # = OPT-13B of the vLLM paper: 800 KiB per token in fp16
    ("llama-2-70b", 327_680),
    ("deepseek-v3", 70_272),  # 61 x (512 + 64) x 2
]


@pytest.mark.parametrize(("name", "published"), CASES)
def test_kv_bytes_per_token(name: str, published: int) -> None:
    model = io.load_model(name)
    bill = serving_bill(model, gpu=io.load_gpu("h200"), tp=1, kv_dtype=DType.BF16, context=4096)
    assert bill.kv_bytes_per_token == published


def test_kv_split_over_tensor_parallel_ranks() -> None:
    model = io.load_model("llama-3.1-70b")
    gpu = io.load_gpu("h200")
    one = serving_bill(model, gpu=gpu, tp=1, context=4096).kv_bytes_per_token
    assert serving_bill(model, gpu=gpu, tp=8, context=4096).kv_bytes_per_token == one / 8
    # past the 8 KV heads the heads are copied, not split further
    assert serving_bill(model, gpu=gpu, tp=16, context=4096).kv_bytes_per_token == one / 8


def test_mla_latent_is_not_split_by_tp() -> None:
    model = io.load_model("deepseek-v3")
    gpu = io.load_gpu("h200")
    assert serving_bill(model, gpu=gpu, tp=8, context=4096).kv_bytes_per_token == 70_272


def test_fp8_cache_halves_the_bytes() -> None:
    model = io.load_model("llama-3.1-8b")
    gpu = io.load_gpu("h100-sxm")
    assert serving_bill(model, gpu=gpu, kv_dtype=DType.FP8, context=4096).kv_bytes_per_token == 65_536


def test_sliding_window_caps_a_long_sequence() -> None:
    model = io.load_model("mistral-7b")  # every layer slides over 4,096 tokens
    gpu = io.load_gpu("h100-sxm")
    short = serving_bill(model, gpu=gpu, context=4096)
    long = serving_bill(model, gpu=gpu, context=32768)
    assert long.kv_bytes_per_sequence == short.kv_bytes_per_sequence
    assert short.kv_bytes_per_sequence == 4096 * short.kv_bytes_per_token
