"""``serve --speculative`` and ``--prefix-hit-rate`` (core/serving/speculative.py, core/serving/load.py)."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.cli import main
from meshplan.core.serving.load import Requests, capacity, load_point
from meshplan.core.serving.phases import decode_step, pipeline_factor, prefill
from meshplan.core.serving.speculative import SpecMethod, Speculation, verify_step
from meshplan.reports.serve import resolve, serve_report

SERVE = {"gpu": "h100-sxm", "gpus": 1, "input_len": 1000, "output_len": 200}
ARGV = ["serve", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "1", "--input-len", "1000", "--output-len", "200"]


@settings(max_examples=80, deadline=None)
@given(a=st.floats(0, 1), k=st.integers(1, 8))
def test_tokens_per_step_is_leviathans_and_its_variance_the_distributions(a: float, k: int) -> None:
    """E = (1 - a^(K+1)) / (1 - a); mean and variance re-derived from X's distribution: P(X = j + 1) = a^j (1 - a)
    for j < K, a^K for j = K."""
    spec = Speculation(method=SpecMethod.EAGLE, k=k, acceptance=a)
    probs = [a**j * (1 - a) for j in range(k)] + [a**k]
    mean = sum(p * (j + 1) for j, p in enumerate(probs))
    var = sum(p * (j + 1) ** 2 for j, p in enumerate(probs)) - mean**2
    closed = k + 1 if a == 1 else (1 - a ** (k + 1)) / (1 - a)
    assert spec.tokens_per_step == pytest.approx(closed, rel=1e-9) == pytest.approx(mean, rel=1e-9)
    assert spec.tokens_per_step_variance == pytest.approx(var, abs=1e-9)


def test_verify_of_no_draft_is_a_decode_step() -> None:
    """K = 0 makes the verify forward the decode step, term by term; K drafted tokens multiply the rows."""
    s = resolve("llama-3.1-8b", gpu="h100-sxm", gpus=1, context=1200)
    for batch in (1.0, 64.0):
        plain = decode_step(s.model, s.shape, s.hw, s.layout, batch=batch, context=1100.0)
        ours = verify_step(s.model, s.shape, s.hw, s.layout, batch=batch, context=1100.0, k=0)
        assert dataclasses.asdict(ours) == pytest.approx(dataclasses.asdict(plain), rel=1e-12)
        five = verify_step(s.model, s.shape, s.hw, s.layout, batch=batch, context=1100.0, k=4)
        assert five.weights_read_s == pytest.approx(plain.weights_read_s) and five.kv_read_s == plain.kv_read_s
        assert five.attention_compute_s == pytest.approx(5 * plain.attention_compute_s)
        half = s.hw.gpu.calibration.matmul_half_dim  # 5x the FLOPs at s(5b) = 5b / (5b + d) for s(b)
        assert five.gemm_compute_s / plain.gemm_compute_s == pytest.approx((5 * batch + half) / (batch + half))


def _spec(**kw: object) -> dict:
    return serve_report("llama-3.1-8b", **SERVE, **kw)  # type: ignore[arg-type]


def test_acceptance_zero_only_adds_the_verify_and_draft_cost() -> None:
    """a = 0: one token a step, so TPOT is the whole speculative step: the K + 1 verify plus the drafts, slower
    than plain decoding at the same batch."""
    plain = _spec(concurrency=8)
    zero = _spec(concurrency=8, speculative="eagle:3", spec_acceptance=0.0)
    sp = zero["speculative"]
    assert sp["tokens_per_step"] == 1.0 and sp["decode_speedup"] < 1.0
    assert sp["verify_s"] >= sp["decode_step_s_without"] and sp["draft_s"] > 0
    assert zero["tpot_s"] > plain["tpot_s"]
    assert zero["tokens_per_s_per_gpu"] < plain["tokens_per_s_per_gpu"]


def test_acceptance_one_divides_the_step_by_k_plus_one() -> None:
    r = _spec(concurrency=8, speculative="draft:4", spec_acceptance=1.0, draft_model="llama-3.2-1b")
    sp = r["speculative"]
    assert sp["tokens_per_step"] == 5.0
    assert sp["decode_speedup"] == pytest.approx(sp["decode_step_s_without"] * 5 / (sp["verify_s"] + sp["draft_s"]))
    assert 1.0 < sp["decode_speedup"] < 5.0  # the verify forward and four 1B-model drafts are not free
    assert r["tpot_s"] < _spec(concurrency=8)["tpot_s"]


def test_speedup_rises_with_acceptance() -> None:
    speed = [_spec(rate=2.0, speculative="eagle:4", spec_acceptance=a)["tpot_s"] for a in (0.2, 0.5, 0.8)]
    assert speed == sorted(speed, reverse=True)


def test_the_drafter_takes_kv_room() -> None:
    s = resolve("llama-3.1-8b", gpu="h100-sxm", gpus=1, context=1200)
    base = Requests(input_len=1000, output_len=200, concurrency=1e4)
    eagle = dataclasses.replace(base, speculation=Speculation(method=SpecMethod.EAGLE, k=3, acceptance=0.7))
    plain, drafted = (capacity(s.model, s.shape, s.hw, s.layout, r).kv_sequences for r in (base, eagle))
    layers = s.model.num_layers
    assert drafted < plain and drafted >= plain * layers / (layers + 1) * 0.95  # one layer's cache and weights


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--speculative", "eagle:3"], "needs --spec-acceptance"),
        (["--speculative", "mtp:1", "--spec-acceptance", "0.8"], "no multi-token-prediction layer"),
        (["--speculative", "draft:3", "--spec-acceptance", "0.8"], "needs --draft-model"),
        (["--speculative", "eagle", "--spec-acceptance", "0.8"], "takes METHOD:K"),
        (["--speculative", "medusa:3", "--spec-acceptance", "0.8"], "takes METHOD:K"),
        (["--speculative", "eagle:0", "--spec-acceptance", "0.8"], "K must be 1..16"),
        (["--spec-acceptance", "0.8"], "goes with --speculative"),
        (["--speculative", "eagle:3", "--spec-acceptance", "1.5"], "--spec-acceptance"),
        (["--speculative", "draft:3", "--spec-acceptance", "0.5", "--draft-model", "llama-2-7b"], "vocabulary"),
        (["--prefix-hit-rate", "1.2"], "--prefix-hit-rate"),
    ],
)
def test_refusals_are_one_line(capsys: pytest.CaptureFixture[str], extra: list[str], message: str) -> None:
    assert main([*ARGV, "--concurrency", "4", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


@pytest.mark.parametrize("load", [["--batch", "4"], ["--num-requests", "100"]])
def test_static_and_offline_runs_refuse_the_new_flags(capsys: pytest.CaptureFixture[str], load: list[str]) -> None:
    assert main([*ARGV, *load, "--prefix-hit-rate", "0.5"]) == 2
    assert "modelled under --concurrency or --rate" in capsys.readouterr().err


def test_full_prefix_hit_leaves_the_last_token() -> None:
    """H = 1: the prefill computes one token after I - 1 cached ones (re-derived with phases.prefill); the KV
    cache still holds the whole prompt (the capacity does not move)."""
    s = resolve("llama-3.1-8b", gpu="h100-sxm", gpus=1, context=1200)
    full = Requests(input_len=1000, output_len=200, concurrency=1.0, prefix_hit_rate=1.0)
    assert (full.prompt_tokens, full.cached_tokens) == (1, 999)
    pt = load_point(s.model, s.shape, s.hw, s.layout, full)
    one = pipeline_factor(s.hw, s.layout) * float(
        prefill(s.model, s.shape, s.hw, s.layout, tokens=1.0, cached=999.0).total_s
    )
    assert pt.ttft_unloaded_s == pytest.approx(one, rel=1e-12)
    cold = dataclasses.replace(full, prefix_hit_rate=0.0)
    assert capacity(s.model, s.shape, s.hw, s.layout, full) == capacity(s.model, s.shape, s.hw, s.layout, cold)


def test_prefix_hit_rate_zero_changes_nothing_and_more_hits_cut_ttft() -> None:
    plain = _spec(rate=5.0)
    zero = _spec(rate=5.0, prefix_hit_rate=0.0)
    assert {k: v for k, v in zero.items() if k != "prefix_cache"} == plain
    assert zero["prefix_cache"] == {"hit_rate": 0.0, "cached_tokens": 0, "prefill_tokens": 1000}
    ttft = [_spec(rate=5.0, prefix_hit_rate=h)["ttft_s_p99"] for h in (0.0, 0.5, 0.9)]
    assert ttft == sorted(ttft, reverse=True) and ttft[2] < 0.5 * ttft[0]


@settings(max_examples=100, deadline=None)
@given(h=st.floats(0, 1), i=st.integers(1, 200_000))
def test_prompt_tokens_are_what_the_cache_leaves(h: float, i: int) -> None:
    req = Requests(input_len=i, output_len=10, concurrency=1.0, prefix_hit_rate=h)
    assert 1 <= req.prompt_tokens <= i and req.prompt_tokens + req.cached_tokens == i
    assert req.prompt_tokens == max(i - math.floor(h * i), 1)


def test_table_shows_the_terms(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*ARGV, "--rate", "3", "--speculative", "eagle:3", "--spec-acceptance", "0.7", "--prefix-hit-rate", "0.5"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "eagle:3, a=0.7: 2.53 tokens a step" in out and "verify + draft" in out and "500 cached" in out
    assert "TPOT p50 / p99" in out and "ITL p99" in out


def test_every_method_runs_on_a_model_that_has_it() -> None:
    """MTP on DeepSeek-V3 (its one MTP layer), every combination of method and K the engines ship."""
    kw = {"gpu": "h200", "gpus": 8, "input_len": 1000, "output_len": 200, "weights_dtype": "fp8", "concurrency": 16}
    for k in itertools.islice((1, 2, 3), 2):
        r = serve_report("deepseek-v3", **kw, speculative=f"mtp:{k}", spec_acceptance=0.8)  # type: ignore[arg-type]
        assert r["speculative"]["method"] == "mtp" and r["speculative"]["decode_speedup"] > 1


def test_forwards_in_sequence_keep_their_own_rooflines() -> None:
    """A memory-bound decode step then a compute-bound prefill: the total is the sum of the totals (not the roofline
    of the summed terms), and the breakdown the sum of the breakdowns; the speculative step likewise."""
    from meshplan.core.serving.speculative import add_forwards, draft_s, spec_step

    s = resolve("llama-3.1-8b", gpu="h100-sxm", gpus=1, context=1200)
    dec = decode_step(s.model, s.shape, s.hw, s.layout, batch=4.0, context=1100.0)
    pre = prefill(s.model, s.shape, s.hw, s.layout, tokens=4000.0)
    both = add_forwards(dec, pre)
    assert dec.weights_read_s > dec.gemm_compute_s and pre.gemm_compute_s > pre.weights_read_s
    assert both.total_s == pytest.approx(dec.total_s + pre.total_s, rel=1e-12)
    for key, value in both.breakdown().items():
        assert value == pytest.approx(dec.breakdown()[key] + pre.breakdown()[key], rel=1e-12, abs=1e-15)
    spec = Speculation(method=SpecMethod.EAGLE, k=3, acceptance=0.6)
    step = spec_step(s.model, s.shape, s.hw, s.layout, spec, batch=4.0, context=1100.0)
    verify = verify_step(s.model, s.shape, s.hw, s.layout, batch=4.0, context=1100.0, k=3)
    drafts = draft_s(s.model, s.shape, s.hw, s.layout, spec, batch=4.0, context=1100.0)
    assert step.total_s == pytest.approx(verify.total_s + drafts.total_s, rel=1e-12)
