"""Serving beyond one source per class: ``serve --batch``, the released rows typed as serve's flags, the engines'
defaults, serve-plan's quality guard, the coverage warnings and the source-weighted serving band."""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import pytest

from meshplan.cli import main
from meshplan.core.serving.load import Requests, load_point
from meshplan.core.serving.phases import decode_step, prefill
from meshplan.core.serving.static import prefill_pieces
from meshplan.reports.serve import resolve, serve_report
from meshplan.reports.serve_plan import serve_plan_report
from meshplan.validation.serving import predict_rows, reference_rows
from meshplan.validation.serving_band import t90, weighted_quantile, widening

H100 = {"gpu": "h100-sxm", "gpus": 1}


def test_a_static_batch_ttft_is_the_prefill_of_all_its_prompts_by_hand() -> None:
    """4 prompts of 512 tokens fit one forward of the engine's 8,192 tokens: TTFT = one prefill of 2,048 tokens whose
    4 sequences each attend 512 x 256 pairs; TPOT = the decode step of 4 sequences at 512 + 64/2 tokens."""
    r = serve_report("llama-3.1-8b", **H100, input_len=512, output_len=64, batch=4)
    s = resolve("llama-3.1-8b", **H100, context=576)
    alone = float(prefill(s.model, s.shape, s.hw, s.layout, tokens=2048, sequences=4).total_s)
    step = float(decode_step(s.model, s.shape, s.hw, s.layout, batch=4, context=544).total_s)
    assert r["static_batch"]["prefill_forwards"] == 1
    assert r["ttft_s_p50"] == r["ttft_s_p99"] == r["static_batch"]["ttft_s"] == pytest.approx(alone, rel=1e-12)
    assert r["tpot_s"] == pytest.approx(step, rel=1e-12)
    assert r["static_batch"]["run_s"] == pytest.approx(alone + 63 * step, rel=1e-12)
    assert r["tokens_per_s_total"] == pytest.approx(4 * 64 / (alone + 63 * step), rel=1e-12)
    # a batch of one is one prompt's prefill: serve's unloaded TTFT
    one = serve_report("llama-3.1-8b", **H100, input_len=512, output_len=64, batch=1)
    assert one["static_batch"]["ttft_s"] == pytest.approx(one["ttft_s_unloaded"], rel=1e-12)


def test_a_static_batch_is_chunked_as_the_engine_chunks_it() -> None:
    """4 prompts of 4,096 tokens at --max-num-tokens 8192: two forwards of two whole prompts each; at 3,000 tokens a
    step, the prompts laid end to end are cut mid-prompt and each cut piece attends its own earlier tokens."""
    r = serve_report("llama-3.1-8b", **H100, input_len=4096, output_len=16, batch=4, max_num_tokens=8192)
    s = resolve("llama-3.1-8b", **H100, context=4112, max_num_tokens=8192)
    two = float(prefill(s.model, s.shape, s.hw, s.layout, tokens=8192, sequences=2).total_s)
    assert r["static_batch"]["prefill_forwards"] == 2
    assert r["static_batch"]["ttft_s"] == pytest.approx(2 * two, rel=1e-12)
    p = prefill_pieces(batch=2, input_len=5, max_num_tokens=3)  # tokens 0-2 | 3-4 of prompt 1, 0 of 2 | 1-4 ...
    assert list(p.tokens) == [3, 3, 3, 1] and list(p.finished) == [0, 1, 0, 1]
    assert list(p.cached) == [0, 3, 1, 4] and list(p.head) == [3, 2, 3, 1] and list(p.tail) == [0, 1, 0, 0]
    full = [sum(k + 0.5 for k in range(a, b)) for a, b in ((0, 3), (3, 5), (0, 1), (1, 4), (4, 5))]
    s8 = resolve("llama-3.1-8b", **H100, context=5)
    assert list(p.pairs(s8.model)) == pytest.approx([full[0], full[1] + full[2], full[3], full[4]])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"concurrency": 4.0}, "--batch is a load of its own"),
        ({"num_requests": 4}, "--batch is a load of its own"),
        ({"max_batch": 2}, "--max-batch 2"),
        ({"disaggregate": "1:1", "gpus": 2}, "drop --disaggregate"),
    ],
)
def test_a_static_batch_is_refused_beside_another_load(extra: dict[str, Any], message: str) -> None:
    args = {**H100, "input_len": 512, "output_len": 64, "batch": 4} | extra
    with pytest.raises(ValueError, match=message):
        serve_report("llama-3.1-8b", **args)


