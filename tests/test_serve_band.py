"""The serving band per engine family and the widening for what no published row ran (reports/serve_band.py,
validation/serving_band.py), and the load a replica holds under its engine's caps (core/serving/load.py)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from meshplan import io
from meshplan.core.serving.load import BatchLimit, Requests, capacity, load_point, step_at, ttft_s
from meshplan.core.serving.phases import pipeline_factor
from meshplan.reports.serve import resolve, serve_report
from meshplan.reports.serve_band import band_for
from meshplan.validation.serving_band import held_out_band, t90, unseen_width


@dataclass(frozen=True)
class Row:
    """A predicted measurement as validation.serving.Row carries it (a rate: tokens/s)."""

    source: str
    engine: str
    measured: float
    predicted: float
    gpu: str = "h100-sxm"
    model: str = ""
    metric: str = "tokens_per_s"
    metric_class: str = "throughput-dense"
    status: str = "ok"


BAND = {
    "decode_time_ratio_p10": 0.8,
    "decode_time_ratio_p50": 1.0,
    "decode_time_ratio_p90": 1.5,
    "decode_runs": 20,
    "decode_sources": 3,
    "decode_engine_trtllm_time_ratio_p10": 0.8,
    "decode_engine_trtllm_time_ratio_p50": 1.2,
    "decode_engine_trtllm_time_ratio_p90": 1.8,
    "decode_engine_trtllm_runs": 12,
    "decode_engine_trtllm_sources": 2,
    "decode_gpu_h100_sxm_sources": 3,
    "decode_moe_0_sources": 3,
    "decode_mla_0_sources": 3,
    "decode_unseen_engine_log": 0.2,
    "decode_unseen_gpu_log": 0.3,
    "decode_unseen_moe_log": 0.4,
    "decode_unseen_mla_log": 0.5,
}


def test_a_seen_engine_takes_its_familys_band_unwidened() -> None:
    b = band_for(BAND, "decode", engine="trtllm", gpu="h100-sxm", moe=False, mla=False)
    assert (b.lo, b.mid, b.hi) == (0.8, 1.2, 1.8) and b.widened == ()
    assert (b.sources, b.class_sources, b.engine_sources) == (2, 3, 2)
    assert b.text() == "20 runs of 3 sources, 2 of them trtllm's"


def test_each_unseen_level_adds_its_width_in_quadrature() -> None:
    """vLLM (no row) on an H200 (no row) for an MLA model (no row): the class's band, each side's log distance d
    becoming sqrt(d^2 + 0.2^2 + 0.3^2 + 0.5^2), each reason named."""
    b = band_for(BAND, "decode", engine="vllm", gpu="h200", moe=False, mla=True)
    extra = 0.2**2 + 0.3**2 + 0.5**2
    assert b.mid == 1.0
    assert b.lo == pytest.approx(math.exp(-math.sqrt(math.log(1 / 0.8) ** 2 + extra)), rel=1e-12)
    assert b.hi == pytest.approx(math.exp(math.sqrt(math.log(1.5) ** 2 + extra)), rel=1e-12)
    assert b.engine_sources == 0 and b.sources == 3
    assert b.widened == (
        "no published decode row of vllm",
        "no published decode row on h200",
        "no published decode row of an MLA model",
    )
    moe = band_for(BAND, "decode", engine="trtllm", gpu="h100-sxm", moe=True, mla=False)
    assert moe.hi == pytest.approx(1.2 * math.exp(math.sqrt(math.log(1.8 / 1.2) ** 2 + 0.4**2)), rel=1e-12)


def test_a_class_with_no_row_takes_its_siblings_band_widened_for_the_model_class() -> None:
    """MoE throughput with no row of its own: dense throughput's band for the same question, the MoE level (which
    the dense rows never ran) widening it; a class with no row and no sibling is refused."""
    dense = {k.replace("decode", "throughput_dense"): v for k, v in BAND.items()}
    b = band_for(dense, "throughput-moe", engine="trtllm", gpu="h100-sxm", moe=True, mla=False)
    assert b.hi == pytest.approx(1.2 * math.exp(math.sqrt(math.log(1.5) ** 2 + 0.4**2)), rel=1e-12)
    assert b.class_sources == 0 and b.widened[0].startswith("no published throughput-moe row")
    assert "no published throughput-dense row of a MoE model" in b.widened
    assert b.text().startswith("no published row of this class")
    with pytest.raises(ValueError, match="no 'prefill' band"):
        band_for(BAND, "prefill", engine="trtllm", gpu="h100-sxm", moe=False, mla=False)


def _rows() -> list[Row]:
    """Three sources of one engine family that reads fast, two of another that reads slow."""
    rows = []
    for i, (source, engine, offset) in enumerate(
        (("a", "trtllm", 1.0), ("b", "trtllm", 1.05), ("c", "trtllm", 0.95), ("d", "vllm", 1.4), ("e", "vllm", 1.3))
    ):
        for j, wiggle in enumerate((0.97, 1.0, 1.03)):
            gpu = "a100-80gb" if (i + j) % 2 else "h100-sxm"
            rows.append(Row(source=source, engine=engine, measured=100.0, predicted=100.0 * offset * wiggle, gpu=gpu))
    return rows


def test_an_engine_family_takes_the_class_spread_around_its_own_median() -> None:
    """Built from rows: each family's band is the class's log distances around the family's median (its sources
    weighing the same), covering the class's band; the unseen-engine width is t_0.90(n - 1) sqrt(1 + 1/n) times
    the standard deviation of the families' mean log ratios (n = 2 families)."""
    band = held_out_band(_rows())
    lo, mid, hi = (band[f"throughput_dense_time_ratio_{q}"] for q in ("p10", "p50", "p90"))
    for family in ("trtllm", "vllm"):
        e = f"throughput_dense_engine_{family}"
        centre = band[f"{e}_time_ratio_p50"]
        assert band[f"{e}_time_ratio_p10"] == pytest.approx(min(centre * lo / mid, lo), rel=1e-12)
        assert band[f"{e}_time_ratio_p90"] == pytest.approx(max(centre * hi / mid, hi), rel=1e-12)
    assert band["throughput_dense_engine_trtllm_sources"] == 3 and band["throughput_dense_engine_vllm_sources"] == 2
    assert (
        band["throughput_dense_engine_vllm_time_ratio_p50"]
        > mid
        > band["throughput_dense_engine_trtllm_time_ratio_p50"]
    )
    assert band["throughput_dense_engine_vllm_time_ratio_p90"] > hi  # the slow family reaches above the class
    assert band["throughput_dense_gpu_a100_80gb_sources"] == 5 and "throughput_dense_gpu_h200_sources" not in band
    assert band["throughput_dense_moe_0_sources"] == 5 and "throughput_dense_moe_1_sources" not in band


