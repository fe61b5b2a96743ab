"""The published serving measurements as regression bounds (docs/validation.md has the tables).

Each bound is the error reached when the bound was set plus a small margin: a change to the serving
model that makes a metric worse fails here.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

# metric class: (mean |error| at most, max |error| at most)
# Set when the steady step became a mix of decode-only and chunk-carrying steps, paged KV reads kept 0.81 of the
# streaming bandwidth, TensorRT-LLM's grouped expert GEMMs streamed their weights at the same 0.75 share as their
# math, gpt-fast's constants came from its README's own numbers (1,700 GB/s peak, a per-layer kernel floor, NCCL
# all-reduces), and the TensorRT-LLM row under the engine's 10 GB KV warning stopped counting: decode 0.095 ->
# 0.046 (max 0.149), prefill 0.079 -> 0.079 (0.285), dense throughput 0.185 -> 0.128 (max 1.01 -> 0.432),
# MoE 0.184 -> 0.090 (0.227). Then SGLang's decode got two-batch overlap as two micro-batches (each reads the weights,
# half the GEMM rows), DeepEP's low-latency kernels at their published RDMA rate and the overlap share of the blog's
# own TBO ablation: decode 0.046 -> 0.039 (max 0.149 -> 0.138). Then the TensorRT-LLM throughput rows got
# trtllm-bench's own max batch / max tokens, a step's prompts within its token cap, the run's stated number of
# requests as an offline run (ramp and drain) and the PyTorch-backend recipe's CUDA-graph padding of decode-only
# steps: dense throughput 0.128 -> 0.112 (max 0.432 -> 0.335), MoE 0.090 -> 0.076 (max 0.227 -> 0.192). Then the
# GEMM shape law (a GEMM of short K or narrow N runs below the plateau, at each dtype's ridge point) with H100's
# plateau refitted: decode 0.039 -> 0.041 (SGLang's DeepSeek-V3 row, whose FP8 expert down projections have K =
# 2,048, -7.4% -> -9.4%), prefill 0.078 -> 0.075, dense throughput 0.112 -> 0.111 (max 0.335 -> 0.321), MoE
# 0.078 -> 0.064 (max 0.195 -> 0.174).
BOUNDS = {
    "decode": (0.042, 0.14),
    "prefill": (0.08, 0.29),
    "throughput-dense": (0.115, 0.34),
    "throughput-moe": (0.08, 0.195),
}
"""On the rows of the sources before the released ones (the MoE rows, catalog/serving/runs_moe.json, are held out:
0.076 mean, 0.192 max, under the 25% target). Adding the released sources moved none of these rows."""
RELEASED = ("splitwise_perf_csv", "nim_bench_llm")
"""The released sources added to the catalog (Splitwise's profiles, NIM's sweep), typed as serve's flags."""
ALL_BOUNDS = {
    "decode": (0.205, 0.56),
    "prefill": (0.165, 0.50),
    "throughput-dense": (0.12, 0.33),
    "throughput-moe": (0.065, 0.175),
}
"""Every counted row, the released sources included (decode 20.0% / 55.7%, prefill 16.1% / 49.3% with the prompt
queue, dense throughput 11.7% / 32.1%, MoE 6.4% / 17.4%)."""


@pytest.fixture
def result(serving_validation_report: dict[str, Any]) -> dict[str, Any]:
    """The session's report (tests/conftest.py): computed once for every test that reads it."""
    return serving_validation_report


@cache
def rows() -> list[Any]:
    from meshplan.validation.serving import predict_rows, reference_rows

    return [p for r in reference_rows() for p in predict_rows(r)]


@cache
def old_summary() -> dict[str, Any]:
    """The summary over the sources before the released ones, each held out with the others of them only."""
    from meshplan.validation.serving import summarize

    return summarize([r for r in rows() if r.source not in RELEASED])


def _class(summary: dict[str, Any], cls: str) -> dict[str, Any]:
    (row,) = [c for c in summary["classes"] if c["metric_class"] == cls]
    return row