def test_a_static_batch_must_fit_the_kv_cache_whole() -> None:
    """A static batch holds every sequence at once: more than the KV cache takes is refused, not queued."""
    with pytest.raises(ValueError, match=r"64 sequences per replica, but .* fit in the KV cache"):
        serve_report("llama-3.1-70b", gpu="h100-sxm", gpus=2, input_len=8000, output_len=64, batch=64)


def test_serve_batch_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["serve", "llama-2-70b", "--gpu", "a100-80gb", "--gpus", "2", "--input-len", "512", "--output-len", "128"]
    assert main([*argv, "--batch", "16"]) == 0
    out = capsys.readouterr().out
    assert "TTFT (the batch's prefill)" in out and "defaults applied (not typed)" in out
    assert main([*argv, "--batch", "16", "--rate", "1"]) == 2
    assert "not allowed with" in capsys.readouterr().err


@cache
def _rows() -> list[Any]:
    return [p for r in reference_rows() for p in predict_rows(r)]


def test_the_released_rows_load_and_evaluate() -> None:
    """Splitwise's 14 static batches (prefill and decode each) and NIM's 7 closed-loop points (TTFT, ITL and
    tokens/s each) are predicted, counted, and none is beyond its ideal roofline."""
    by_source: dict[str, list[Any]] = {}
    for r in _rows():
        by_source.setdefault(r.source, []).append(r)
    sw, nim = by_source["splitwise_perf_csv"], by_source["nim_bench_llm"]
    assert len(sw) == 28 and {r.metric for r in sw} == {"prefill_time_ms", "decode_step_time_ms"}
    assert len(nim) == 21 and {r.metric_class for r in nim} == {"prefill", "decode", "throughput-dense"}
    assert all(r.status == "ok" and r.predicted and math.isfinite(r.predicted) for r in sw + nim)
    assert all(r.predicted > r.roofline if r.metric.endswith("_ms") else r.predicted < r.roofline for r in sw + nim)
    assert {r.case.split("_")[2] for r in sw} == {"llama2-70b", "bloom-176b"}  # BLOOM typed as the catalog's model


def test_a_released_row_is_what_serve_answers_its_flags() -> None:
    """NIM's concurrency-25 point and Splitwise's 16-prompt batch, typed as a user types them: the validation's
    predictions are serve's own figures (the KV dtype, the caps and NIM's engine left to serve's defaults;
    Splitwise's engine, vLLM 0.2, as its paper states it)."""
    rows = {(r.case, r.metric): r.predicted for r in _rows()}
    nim = serve_report("llama-3.3-70b", gpu="h100-sxm", gpus=2, tp=2, weights_dtype="fp8", input_len=5000,
                       output_len=500, concurrency=25)  # fmt: skip
    case = "nim180_h100x2_l33-70b_fp8_tp2_5000_500_c25"
    assert (
        nim["kv_dtype"] == "fp8"
        and {"setting": "kv_dtype", "value": "fp8"}.items() <= nim["defaults_applied"][0].items()
    )
    assert rows[(case, "ttft_ms")] == pytest.approx(1e3 * nim["ttft_s_mean"], rel=1e-12)  # NIM publishes the mean
    assert rows[(case, "itl_ms")] == pytest.approx(1e3 * nim["tpot_s"], rel=1e-12)
    assert rows[(case, "output_tokens_per_s_total")] == pytest.approx(nim["tokens_per_s_total"], rel=1e-12)
    sw = serve_report("llama-2-70b", gpu="h100-sxm", gpus=2, tp=2, input_len=512, output_len=128, batch=16,
                      engine="vllm-0.2")  # fmt: skip
    case = "sw_h100_llama2-70b_tp2_p512_b16"
    assert rows[(case, "prefill_time_ms")] == pytest.approx(1e3 * sw["static_batch"]["ttft_s"], rel=1e-12)
    assert rows[(case, "decode_step_time_ms")] == pytest.approx(1e3 * sw["tpot_s"], rel=1e-12)