def test_the_unseen_width_is_a_prediction_interval_over_the_levels() -> None:
    """Re-derived by hand: levels x (sources a, b) and y (source c), means of the sources' means."""
    by_source: dict[str, list[tuple[Any, float]]] = {
        "a": [(Row("a", "x", 1, 1), 0.1), (Row("a", "x", 1, 1), 0.3)],
        "b": [(Row("b", "x", 1, 1), -0.2)],
        "c": [(Row("c", "y", 1, 1), 0.5)],
    }
    means = [statistics.mean([0.2, -0.2]), 0.5]
    expected = t90(1) * math.sqrt(1 + 1 / 2) * statistics.stdev(means)
    assert unseen_width(by_source, "engine") == pytest.approx(expected, rel=1e-12)
    assert unseen_width(by_source, "gpu") is None  # one GPU kind: nothing says how kinds differ


SERVE = {"gpu": "h100-sxm", "gpus": 1, "input_len": 1000, "output_len": 200}


def test_serve_names_the_sources_and_the_widening() -> None:
    """A dense model on an H100 with vLLM: no published row of vLLM in any class, so every band is widened and
    says so; the sources behind each are the class's."""
    from meshplan import io

    band = io.serving_held_out_band()
    r = serve_report("llama-3.1-8b", **SERVE, engine="vllm", concurrency=8)  # type: ignore[arg-type]
    assert r["band_sources"] == {
        "tpot": band["decode_sources"],
        "ttft": band["prefill_sources"],
        "tokens_per_s": band["throughput_dense_sources"],
    }
    assert "no published decode row of vllm" in r["band_widened"]
    assert r["tpot_s_p90"] > r["tpot_s"] * band["decode_time_ratio_p90"]
    assert (
        f"TPOT from {int(band['decode_runs'])} runs of {int(band['decode_sources'])} sources (widened: no "
        in (r["uncertainty"])
    )