@pytest.mark.parametrize("cls", sorted(BOUNDS))
def test_error_bounds(cls: str) -> None:
    row = _class(old_summary(), cls)
    mean, worst = BOUNDS[cls]
    assert row["mean_abs_error"] <= mean and row["max_abs_error"] <= worst


@pytest.mark.parametrize("cls", sorted(ALL_BOUNDS))
def test_error_bounds_with_the_released_sources(cls: str, result: dict[str, Any]) -> None:
    row = _class(result, cls)
    mean, worst = ALL_BOUNDS[cls]
    assert row["mean_abs_error"] <= mean and row["max_abs_error"] <= worst


@pytest.mark.parametrize("cls", sorted(BOUNDS))
def test_beats_three_quarters_of_the_best_single_efficiency_constant(cls: str) -> None:
    """The issue's bar: every metric below 0.75 x the best single constant fitted on its own answers (on the sources
    the constants were set on; with the released sources decode and prefill miss it, and the report says so)."""
    row = _class(old_summary(), cls)
    assert row["mean_abs_error"] < 0.75 * row["best_constant_mean_abs_error"]


LOSO_BOUNDS = {"decode": 0.075, "prefill": 0.085, "throughput-dense": 0.125, "throughput-moe": 0.06}
"""Leave-one-source-out means when set (decode 0.132 -> 0.091 with SGLang's two-batch overlap modelled; dense
throughput 0.144 -> 0.128 and MoE 0.090 -> 0.076 with trtllm-bench's caps, offline runs and graph padding). The
GEMM shape law: prefill 0.093 -> 0.078, MoE 0.078 -> 0.064, and decode 0.091 -> 0.110, above its 10% target: the
ten gpt-fast rows are held out by the correction of the one SGLang row, which the law moved from -7.4% to -9.4%.
MLA's decode attention at FlashMLA's published rates on Hopper: that row -9.4% -> -2.5%, decode 0.110 -> 0.045.
The correction averaged per source (each source weighing the same): dense 0.129 -> 0.127, the others unchanged.
A dense layer's fixed decode cost inside CUDA graphs (gpt-fast's 45.9 us) on every graph engine: dense 0.127 ->
0.122, MoE 0.064 -> 0.056, and decode 0.045 -> 0.071: of these sources' two, the one SGLang row goes from -2.5% to
+5.3% and holds the ten gpt-fast rows out with that correction (over every source decode improves: 0.252 -> 0.220)."""
ALL_LOSO_BOUNDS = {"decode": 0.225, "prefill": 0.195, "throughput-dense": 0.115, "throughput-moe": 0.06}
"""With the released sources (decode 0.252, prefill 0.190, dense 0.125, MoE 0.064): the gpt-fast and SGLang decode
rows held out by corrections the Splitwise and NIM rows now pull, and the other way round. With every graph
engine's fixed cost per dense layer: decode 0.220, prefill 0.189, dense 0.109, MoE 0.056."""


@pytest.mark.parametrize("cls", sorted(LOSO_BOUNDS))
def test_held_out_errors_do_not_regress(cls: str, result: dict[str, Any]) -> None:
    assert _class(old_summary(), cls)["loso_mean_abs_error"] <= LOSO_BOUNDS[cls]
    assert _class(result, cls)["loso_mean_abs_error"] <= ALL_LOSO_BOUNDS[cls]


def test_targets_met_are_reported_as_met(result: dict[str, Any]) -> None:
    """A class is ok when its mean and its leave-one-source-out mean are both within the target (decode's held-out
    mean was 13.2%, reported as FAIL, until SGLang's two-batch overlap was modelled; 11.0%, FAIL again, once the
    GEMM shape law moved the SGLang row the gpt-fast rows are held out by; 4.5% with MLA's decode kernel priced).
    With the released sources, decode (Splitwise's unknown engine 35% slower than the model) and prefill miss their
    targets, and the report says so."""
    ok = {c["metric_class"]: c["ok"] for c in old_summary()["classes"]}
    assert ok == {"decode": True, "prefill": True, "throughput-dense": True, "throughput-moe": True}
    ok = {c["metric_class"]: c["ok"] for c in result["classes"]}
    assert ok == {"decode": False, "prefill": False, "throughput-dense": True, "throughput-moe": True}
    assert not result["all_ok"]