def test_prompts_wait_for_the_step_budget_the_prompts_ahead_hold() -> None:
    """NIM's 5,000-token prompts at 50 users: one prompt fills a TensorRT-LLM step's budget (chunked context off), so
    a prompt waits M/D/1 for the ones ahead: rho = share x t_carrying / t, service one carrying step, mean wait
    rho S / (2 (1 - rho)), on top of its own prefill and half a step."""
    s = resolve("llama-3.3-70b", gpu="h100-sxm", gpus=2, tp=2, weights_dtype="fp8", context=5500)
    req = Requests(input_len=5000, output_len=500, concurrency=50.0)
    pt = load_point(s.model, s.shape, s.hw, s.layout, req)
    carrying, mean, share = float(pt.step.carrying.total_s), float(pt.step.total_s), float(pt.step.share)
    rho = share * carrying / mean
    assert 0.5 < rho < 0.8 and share == pytest.approx(50 / 500)
    first = serve_report("llama-3.3-70b", gpu="h100-sxm", gpus=2, tp=2, weights_dtype="fp8", input_len=5000,
                         output_len=500, concurrency=1)  # fmt: skip
    wait = rho * carrying / (2 * (1 - rho))
    own = pt.ttft_s_mean - pt.tpot_s / 2 - wait
    assert wait > 0.3 and own == pytest.approx(carrying, rel=0.02)
    assert first["ttft_s_mean"] < pt.ttft_s_mean - wait + 0.05


def test_engine_defaults_for_what_the_user_leaves_out() -> None:
    """TensorRT-LLM keeps an FP8 KV cache with FP8 weights; vLLM and SGLang the model's 16-bit dtype; int4 groups of
    128 (AWQ/GPTQ), 32 in gpt-fast's quantize.py; each default applied is listed, a typed value is not."""
    kv = {e: resolve("llama-3.1-8b", **H100, weights_dtype="fp8", engine=e, context=1024).layout.kv_dtype.value
          for e in ("trtllm", "vllm", "sglang")}  # fmt: skip
    assert kv == {"trtllm": "fp8", "vllm": "bf16", "sglang": "bf16"}
    groups = {e: resolve("llama-2-7b", gpu="a100-80gb", gpus=1, weights_dtype="int4", engine=e, context=1024)
              for e in ("trtllm", "gpt-fast")}  # fmt: skip
    assert {e: s.layout.quant_group for e, s in groups.items()} == {"trtllm": 128, "gpt-fast": 32}
    assert groups["gpt-fast"].shape.bill.weights_bytes > 1.1 * groups["trtllm"].shape.bill.weights_bytes  # scales
    typed = resolve("llama-2-7b", gpu="a100-80gb", gpus=1, weights_dtype="int4", quant_group=64, context=1024)
    assert typed.layout.quant_group == 64 and "int4_group_size" not in {d[0] for d in typed.defaults}
    applied = {d[0] for d in groups["gpt-fast"].defaults}
    assert {"kv_dtype", "int4_group_size", "quant", "gpu_memory_utilization", "max_num_tokens"} <= applied
    r = serve_report("llama-3.1-8b", **H100, input_len=512, output_len=64, concurrency=4, kv_dtype="bf16")
    assert "kv_dtype" not in {d["setting"] for d in r["defaults_applied"]}


def test_serve_plan_quantizes_only_when_allowed() -> None:
    """A bf16 model is searched in bf16 (and its engine's default KV) unless --allow-quantization; asking for fp8
    weights without it is refused, not dropped; DeepSeek-V3, published in FP8, is searched in FP8 as well."""
    args = {"gpu": "h100-sxm", "gpus": 8, "input_len": 1024, "output_len": 256, "top": 50}
    plain = serve_plan_report("llama-2-70b", **args)  # type: ignore[arg-type]
    assert plain["weights_dtypes_searched"] == ["bf16"]
    assert {(p["layout"]["weights_dtype"], p["layout"]["kv_dtype"]) for p in plain["top"]} == {("bf16", "bf16")}
    assert any("--allow-quantization" in w for w in plain["warnings"])
    with pytest.raises(ValueError, match="add --allow-quantization"):
        serve_plan_report("llama-2-70b", **args, dtypes=["fp8"])  # type: ignore[arg-type]
    allowed = serve_plan_report("llama-2-70b", **args, allow_quantization=True)  # type: ignore[arg-type]
    assert allowed["weights_dtypes_searched"] == ["bf16", "fp8", "int8", "int4"] and not allowed["warnings"]
    assert {p["layout"]["weights_dtype"] for p in allowed["top"]} - {"bf16"}
    ds = serve_plan_report("deepseek-v3", gpu="h200", gpus=8, input_len=1024, output_len=256, dtypes=["fp8"])
    assert ds["weights_dtypes_searched"] == ["fp8"]