def _sojourn(s: Any, req: Requests, b: float) -> float:
    t = pipeline_factor(s.hw, s.layout) * float(step_at(s.model, s.shape, s.hw, s.layout, req, batch=b).total_s)
    pre = float(ttft_s(s.model, s.shape, s.hw, s.layout, req, batch=b))
    return pre + -math.expm1(-b) * t / 2 + (req.output_len - 1) * t  # the boundary wait where a step runs


def test_the_open_loop_batch_is_the_least_fixed_point_with_tpot_growing() -> None:
    """Poisson arrivals at R: the batch B solves B = R S(B), S the time in the system at B's own TPOT. The step
    grows with the batch, so B is above R S(0) (Little's law at the unloaded latency), and it is the least root:
    below it R S(b) > b everywhere."""
    s = resolve("llama-3.1-70b", gpu="h100-sxm", gpus=2, tp=2, context=1200)
    for rate in (1.0, 4.0):
        req = Requests(input_len=1000, output_len=200, rate_per_s=rate)
        pt = load_point(s.model, s.shape, s.hw, s.layout, req)
        assert not pt.saturated and pt.limit is BatchLimit.LOAD and pt.batch < pt.capacity.sequences
        assert pt.batch == pytest.approx(rate * _sojourn(s, req, pt.batch), rel=1e-3)
        assert pt.batch > 1.02 * rate * _sojourn(s, req, 0.0)
        for b in np.linspace(0.0, 0.98 * pt.batch, 12):
            assert rate * _sojourn(s, req, float(b)) > b


def test_the_engines_caps_bound_the_sequences_in_flight() -> None:
    """Each cap re-derived and binding in turn: the KV cache (TensorRT-LLM reserves input + output per sequence),
    the tokens a step may carry (b (1 + I / O) <= max_num_tokens), the user's --max-batch; past what the replica
    serves an open loop holds the cap, and serve reports the count in flight and what sets the cap."""
    kv = resolve("llama-3.1-70b", gpu="h100-sxm", gpus=2, tp=2, context=1100)
    req = Requests(input_len=1000, output_len=100, rate_per_s=1e4)
    cap = capacity(kv.model, kv.shape, kv.hw, kv.layout, req)
    assert cap.limit is BatchLimit.KV_CACHE
    assert cap.sequences == int(kv.shape.max_sequences(kv.model, tokens_per_sequence=1100))
    pt = load_point(kv.model, kv.shape, kv.hw, kv.layout, req)
    assert pt.saturated and pt.batch == cap.sequences and pt.limit is BatchLimit.KV_CACHE

    tok = resolve("llama-3.1-8b", gpu="h100-sxm", gpus=1, context=1100, max_num_tokens=2048)
    cap = capacity(tok.model, tok.shape, tok.hw, tok.layout, Requests(input_len=1000, output_len=100, concurrency=1))
    assert cap.limit is BatchLimit.MAX_TOKENS and cap.sequences == math.floor(2048 / (1 + 1000 / 100))

    capped = Requests(input_len=1000, output_len=100, rate_per_s=1e4, max_batch=48)
    pt = load_point(tok.model, tok.shape, tok.hw, tok.layout, capped)
    assert pt.batch == 48 and pt.limit is BatchLimit.MAX_BATCH

    r = serve_report("llama-3.1-70b", gpu="h100-sxm", gpus=2, tp=2, input_len=1000, output_len=100, rate=1.0)
    assert r["batch_limit"] == "load" and r["batch_cap_limit"] == "kv-cache"
    assert 0 < r["batch_per_replica"] < r["batch_cap_per_replica"]