def test_the_row_the_engine_warns_about_is_shown_not_counted(result: dict[str, Any]) -> None:
    """Llama-3.1-70B FP8 on one H100: the bill leaves 8.4 GB of KV cache, under trtllm-bench's own 10 GB warning;
    it is the only such row, shown with its prediction and not counted."""
    warned = [r for r in result["runs"] if r["status"] == "warned"]
    assert [r["case"] for r in warned] == ["trt014_h100_l31-70b_fp8_tp1_1000_1000"]
    (row,) = warned
    assert row["predicted"] > row["measured"] and "trtllm-bench warns" in row["reason"]


def test_the_row_above_the_hbm_limit_is_flagged_not_fitted(result: dict[str, Any]) -> None:
    runs = {r["case"]: r for r in result["runs"]}
    mixtral = runs["trt09_a100_mixtral_tp2_bs32_2048_2048"]
    assert mixtral["status"] == "physics" and mixtral["measured"] > mixtral["roofline"]
    flagged = [r["case"] for r in result["runs"] if r["status"] == "physics"]
    assert flagged == ["trt09_a100_mixtral_tp2_bs32_2048_2048"]


def test_no_clean_row_beats_its_ideal_roofline(result: dict[str, Any]) -> None:
    for r in result["runs"]:
        if r["status"] == "ok":
            faster = r["measured"] < r["roofline"] if r["metric"].endswith("_ms") else r["measured"] > r["roofline"]
            assert not faster, r["case"]


def test_tp_trend_follows_the_measurements(result: dict[str, Any]) -> None:
    """TensorRT-LLM 0.14, Llama-3.1-70B FP8 on H200: per-GPU throughput falls from TP1 to TP8 (a
    communication-free roofline gets this backwards); the model's per-GPU ratio is within 15 points."""
    runs = {r["case"]: r for r in result["runs"]}
    tp1 = runs["trt014_h200_l31-70b_fp8_tp1_1000_1000"]
    tp8 = runs["trt014_h200_l31-70b_fp8_tp8_1000_1000"]
    measured = (tp8["measured"] / 8) / tp1["measured"]
    predicted = (tp8["predicted"] / 8) / tp1["predicted"]
    assert measured < 1 and predicted < 1
    assert abs(predicted - measured) <= 0.15


def test_int8_and_int4_speedups_follow_the_measurements(result: dict[str, Any]) -> None:
    """gpt-fast Llama-2-7B batch-1 decode: INT8 and INT4 speed-ups over BF16 within 15 points."""
    runs = {r["case"]: r for r in result["runs"]}
    base = runs["gptfast_a100_l2-7b_bf16_tp1"]
    for q in ("int8", "int4"):
        r = runs[f"gptfast_a100_l2-7b_{q}_tp1"]
        measured, predicted = r["measured"] / base["measured"], r["predicted"] / base["predicted"]
        assert predicted > 1 and abs(predicted - measured) <= 0.15, q


def test_moe_throughput_is_its_own_metric_on_held_out_rows(result: dict[str, Any]) -> None:
    """The 16 Mixtral rows of TensorRT-LLM 0.14 are counted under throughput-moe, not dense, and meet the
    issue's 25% target; the only MoE throughput row of the shared set is flagged (beyond its roofline)."""
    moe = [r for r in result["runs"] if r["metric_class"] == "throughput-moe" and r["status"] == "ok"]
    assert len(moe) == 16 and not any(r["shared"] for r in moe)
    assert all(r["case"].startswith("trt014_") and "mixtral" in r["case"] for r in moe)
    (row,) = [c for c in result["classes"] if c["metric_class"] == "throughput-moe"]
    assert row["cases"] == 16 and row["mean_abs_error"] <= row["target_mean"] == 0.25
    dense = [r for r in result["runs"] if r["metric_class"] == "throughput-dense"]
    assert not any("mixtral" in r["case"] or "qwen3" in r["case"] for r in dense)