def test_serve_plan_refusal_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["serve-plan", "llama-2-70b", "--gpu", "h100-sxm", "--gpus", "8", "--input-len", "1024", "--output-len"]
    assert main([*argv, "256", "--weights-dtypes", "fp8"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--allow-quantization" in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_gpu_kinds_and_model_classes_without_a_published_row_say_so() -> None:
    """As estimate does for a GPU kind no training run ran on: serve and serve-plan name what no published serving
    measurement covers (h800; a sliding-window model), and say nothing where they do (Llama on H100)."""
    r = serve_report("mistral-7b", gpu="h800", gpus=1, input_len=512, output_len=64, concurrency=4)
    gpu, cls = r["warnings"]
    assert gpu.startswith("h800: none of the") and "published serving measurements" in gpu and "h100-sxm" in gpu
    assert "mistral-7b is a dense model with sliding-window attention: none of the" in cls
    assert serve_report("llama-3.1-8b", **H100, input_len=512, output_len=64, concurrency=4)["warnings"] == []
    plan = serve_plan_report("mistral-7b", gpu="h800", gpus=1, input_len=512, output_len=64, top=1)
    assert plan["warnings"][:2] == r["warnings"]


def test_student_t_quantiles_and_the_widening_rule() -> None:
    """t_0.90 against the tables (1 to 30 degrees of freedom); the band widens by t(k-1) sqrt(1+1/k) / z."""
    table = {1: 3.078, 2: 1.886, 3: 1.638, 4: 1.533, 5: 1.476, 6: 1.440, 8: 1.397, 10: 1.372, 20: 1.325, 30: 1.310}
    for df, t in table.items():
        assert t90(df) == pytest.approx(t, abs=0.002)
    assert widening(1) == 0 and widening(4) == pytest.approx(1.638 * math.sqrt(1.25) / 1.2816, abs=0.002)
    assert widening(2) > widening(3) > widening(10) > 1


def test_every_source_weighs_the_same_in_the_band() -> None:
    """Ten rows of one source and one row of another weigh alike: the one row holds half the weight (its value is the
    0.75 quantile, each value at the middle of its weight), where counted by rows it would be the top 9%."""
    values, weights = [0.0] * 10 + [1.0], [0.1] * 10 + [1.0]
    assert weighted_quantile(values, weights, 0.75) == pytest.approx(1.0)
    assert weighted_quantile(values, [1.0] * 11, 0.75) == pytest.approx(0.0)
    assert 0 < weighted_quantile(values, weights, 0.5) < 1
    assert weighted_quantile([1.0, 2.0, 3.0], [1, 1, 1], 0.5) == 2.0
    assert weighted_quantile([1.0, 2.0, 3.0], [1, 1, 1], 0.0) == 1.0 and weighted_quantile([1.0, 3.0], [1, 1], 1) == 3


def test_the_band_names_its_sources() -> None:
    from meshplan import io

    band = io.serving_held_out_band()
    for cls, sources in (("decode", 4), ("prefill", 4), ("throughput_dense", 5), ("throughput_moe", 1)):
        assert band[f"{cls}_sources"] == sources and band[f"{cls}_runs"] >= 16
        assert band[f"{cls}_time_ratio_p10"] < band[f"{cls}_time_ratio_p50"] < band[f"{cls}_time_ratio_p90"]
    text = serve_report("llama-3.1-8b", **H100, input_len=512, output_len=64, concurrency=4)["uncertainty"]
    assert "TPOT from 32 runs of 4 sources" in text and "each source weighing the same" in text
