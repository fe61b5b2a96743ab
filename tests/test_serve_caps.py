"""The batch caps trtllm-bench picks (core/serving/caps.py) and the tokens-per-step cap of the load model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from meshplan import io
from meshplan.core.serving.caps import trtllm_bench_caps
from meshplan.core.serving.load import BatchLimit, Requests, capacity
from meshplan.reports.serve import resolve
from meshplan.units import DType

LLAMA_70B_PARAMS = 70_553_706_496
H100_BYTES = 85_520_809_984


def test_h100_fp16_tp8_caps_derived_by_hand() -> None:
    """tuning.py's arithmetic for Llama-3.1-70B, FP16, TP8 on H100, 1000/1000: 8 x 79.65 GiB less 131.4 GiB of
    weights, 0.95 of it at 80 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes a token, over 2,000 tokens: 787
    requests, so a max batch of 128 ceil(787 / 128) = 896 and 787 x 2 = 1,574 tokens, raised to the floor 2,048."""
    free_gib = 8 * H100_BYTES / 2**30 - LLAMA_70B_PARAMS * 2 / 2**30
    per_token_gib = 2 * 80 * 8 * 128 * 2 / 2**30
    requests = free_gib * 0.95 / per_token_gib / 2000
    assert requests == pytest.approx(787.2, abs=0.1)
    model = io.load_model("llama-3.1-70b")
    caps = trtllm_bench_caps(
        model,
        gpu=io.load_gpu("h100-sxm"),
        tp=8,
        weights_dtype=DType.FP16,
        kv_dtype=DType.FP16,
        input_len=1000,
        output_len=1000,
    )
    assert caps == (128 * math.ceil(requests / 128), 2048)


def test_fp8_halves_the_weights_and_the_cache_and_long_prompts_raise_the_token_cap() -> None:
    """FP8 on 8 H200: 3,276 requests (max batch 256 ceil(/256) = 3,328, tokens 512 ceil(6,552 / 512) = 6,656);
    prompts 16x the output ask for raw_bs x 17 tokens, capped at 32,768."""
    model, h200 = io.load_model("llama-3.1-70b"), io.load_gpu("h200")
    kw = {"gpu": h200, "tp": 8, "weights_dtype": DType.FP8, "kv_dtype": DType.FP8}
    assert trtllm_bench_caps(model, input_len=1000, output_len=1000, **kw) == (3328, 6656)  # type: ignore[arg-type]
    assert trtllm_bench_caps(model, input_len=2048, output_len=128, **kw)[1] == 32768  # type: ignore[arg-type]


def test_caps_broadcast_over_layouts() -> None:
    model, h100 = io.load_model("llama-3.1-70b"), io.load_gpu("h100-sxm")
    tps = np.array([2, 4, 8])
    kw = {"gpu": h100, "weights_dtype": DType.FP16, "kv_dtype": DType.FP16, "input_len": 1000, "output_len": 1000}
    batch, tokens = trtllm_bench_caps(model, tp=tps, **kw)  # type: ignore[arg-type]
    one = [trtllm_bench_caps(model, tp=int(t), **kw) for t in tps]  # type: ignore[arg-type]
    assert list(batch) == [b for b, _ in one] and list(tokens) == [t for _, t in one]


def test_a_step_carries_the_prompts_of_its_batch_within_its_token_cap() -> None:
    """2,048-token prompts for 128 output tokens: each sequence brings 16 prompt tokens per step on average, so
    8,192 tokens per step hold at most 8,192 / 17 = 481 sequences, whatever the KV cache holds."""
    s = resolve(
        "llama-3.1-8b", gpu="h200", gpus=1, context=2176, max_num_tokens=8192, weights_dtype="fp8", kv_dtype="fp8"
    )
    req = Requests(input_len=2048, output_len=128, concurrency=1e6)
    cap = capacity(s.model, s.shape, s.hw, s.layout, req)
    assert cap.limit is BatchLimit.MAX_TOKENS and cap.sequences == 8192 // 17
    decode_only = capacity(s.model, s.shape, s.hw, s.layout, req, prefill_in_step=False)
    assert decode_only.sequences > cap.sequences


def test_the_runs_token_cap_sizes_the_prefill_activations() -> None:
    small = resolve("llama-3.1-70b", gpu="h100-sxm", gpus=8, context=2000, max_num_tokens=2048)
    large = resolve("llama-3.1-70b", gpu="h100-sxm", gpus=8, context=2000, max_num_tokens=8192)
    assert small.shape.bill.activations_bytes == pytest.approx(large.shape.bill.activations_bytes / 4)
    assert small.shape.kv_budget_bytes > large.shape.kv_budget_bytes


def test_max_utilization_admits_sequences_by_the_cache_they_hold_not_the_whole_sequence() -> None:
    """TensorRT-LLM's GUARANTEED_NO_EVICT (its default) admits a request with KV room for I + O tokens; under
    MAX_UTILIZATION it admits as the cache grows, I + O/2 on average. Llama-2-70B FP8 on one H200 at 222 in /
    291 out: the same KV budget over 513 and over 367.5 tokens a sequence."""
    from meshplan.reports.serve import serve_report

    common = dict(gpu="h200", gpus=1, weights_dtype="fp8", input_len=222, output_len=291, concurrency=1)
    full = serve_report("llama-2-70b", **common)
    grow = serve_report("llama-2-70b", **common, capacity_scheduler="max-utilization")
    stated = serve_report("llama-2-70b", **common, capacity_scheduler="guaranteed-no-evict")
    assert stated["kv_sequences_per_replica"] == full["kv_sequences_per_replica"]
    budget = full["kv_budget_bytes_per_gpu"]
    per_token = full["kv_bytes_per_token_per_gpu"]
    assert full["kv_sequences_per_replica"] == math.floor(budget / (per_token * (222 + 291)))
    assert grow["kv_sequences_per_replica"] == math.floor(budget / (per_token * (222 + 291 / 2)))
    assert grow["kv_sequences_per_replica"] > full["kv_sequences_per_replica"]


def test_the_capacity_scheduler_is_tensorrt_llms_alone() -> None:
    from meshplan.reports.serve import serve_report

    with pytest.raises(ValueError, match="--capacity-scheduler is TensorRT-LLM's scheduler policy; vllm admits"):
        serve_report("llama-3.1-8b", gpu="h100-sxm", gpus=1, input_len=128, output_len=128, concurrency=4,
                     engine="vllm", capacity_scheduler="max-utilization")  # fmt: skip
