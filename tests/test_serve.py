"""The serving phase and load models: rooflines derived by hand, and properties that must hold."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from meshplan.core.serving.load import BatchLimit, Requests, capacity, load_point, step_at
from meshplan.core.serving.phases import decode_step, prefill
from meshplan.core.serving.shape import replica_shape
from meshplan.reports.serve import Setup, resolve
from meshplan.units import DType
from meshplan.validation.serving_typed import ideal_setup as _ideal


def setup(model: str = "llama-3.1-8b", gpu: str = "h100-sxm", **kw: object) -> Setup:
    args: dict[str, object] = {"gpus": 1, "context": 2048} | kw
    return resolve(model, gpu=gpu, **args)  # type: ignore[arg-type]


def test_llama8b_batch1_decode_is_bounded_by_the_weight_read() -> None:
    """8.03e9 parameters in bf16 are 16.06 GB; one H100 reads them at 3.35 TB/s in 4.79 ms per token."""
    s = setup()
    weights = 8_030_261_248 * 2
    assert s.shape.bill.weights_bytes == pytest.approx(weights, rel=1e-6)
    bound_s = weights / 3.35e12
    assert bound_s == pytest.approx(4.79e-3, rel=1e-3)
    ideal = _ideal(s)
    step = decode_step(ideal.model, ideal.shape, ideal.hw, ideal.layout, batch=1, context=1)
    assert step.total_s == pytest.approx(bound_s, rel=0.01)  # the KV of one token and one query add < 1%
    real = decode_step(s.model, s.shape, s.hw, s.layout, batch=1, context=1)
    # above the bound by the engine's HBM share and its fixed costs per step and per layer's kernels; published
    # batch-1 decode sits 1.4-1.8x above it (NIM's Llama 3.3 70B FP8 on 2 H100 at concurrency 1: 18.58 ms per token
    # where 70.6 GB / 2 / 3.35 TB/s is 10.5 ms)
    assert 1.2 * bound_s < real.total_s < 1.8 * bound_s


def test_prefill_flops_match_2_n_params_per_token() -> None:
    """A long prefill is compute bound: ~2 x 8e9 FLOPs per token (lm_head for the last token only)."""
    s = _ideal(setup())
    tokens = 8192
    f = prefill(s.model, s.shape, s.hw, s.layout, tokens=tokens)
    matmul = 8_030_261_248 - 2 * 128_256 * 4096  # embedding lookups and the head of all but one token: no FLOPs
    assert f.gemm_compute_s == pytest.approx(2 * matmul * tokens / 989.4e12, rel=0.01)
    # causal attention: 32 layers x 4 x T x T/2 x 32 heads x 128
    assert f.attention_compute_s == pytest.approx(32 * 4 * tokens * tokens / 2 * 4096 / 989.4e12, rel=1e-6)


def test_more_hbm_bandwidth_never_slows_decode() -> None:
    s = setup("llama-3.1-70b", gpus=8, tp=8)
    batch = np.array([1, 8, 64, 256, 1024])
    slow = decode_step(s.model, s.shape, s.hw, s.layout, batch=batch, context=3000).total_s
    hw = dataclasses.replace(s.hw, gpu=dataclasses.replace(s.hw.gpu, hbm_bandwidth_bytes_per_s=8e12))
    fast = decode_step(s.model, s.shape, hw, s.layout, batch=batch, context=3000).total_s
    assert np.all(fast <= slow) and fast[0] < slow[0]


def test_a_larger_batch_never_lowers_throughput_before_the_kv_limit() -> None:
    s = setup("llama-3.1-70b", gpu="h200", gpus=2, tp=2, weights_dtype="fp8", kv_dtype="fp8")
    req = Requests(input_len=1000, output_len=1000, concurrency=1e9)
    cap = capacity(s.model, s.shape, s.hw, s.layout, req)
    assert cap.limit is BatchLimit.KV_CACHE
    sizes = np.arange(1, cap.sequences + 1)
    throughput = sizes / step_at(s.model, s.shape, s.hw, s.layout, req, batch=sizes).total_s
    assert np.all(np.diff(throughput) >= 0)


@pytest.mark.parametrize("model", ["llama-3.1-70b", "mixtral-8x7b"])
def test_tp_never_increases_per_gpu_weight_reads(model: str) -> None:
    reads = []
    for tp in (1, 2, 4, 8):
        s = setup(model, gpus=tp, tp=tp)
        step = decode_step(s.model, s.shape, s.hw, s.layout, batch=16, context=1000)
        reads.append(step.weights_read_s)
    assert reads == sorted(reads, reverse=True) and reads[-1] < reads[0] / 6


def test_tp_all_reduce_pays_a_latency_floor_at_batch_1() -> None:
    """Batch-1 all-reduces are 8 KiB: the floor, not the bandwidth, sets their time (2 per layer)."""
    s = setup("llama-3.1-70b", gpus=8, tp=8)
    step = decode_step(s.model, s.shape, s.hw, s.layout, batch=1, context=100)
    floor = 2 * 80 * (s.hw.cal.allreduce_latency_s + 6 * s.hw.cal.allreduce_latency_per_rank_s)
    assert floor < step.tp_comm_s < 1.05 * floor


def test_custom_all_reduce_floor_grows_with_the_ranks_as_measured() -> None:
    """A one-shot all-reduce's small-message floor grows by what each peer adds: SGLang's port of TensorRT-LLM's
    kernel on H100 (pull request 2904) measures 3.7 / 5.9 us at 512 values and 4.5 / 7.8 us at 32,768 on 2 / 8
    ranks, 0.37-0.55 us per rank beyond two. The engines' per-rank term lies in that range, the floor is unchanged
    at TP2, and a TP8 decode step at batch 1 pays 2 x layers x 6 x that term more than its TP2 floor would."""
    from meshplan.core.serving.phases import allreduce_s

    measured = [(5.9e-6 - 3.7e-6) / 6, (7.8e-6 - 4.5e-6) / 6]
    for engine in ("trtllm", "vllm", "sglang"):
        cal = setup(engine=engine).hw.cal
        assert min(measured) <= cal.allreduce_latency_per_rank_s <= max(measured)
    s = setup("llama-3.1-70b", gpus=8, tp=8)
    link, cal = s.hw.link(8), s.hw.cal
    two = allreduce_s(0.0, n=2, link=link, kernel=cal.allreduce, floor_s=8e-6, per_rank_s=0.5e-6)
    eight = allreduce_s(0.0, n=8, link=link, kernel=cal.allreduce, floor_s=8e-6, per_rank_s=0.5e-6)
    assert float(two) == pytest.approx(8e-6) and float(eight) == pytest.approx(11e-6)
    step = decode_step(s.model, s.shape, s.hw, s.layout, batch=1, context=100)
    flat = dataclasses.replace(s.hw, cal=dataclasses.replace(cal, allreduce_latency_per_rank_s=0.0))
    before = decode_step(s.model, s.shape, flat, s.layout, batch=1, context=100)
    extra = 2 * 80 * 6 * cal.allreduce_latency_per_rank_s
    assert float(step.total_s - before.total_s) == pytest.approx(extra)
    ideal = _ideal(s)  # the bare roofline pays no floor
    assert float(decode_step(ideal.model, ideal.shape, ideal.hw, ideal.layout, batch=1, context=100).tp_comm_s) < 1e-12


def test_fp8_kv_halves_the_kv_read_and_doubles_capacity() -> None:
    bf16, fp8 = setup(kv_dtype="bf16"), setup(kv_dtype="fp8")
    assert fp8.shape.kv_bytes_per_token == bf16.shape.kv_bytes_per_token / 2
    req = Requests(input_len=1000, output_len=1000, concurrency=1e9)
    kv16 = capacity(bf16.model, bf16.shape, bf16.hw, bf16.layout, req).kv_sequences
    kv8 = capacity(fp8.model, fp8.shape, fp8.hw, fp8.layout, req).kv_sequences
    assert kv8 == pytest.approx(2 * kv16, abs=1)


def test_weight_only_int4_reads_a_quarter_and_computes_in_bf16() -> None:
    bf16, int4 = setup(), setup(weights_dtype="int4")
    assert int4.layout.quant.value == "weight-only"
    b, i = (decode_step(x.model, x.shape, x.hw, x.layout, batch=1, context=1) for x in (bf16, int4))
    assert 0.25 < i.weights_read_s / b.weights_read_s < 0.5  # 4.25 bits per weight, at the kernel's share


def test_fp4_weights_without_fp4_tensor_cores_run_weight_only_as_int4_does() -> None:
    """An H100 has no FP4 tensor cores: FP4 weights (gpt-oss's MXFP4 experts, an NVFP4 checkpoint) are dequantized
    inside the GEMM and computed in bf16, streamed at the engine's 4-bit weight-only share, NVFP4's 8-bit scale per
    16 values on top of the 4 bits; asking for W4A4 there is refused in one line."""
    int4, fp4 = setup(weights_dtype="int4", engine="vllm"), setup(weights_dtype="fp4", engine="vllm")
    assert fp4.layout.quant.value == "weight-only" and fp4.hw.cal.weight_only_bandwidth_share["fp4"] == 0.8
    a, b = (decode_step(x.model, x.shape, x.hw, x.layout, batch=1, context=1) for x in (int4, fp4))
    # Llama 3.1 8B's matmul weights: all 8,030,261,248 but the embedding and head (128,256 x 4,096 each) and the
    # norms (2 x 32 x 4,096 + 4,096), which stay 16-bit; a weight costs 1/16 byte of scale in NVFP4, 4/128 in int4
    quantized = 8_030_261_248 - 2 * 128_256 * 4_096 - (2 * 32 + 1) * 4_096
    extra_bytes = quantized * (1 / 16 - 4 / 128)
    assert fp4.shape.bill.weights_bytes - int4.shape.bill.weights_bytes == pytest.approx(extra_bytes, rel=1e-9)
    rate = fp4.hw.gpu.hbm_bandwidth_bytes_per_s * fp4.hw.cal.hbm_efficiency * 0.8  # both at the 4-bit share
    assert float(b.weights_read_s - a.weights_read_s) == pytest.approx(extra_bytes / rate, rel=1e-6)
    assert b.gemm_compute_s == pytest.approx(a.gemm_compute_s)  # both in bf16
    with pytest.raises(ValueError, match="no fp4 tensor cores: use weight-only"):
        setup(weights_dtype="fp4", quant="w-a")


def test_weights_left_out_are_the_dtype_the_model_is_published_in() -> None:
    """DeepSeek-V3 is released in FP8 and gpt-oss with MXFP4 experts: an engine loads them so, and serve's default
    does too, listing it among the defaults it applied; a model released in 16 bits lists nothing, and a dtype typed
    is kept."""
    from meshplan.reports.serve import serve_report

    kw = {"input_len": 128, "output_len": 256, "batch": 1}
    ds = serve_report("deepseek-v3", gpu="h200", gpus=8, tp=8, engine="sglang", **kw)  # type: ignore[arg-type]
    assert ds["weights_dtype"] == "fp8" and ds["quant"] == "w-a"
    assert ("weights_dtype", "fp8") in {(d["setting"], d["value"]) for d in ds["defaults_applied"]}
    oss = serve_report("gpt-oss-120b", gpu="h100-sxm", gpus=8, tp=8, engine="vllm", **kw)  # type: ignore[arg-type]
    assert oss["weights_dtype"] == "fp4" and oss["quant"] == "weight-only"
    llama = serve_report("llama-3.1-8b", gpu="h100-sxm", gpus=1, **kw)  # type: ignore[arg-type]
    assert llama["weights_dtype"] == "bf16"
    assert "weights_dtype" not in {d["setting"] for d in llama["defaults_applied"]}
    typed = serve_report("gpt-oss-120b", gpu="h100-sxm", gpus=8, tp=8, weights_dtype="bf16", **kw)  # type: ignore[arg-type]
    assert typed["weights_dtype"] == "bf16"
    assert "weights_dtype" not in {d["setting"] for d in typed["defaults_applied"]}


def test_moe_decode_reads_only_the_experts_its_tokens_pick() -> None:
    s = setup("mixtral-8x7b", gpus=2, tp=2)
    one = decode_step(s.model, s.shape, s.hw, s.layout, batch=1, context=100).weights_read_s
    many = decode_step(s.model, s.shape, s.hw, s.layout, batch=64, context=100).weights_read_s
    expert_share = s.shape.expert_weight_bytes / (s.shape.expert_weight_bytes + s.shape.dense_weight_bytes)
    assert one < many * (1 - expert_share * 0.7)  # top-2 of 8: a quarter of the experts at batch 1


def test_open_loop_beyond_capacity_saturates() -> None:
    s = setup()
    light = load_point(s.model, s.shape, s.hw, s.layout, Requests(input_len=500, output_len=500, rate_per_s=1.0))
    assert not light.saturated and light.limit is BatchLimit.LOAD
    assert light.ttft_s_p50 is not None and light.ttft_s_p99 is not None
    assert light.ttft_unloaded_s <= light.ttft_s_p50 <= light.ttft_s_p99
    heavy = load_point(s.model, s.shape, s.hw, s.layout, Requests(input_len=500, output_len=500, rate_per_s=1e4))
    assert heavy.saturated and heavy.ttft_s_p50 is None


def test_closed_loop_beyond_the_cap_queues() -> None:
    s = setup()
    req = Requests(input_len=500, output_len=500, concurrency=100, max_batch=32)
    pt = load_point(s.model, s.shape, s.hw, s.layout, req)
    assert pt.batch == 32 and pt.limit is BatchLimit.MAX_BATCH
    assert pt.queue_s_p50 > 0 and pt.ttft_s_p50 is not None and pt.ttft_s_p50 > pt.queue_s_p50
    # Little's law: the 68 waiting users wait (68 / requests per second)
    assert pt.queue_s_p50 == pytest.approx(68 / pt.requests_per_s, rel=1e-9)


def test_knee_is_below_the_cap_and_reaches_90_percent() -> None:
    s = setup()
    pt = load_point(s.model, s.shape, s.hw, s.layout, Requests(input_len=200, output_len=800, concurrency=1e9))
    assert 1 < pt.knee_batch < pt.capacity.sequences


def test_replica_shape_of_attention_dp_keeps_whole_attention() -> None:
    s = setup("deepseek-v3", gpu="h200", gpus=8, tp=8, ep=8, dp_attention=True, weights_dtype="fp8")
    plain = replica_shape(s.model, s.hw, dataclasses.replace(s.layout, dp_attention=False), context=2048)
    assert s.shape.dense_weight_bytes > plain.dense_weight_bytes
    assert s.shape.gemm_params_per_token > plain.gemm_params_per_token


@pytest.mark.parametrize(
    ("model", "gpus", "dtype"), [("llama-3.1-70b", 8, "bf16"), ("mixtral-8x7b", 2, "bf16"), ("llama-3.1-8b", 1, "fp8")]
)
def test_a_larger_batch_never_lowers_throughput_with_prompts_in_whole_chunks(model: str, gpus: int, dtype: str) -> None:
    s = setup(model, gpus=gpus, tp=gpus, weights_dtype=dtype, kv_dtype=dtype if dtype == "fp8" else "bf16")
    for i, o in ((1000, 1000), (2048, 128), (128, 2048)):
        req = Requests(input_len=i, output_len=o, concurrency=1e9)
        sizes = np.arange(1, capacity(s.model, s.shape, s.hw, s.layout, req).sequences + 1)
        throughput = sizes / step_at(s.model, s.shape, s.hw, s.layout, req, batch=sizes).total_s
        assert np.all(np.diff(throughput) >= -1e-9 * throughput[1:]), (i, o)


def test_a_prompt_rides_in_whole_chunks_not_a_trickle() -> None:
    """Mixtral-8x7B bf16 on two H100s at 1000/1000: at 248 sequences (the KV cache's limit) decode alone streams the
    weights, so the steps carrying a whole 1,000-token prompt (248 in 1,000) pay its math on top; spreading the
    prompt over every step (248 tokens riding each) would hide most of it under the weight read. At 1,024
    sequences every step carries a 1,024-token chunk and both readings agree."""
    s = setup("mixtral-8x7b", gpus=2, tp=2)
    req = Requests(input_len=1000, output_len=1000, concurrency=1e9)
    small = step_at(s.model, s.shape, s.hw, s.layout, req, batch=248)
    trickle = decode_step(s.model, s.shape, s.hw, s.layout, batch=248, context=1500, prefill_tokens=248)
    assert small.share == pytest.approx(0.248)
    assert float(small.plain.weights_read_s) > float(small.plain.gemm_compute_s)  # decode alone is weight bound
    assert float(small.total_s) > 1.05 * float(trickle.total_s)  # 7% here
    big = step_at(s.model, s.shape, s.hw, s.layout, req, batch=1024)
    full = decode_step(s.model, s.shape, s.hw, s.layout, batch=1024, context=1500, prefill_tokens=1024)
    assert big.share == 1.0 and float(big.total_s) == pytest.approx(float(full.total_s), rel=1e-12)


def test_gpt_fast_all_reduces_are_nccl_at_batch_1() -> None:
    """gpt-fast runs torch functional collectives: a batch-1 all-reduce of 8 KiB over two A100s is NCCL's LL
    protocol, 6.6 us base + 2 hops of 0.6 us (NCCL tuning.cc), twice per layer."""
    s = setup("llama-2-7b", gpu="a100-80gb", gpus=2, tp=2, engine="gpt-fast")
    step = decode_step(s.model, s.shape, s.hw, s.layout, batch=1, context=100)
    assert float(step.tp_comm_s) == pytest.approx(2 * 32 * 7.8e-6, rel=0.02)


def test_paged_kv_is_read_at_its_share_of_the_streaming_bandwidth() -> None:
    """TensorRT-LLM's paged KV cache is read at 0.81 of the bandwidth its weights stream at (PagedAttention's
    20-26% over a contiguous kernel); gpt-fast's static cache at the full streaming rate."""
    trt = setup()
    gf = setup(engine="gpt-fast")
    for s, share in ((trt, 0.81), (gf, 1.0)):
        step = decode_step(s.model, s.shape, s.hw, s.layout, batch=64, context=2000)
        kv_bytes = 64 * 2000 * s.shape.kv_bytes_per_token
        rate = s.hw.gpu.hbm_bandwidth_bytes_per_s * s.hw.cal.hbm_efficiency * share
        assert float(step.kv_read_s) == pytest.approx(kv_bytes / rate)


def test_engine_all_reduce_kernels_price_as_their_own_kernel_or_nccl() -> None:
    """TensorRT-LLM's own all-reduce: an 8 us floor plus the ring's bytes at every size (monotone in the batch);
    an NCCL engine pays NCCL's tuner price, 14 hop latencies on a ring of eight."""
    from meshplan.core.comm.cost import Collective, nccl_time
    from meshplan.core.serving.phases import allreduce_s
    from meshplan.core.serving.shape import AllReduceKernel

    s = setup("llama-3.1-70b", gpus=8, tp=8)
    link, cal = s.hw.link(8), s.hw.cal
    assert cal.allreduce is AllReduceKernel.CUSTOM
    bw = link.effective_bytes_per_s
    per_rank = cal.allreduce_latency_per_rank_s
    for size in (8e3, 8e6, 64e6):
        own = allreduce_s(
            size, n=8, link=link, kernel=cal.allreduce, floor_s=cal.allreduce_latency_s, per_rank_s=per_rank
        )
        assert float(own) == pytest.approx(cal.allreduce_latency_s + 6 * per_rank + 1.75 * size / bw)
        nccl = allreduce_s(size, n=8, link=link, kernel=AllReduceKernel.NCCL, floor_s=0.0)
        tuner = nccl_time(
            Collective.ALL_REDUCE,
            size_bytes=size,
            inner=8,
            outer=1,
            inner_bytes_per_s=bw,
            outer_bytes_per_s=bw,
            inner_latency_s=link.latency_s,
            outer_latency_s=link.latency_s,
        )
        assert float(nccl) == pytest.approx(float(tuner)) and float(nccl) > float(own)


def test_prefill_keys_count_each_query_by_hand() -> None:
    """A prefill chunk's queries reach c0 + T/2 keys on average in a full layer; in a W-token sliding layer a
    query at position i reaches min(i + 1, W), counted here one query at a time (0-based positions, the chunk
    taken from c0 to c0 + T - 1 and each query seeing itself), against the closed form."""
    from meshplan import io
    from meshplan.core.serving.shape import prefill_keys

    base = io.load_model("llama-3.1-8b")
    w = 256
    every = dataclasses.replace(base, sliding_window=w, num_sliding_layers=base.num_layers)
    half = dataclasses.replace(base, sliding_window=w, num_sliding_layers=base.num_layers // 2)
    for cached, chunk in ((0, 100), (0, 1000), (100, 300), (300, 200), (1000, 512)):
        by_hand = sum(min(i + 1, w) for i in range(cached, cached + chunk)) / chunk
        full_by_hand = sum(i + 1 for i in range(cached, cached + chunk)) / chunk
        # the closed form counts i keys for query i (positions from 0, self excluded): within half a key
        assert prefill_keys(every, cached=cached, chunk=chunk) == pytest.approx(by_hand, abs=0.5)
        assert prefill_keys(base, cached=cached, chunk=chunk) == pytest.approx(full_by_hand, abs=0.5)
        mixed = (by_hand + full_by_hand) / 2
        assert prefill_keys(half, cached=cached, chunk=chunk) == pytest.approx(mixed, abs=0.5)


def test_mla_decode_attention_runs_at_flashmla_s_published_rates_on_hopper() -> None:
    """DeepSeek-V3's decode attention (absorbed MLA: 128 heads against the 512 + 64 latent cache) on one H100 at
    256 sequences of 2,000 cached tokens: compute at 660 of 989.4 TFLOP/s and the bf16 latent cache read at 3,000
    GB/s, FlashMLA's published H800 rates (same SMs, clocks and HBM), written out again; GQA models keep the
    engine family's shares, and so does MLA on a generation no such kernel was published for."""
    s = setup("deepseek-v3", gpus=72, ep=72, tp=72, dp_attention=True, weights_dtype="fp8", engine="sglang",
              context=2001)  # fmt: skip
    step = decode_step(s.model, s.shape, s.hw, s.layout, batch=256, context=2000)
    layers, heads, latent, rope = 61, 128, 512, 64
    flops = 256 * 2000 * layers * 2 * heads * (2 * latent + rope)  # q.k over 576 dims, p.v over 512, per head
    assert step.attention_compute_s == pytest.approx(flops / 660e12, rel=1e-9)
    cache_bytes = 256 * 2000 * layers * (latent + rope) * 2
    assert step.kv_read_s == pytest.approx(cache_bytes / 3000e9, rel=1e-9)

    gqa = setup("llama-3.1-70b", gpus=8, tp=8, context=2001)
    cal = gqa.hw.cal
    plain = decode_step(gqa.model, gqa.shape, gqa.hw, gqa.layout, batch=64, context=2000)
    pairs_flops = 64 * 2000 * 80 * 4 * 64 * 128 / 8  # QK^T and AV, 64 query heads of 128 over TP 8
    assert plain.attention_compute_s == pytest.approx(pairs_flops / (989.4e12 * cal.attention_efficiency), rel=1e-9)

    elsewhere = setup("deepseek-v3", gpu="mi300x", gpus=8, tp=8, weights_dtype="fp8", context=2001)
    other = decode_step(elsewhere.model, elsewhere.shape, elsewhere.hw, elsewhere.layout, batch=64, context=2000)
    share = elsewhere.hw.cal.attention_efficiency
    peak = elsewhere.hw.gpu.peak(DType.BF16)
    mi_flops = 64 * 2000 * layers * 2 * heads * (2 * latent + rope) / 8
    assert other.attention_compute_s == pytest.approx(mi_flops / (peak * share), rel=1e-9)


def test_an_unknown_mla_decode_kernel_is_refused() -> None:
    from meshplan.spec.cluster import GpuCalibration

    with pytest.raises(ValueError, match="mla_decode_kernel must be one of"):
        GpuCalibration(mla_decode_kernel="flashmla-2")


def test_fp8_gemms_run_at_the_gpu_kinds_fp8_share() -> None:
    """An FP8 serving GEMM runs at the FP8 peak times the kind's large-GEMM share and its FP8 MAMF ratio (the
    training law's e_max x fp8_matmul_ratio, 0.8965 on H100), the engine adding no share of its own: re-derived
    for a compute-bound 4,096-token prefill of Llama 3.1 8B on one H100."""
    s = setup(weights_dtype="fp8")
    gpu, sh = s.hw.gpu, s.shape
    assert s.hw.cal.matmul_share["fp8"] == 1.0
    tokens = 4096.0
    pre = prefill(s.model, sh, s.hw, s.layout, tokens=tokens)
    e = gpu.calibration.matmul_efficiency_max * gpu.calibration.fp8_matmul_ratio
    assert gpu.calibration.fp8_matmul_ratio == pytest.approx(0.8965)
    rows = tokens / (tokens + gpu.calibration.matmul_half_dim)
    flops = 2 * (sh.gemm_params_per_token * tokens + sh.lm_head_params * 1.0) * sh.gemm_depth
    assert float(pre.gemm_compute_s) == pytest.approx(flops / (gpu.peak(DType.FP8) * e * rows))
    faster = dataclasses.replace(gpu, calibration=dataclasses.replace(gpu.calibration, fp8_matmul_ratio=1.0))
    pre1 = prefill(s.model, sh, dataclasses.replace(s.hw, gpu=faster), s.layout, tokens=tokens)
    assert float(pre.gemm_compute_s / pre1.gemm_compute_s) == pytest.approx(1 / 0.8965)


def test_a_prefill_layer_pays_at_least_the_decode_layers_fixed_cost() -> None:
    """A prefill layer runs the decode layer's kernels outside a CUDA graph; the graph removes the host's launches,
    not each kernel's start and drain (gpt-fast's 45.9 us a layer), so no engine prices a prefill layer below it:
    a 128-token prefill of Llama 3.1 8B pays the step's fixed cost and 32 x 45.9 us."""
    for engine in ("trtllm", "vllm", "sglang", "gpt-fast"):
        s = setup(engine=engine)
        cal = s.hw.cal
        assert cal.prefill_layer_overhead_s >= cal.layer_overhead_s == pytest.approx(45.9e-6)
        pre = prefill(s.model, s.shape, s.hw, s.layout, tokens=128.0)
        assert float(pre.overhead_s) == pytest.approx(cal.step_overhead_s + 32 * 45.9e-6)