def test_the_moe_gemm_share_was_set_on_no_held_out_row() -> None:
    from meshplan.reports.serve import calibration

    source = calibration("trtllm", "h100-sxm").moe_source
    assert "trt09_a100_mixtral_tp2_ttft_2048" in source and "trt014" not in source


def test_stated_engine_settings_are_read_from_the_run() -> None:
    """A run's stated kv_cache_free_gpu_mem_fraction and 'two-batch overlap disabled' reach the model."""
    from meshplan.validation.serving import _setup, reference_rows

    rows = {r["id"]: r for r in reference_rows()}
    v10 = _setup(rows["trt10_h100_l31-8b_fp8_tp1_128_2048"], context=2176)
    assert v10.hw.cal.memory_fraction == 0.95 and v10.hw.cal.memory_fraction_of.value == "free"
    gb200 = _setup(rows["sglang_gb200_dsv3_decode_48gpu_isl2000"], context=2000)
    assert gb200.hw.cal.ep_overlap == 0.0


def _sglang_decode(batch: int, *, tbo: bool) -> float:
    """Seconds of one decode step of the SGLang EP72 H100 row's setup at ``batch`` sequences per GPU."""
    import dataclasses

    from meshplan.core.serving.phases import decode_step
    from meshplan.validation.serving import _no_overlap, _setup, reference_rows

    (row,) = [r for r in reference_rows() if r["id"] == "sglang_h100_dsv3_decode_ep72_isl2000"]
    s = _setup(row, context=2000)
    hw = s.hw if tbo else dataclasses.replace(s.hw, cal=_no_overlap(s.hw.cal))
    return float(decode_step(s.model, s.shape, hw, s.layout, batch=batch, context=2000).total_s)


def test_two_batch_overlap_follows_the_blogs_ablation() -> None:
    """SGLang's large-EP blog (May 2025, 'Ablation Study: Two-batch Overlap'): TBO speeds decode up 25.5% at 256
    sequences per GPU, loses below a threshold between 64 and 128 (-27% at 32). The overlap share was set on the
    256 point; the loss at small batches comes from the two micro-batches each reading the weights and running
    their GEMMs at half the rows, not from a constant."""
    speedup = {b: _sglang_decode(b, tbo=False) / _sglang_decode(b, tbo=True) for b in (32, 64, 128, 256)}
    assert abs(speedup[256] - 1.255) <= 0.02
    assert speedup[32] < 0.9 and speedup[64] < 1.0 < speedup[128]


def test_the_no_overlap_step_is_predicted_from_deepeps_published_rates() -> None:
    """Without TBO the same blog's 256-sequence step runs at 22,310 / 1.255 = 17,777 tokens/s per node (115 ms): the
    model's compute plus DeepEP's low-latency dispatch/combine at its published ~40 GB/s lands within 11% (10.3%
    slow since the GEMM shape law prices the FP8 expert down projections' K = 2,048; 8% before)."""
    measured_s = 256 / (22310 / 1.255 / 8)
    assert abs(_sglang_decode(256, tbo=False) / measured_s - 1) <= 0.11