def test_each_source_held_out_of_the_band_mostly_falls_inside_it() -> None:
    """The promise measured as benchmarks/serving_band_coverage.py measures it: each source held out of the band in
    turn, its rows against the band built without it. Four in five of the 105 counted rows or more lie inside; the
    MoE throughput rows, whose class rests on one source, get their sibling's band widened for MoE and lie inside;
    and a held-out row's band is never narrower than its class's without it."""
    from meshplan.validation.serving import predict_rows, reference_rows
    from meshplan.validation.serving_band import band_without, inside, row_band

    rows = [p for r in reference_rows() for p in predict_rows(r)]
    counted = [r for r in rows if r.status == "ok" and r.predicted]
    hits = {}
    for source in sorted({r.source for r in counted}):
        band = band_without(rows, source)
        for r in (r for r in counted if r.source == source):
            hits[r.case, r.metric] = inside(r, band)
            key = r.metric_class.replace("-", "_")
            if f"{key}_time_ratio_p10" in band:
                b = row_band(r, band)
                assert b.lo <= band[f"{key}_time_ratio_p10"] and b.hi >= band[f"{key}_time_ratio_p90"]
    assert len(hits) == len(counted) and sum(hits.values()) >= 0.8 * len(counted)
    moe = [ok for r in counted if r.metric_class == "throughput-moe" for ok in [hits[r.case, r.metric]]]
    assert len(moe) == 16 and all(moe)


def test_the_band_under_poisson_arrivals_is_the_load_on_a_slower_machine() -> None:
    """Every time r times longer is the model's own machine at r times the rate, its times r times longer: the P90
    of each figure under an open loop is r_90 x the figure served at R r_90 (so it saturates where R r_90 is more
    than the replica serves), its P10 r_10 x the figure at R r_10; a closed loop keeps its users and scales by r."""
    kw = {"gpu": "h100-sxm", "gpus": 8, "tp": 2, "replicas": 4, "engine": "trtllm", "weights_dtype": "fp8"}
    kw |= {"max_batch": 1024, "max_num_tokens": 4096, "input_len": 222, "output_len": 290}
    r = serve_report("llama-2-70b", **kw, rate=75.0)  # type: ignore[arg-type]
    held = io.serving_held_out_band()
    dec, pre = (band_for(held, c, engine="trtllm", gpu="h100-sxm", moe=False, mla=False) for c in ("decode", "prefill"))
    lo, hi, plo, phi = dec.lo, dec.hi, pre.lo, pre.hi
    slow, fast = (serve_report("llama-2-70b", **kw, rate=75.0 * x) for x in (hi, lo))  # type: ignore[arg-type]
    assert r["load_band"]["tpot_s_p99"] == pytest.approx([lo * fast["tpot_s_p99"], hi * slow["tpot_s_p99"]], rel=1e-9)
    assert [r["tpot_s_p10"], r["tpot_s_p90"]] == r["load_band"]["tpot_s"]
    assert r["load_band"]["batch_per_replica"] == pytest.approx([fast["batch_per_replica"], slow["batch_per_replica"]])
    assert slow["saturated"] and r["load_band"]["ttft_s_p99"][1] is None  # 75 x 1.73 requests/s: more than it serves
    assert serve_report("llama-2-70b", **kw, rate=75.0 * phi)["ttft_s_p99"] is None  # type: ignore[arg-type]
    assert r["load_band"]["ttft_s_p99"][0] == pytest.approx(
        plo * serve_report("llama-2-70b", **kw, rate=75.0 * plo)["ttft_s_p99"],
        rel=1e-9,  # type: ignore[arg-type]
    )
    assert r["load_band"]["tpot_s"][0] < lo * r["tpot_s"] < r["tpot_s"] < hi * r["tpot_s"] < r["load_band"]["tpot_s"][1]
    # an open loop serves what arrives: no more than that at P90, less where the slow machine cannot
    assert r["tokens_per_s_per_gpu_p90"] == r["tokens_per_s_per_gpu"] > r["tokens_per_s_per_gpu_p10"]
    closed = serve_report("llama-2-70b", **kw, concurrency=400.0)  # type: ignore[arg-type]
    for fig, (a, b) in closed["load_band"].items():
        if fig != "batch_per_replica":
            ratios = (plo, phi) if fig.startswith("ttft") else (lo, hi)
            assert [a, b] == pytest.approx([ratios[0] * closed[fig], ratios[1] * closed[fig]], rel=1e-12), fig