def test_prefill_two_batch_overlap_share_follows_the_blogs_ablation() -> None:
    """The prefill share (normal kernels, 0.5): the blog reports TBO 27-35% faster at the same tokens per GPU."""
    import dataclasses

    from meshplan.core.serving.phases import prefill
    from meshplan.validation.serving import _no_overlap, _setup, reference_rows

    (row,) = [r for r in reference_rows() if r["id"] == "sglang_h100_dsv3_prefill_ep32_isl4096"]
    s = _setup(row, context=4096)
    off = dataclasses.replace(s.hw, cal=_no_overlap(s.hw.cal))
    for tokens in (8192, 16384):
        t_on = float(prefill(s.model, s.shape, s.hw, s.layout, tokens=tokens, sequences=tokens / 4096).total_s)
        t_off = float(prefill(s.model, s.shape, off, s.layout, tokens=tokens, sequences=tokens / 4096).total_s)
        assert 1.25 <= t_off / t_on <= 1.37


def test_the_stored_band_is_todays_held_out_rows_re_derived(result: dict[str, Any]) -> None:
    """catalog/serving/held_out.toml (what `meshplan serve` prints) is today's band, re-derived here: each counted
    row's time ratio with its prediction corrected by the other sources' speed ratio (each source's mean log, then
    their mean: each source weighing the same; a rate's speed ratio is measured over predicted, a latency's the
    inverse), the P10 / median / P90 with each source's rows weighing 1 / its rows (each at the middle of its weight,
    interpolated), the distances from the median widened by t_0.90(k-1) sqrt(1 + 1/k) / z_0.90 for k sources (4:
    1.428, 5: 1.310); the one-source MoE class takes dense throughput's distances where they are wider."""
    import math
    import statistics

    import numpy as np

    from meshplan import io

    stored, runs = io.serving_held_out_band(), [x for x in result["runs"] if x["status"] == "ok"]
    assert stored == pytest.approx(result["band"], abs=1e-4)
    expected = {"decode": (32, 4), "prefill": (28, 4), "throughput-dense": (29, 5), "throughput-moe": (16, 1)}
    widening = {4: 1.4279, 5: 1.3103}
    spread = {}
    for cls, (n, k) in expected.items():
        mine = [x for x in runs if x["metric_class"] == cls]
        logs, weights = [], []
        for x in mine:
            per: dict[str, list[float]] = {}
            for y in mine:
                if y["source"] != x["source"]:
                    ratio = y["measured"] / y["predicted"]
                    per.setdefault(y["source"], []).append(
                        -math.log(ratio) if y["metric"].endswith("_ms") else math.log(ratio)
                    )
            k_speed = math.exp(statistics.mean(statistics.mean(v) for v in per.values())) if per else 1.0
            latency = x["metric"].endswith("_ms")
            ratio = k_speed * x["measured"] / x["predicted"] if latency else x["predicted"] * k_speed / x["measured"]
            logs.append(math.log(ratio))
            weights.append(1 / sum(1 for y in mine if y["source"] == x["source"]))
        order = np.argsort(logs)
        v, w = np.asarray(logs)[order], np.asarray(weights)[order]
        at = (np.cumsum(w) - w / 2) / w.sum()
        lo, mid, hi = (float(np.interp(q, at, v)) for q in (0.1, 0.5, 0.9))
        key = cls.replace("-", "_")
        assert (
            (stored[f"{key}_runs"], stored[f"{key}_sources"]) == (n, k) == (len(mine), len({x["source"] for x in mine}))
        )
        if k >= 2:
            f = widening[k]
            spread[cls] = (f * (mid - lo), f * (hi - mid))
            assert stored[f"{key}_widening"] == pytest.approx(f, abs=1e-4)
        else:
            dense = spread["throughput-dense"]
            spread[cls] = (max(mid - lo, dense[0]), max(hi - mid, dense[1]))
        assert stored[f"{key}_time_ratio_p50"] == pytest.approx(math.exp(mid), abs=1e-4)
        assert stored[f"{key}_time_ratio_p10"] == pytest.approx(math.exp(mid - spread[cls][0]), abs=1e-4)
        assert stored[f"{key}_time_ratio_p90"] == pytest.approx(math.exp(mid + spread[cls][1]), abs=1e-4)
        assert stored[f"{key}_time_ratio_p10"] < 1 < stored[f"{key}_time_ratio_p90"]
