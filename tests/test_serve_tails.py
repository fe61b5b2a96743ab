"""Load as engines hold it: the open loop's batch, TTFT and TPOT percentiles (core/serving/tails.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.core.serving.load import Requests, load_point, prompt_queue, step_at, ttft_s
from meshplan.core.serving.phases import pipeline_factor
from meshplan.core.serving.tails import Z99, busy_share, own_share, tail_sum, tpot_tails, wait_quantile
from meshplan.reports.serve import resolve, serve_report
from meshplan.reports.serve_plan import serve_plan_report

SERVE = {"gpu": "h100-sxm", "gpus": 1, "input_len": 1000, "output_len": 200}


def test_one_queue_p99_is_the_exponential_tail() -> None:
    """A wait that is 0 w.p. 1 - p and exponential of mean theta otherwise: P(W > x) = p e^(-x/theta), so its q
    quantile is theta ln(p / (1 - q)), and 0 where p <= 1 - q."""
    for p, theta in ((0.3, 0.2), (0.9, 1.5), (0.011, 3.0)):
        assert wait_quantile(0.99, p, theta) == pytest.approx(theta * math.log(p / 0.01), rel=1e-9)
    assert wait_quantile(0.99, 0.005, 10.0) == 0.0
    assert wait_quantile(0.5, 0.4, 1.0) == 0.0 and wait_quantile(0.5, 0.8, 1.0) == pytest.approx(math.log(1.6))


def test_two_queues_p99_matches_sampling() -> None:
    """The p99 of W1 + W2 from the closed-form tail against 400,000 samples (and below the sum of the p99s)."""
    rng = np.random.default_rng(7)
    n = 400_000
    for p1, a, p2, b in ((0.6, 0.3, 0.5, 0.1), (0.9, 0.2, 0.9, 0.2), (0.2, 1.0, 0.95, 0.05)):
        w = (rng.random(n) < p1) * rng.exponential(a, n) + (rng.random(n) < p2) * rng.exponential(b, n)
        ours = wait_quantile(0.99, p1, a, p2, b)
        assert ours == pytest.approx(float(np.quantile(w, 0.99)), rel=0.02)
        assert float(tail_sum(ours, p1, a, p2, b)) == pytest.approx(0.01, rel=1e-6)
        assert ours <= wait_quantile(0.99, p1, a) + wait_quantile(0.99, p2, b)


@settings(max_examples=60, deadline=None)
@given(
    p1=st.floats(0, 1),
    a=st.floats(1e-4, 1e3),
    p2=st.floats(0, 1),
    b=st.floats(1e-4, 1e3),
    q=st.floats(0.5, 0.999),
)
def test_quantiles_rise_with_q_and_never_go_below_zero(p1: float, a: float, p2: float, b: float, q: float) -> None:
    low, high = wait_quantile(q, p1, a, p2, b), wait_quantile(min(q + 0.0005, 0.9995), p1, a, p2, b)
    assert 0.0 <= low <= high + 1e-12 * max(a, b)


def test_tpot_p99_from_chunked_steps() -> None:
    """Re-derived: n = O - 1 steps, f of them carrying (t_c) the rest plain (t_p): mean (1-f) t_p + f t_c, variance
    f (1 - f) (t_c - t_p)^2 / n; p99 = mean + z sd. The ITL p99 is a carrying step once more than 1% carry."""
    t = tpot_tails(plain_s=0.02, carrying_s=0.1, share=0.1, output_len=201)
    mean = 0.9 * 0.02 + 0.1 * 0.1
    assert t.mean_s == pytest.approx(mean) and t.p50_s == pytest.approx(mean)
    assert t.p99_s == pytest.approx(mean + Z99 * math.sqrt(0.1 * 0.9 * 0.08**2 / 200))
    assert t.itl_p99_s == 0.1
    assert tpot_tails(plain_s=0.02, carrying_s=0.1, share=0.005, output_len=201).itl_p99_s == 0.02


def _rate(rate: float) -> dict:
    return serve_report("llama-3.1-8b", **SERVE, rate=rate)  # type: ignore[arg-type]


def test_p99_above_p50_and_rising_with_the_rate() -> None:
    points = [_rate(r) for r in (1.0, 5.0, 10.0, 15.0)]
    for r in points:
        assert r["ttft_s_p99"] >= r["ttft_s_p50"] >= 0 and r["ttft_s_mean"] >= 0
        assert r["tpot_s_p99"] >= r["tpot_s_p50"] > 0 and r["itl_s_p99"] > 0
    for key in ("ttft_s_p99", "tpot_s_p99", "batch_per_replica"):
        values = [r[key] for r in points]
        assert values == sorted(values), key


def test_tails_diverge_near_saturation() -> None:
    """The batch grows without bound as the rate nears what the replica serves, TPOT and TTFT with its step; past
    it, saturated (the queue for a batch slot grows without bound)."""
    top = _rate(1.0)["max_tokens_per_s_per_gpu"] / SERVE["output_len"]  # requests/s at the cap's throughput
    near, nearer, past = _rate(0.85 * top), _rate(0.97 * top), _rate(1.2 * top)
    assert nearer["batch_per_replica"] > 1.5 * near["batch_per_replica"]
    assert nearer["tpot_s"] > 1.2 * near["tpot_s"] and nearer["ttft_s_p99"] > 1.2 * near["ttft_s_p99"]
    assert past["saturated"] and past["ttft_s_p99"] is None


def test_short_prompts_share_the_step_budget_without_queueing() -> None:
    """Where what is left of max_num_tokens holds c whole prompts a step, the budget is c servers: prompts that
    ride in every step (one or two a step against c = 17) wait for none of it; one prompt as long as the budget
    is one server busy the share of the time the steps carry it, the M/D/1 of TensorRT-LLM's scheduler
    (docs/formulas.md)."""
    kw = {"gpu": "h100-sxm", "gpus": 8, "tp": 2, "replicas": 4, "engine": "trtllm", "weights_dtype": "fp8"}
    setup = resolve("llama-2-70b", **kw, context=222 + 290, max_num_tokens=4096)  # type: ignore[arg-type]
    m, sh, hw, lay = setup.model, setup.shape, setup.hw, setup.layout
    req = Requests(input_len=222, output_len=290, rate_per_s=18.8, max_batch=1024)
    b = 200.0
    step = step_at(m, sh, hw, lay, req, batch=b)
    q = prompt_queue(hw, lay, req, step, batch=b)
    per_step = b * 222 / 290 / 222  # prompts arriving a step: b I / O tokens, I each
    slots = (4096 - b) // 222
    rho = per_step * float(step.carrying.total_s) / float(step.total_s) / slots
    assert slots == 17 and q.wait_share == pytest.approx(rho ** (math.sqrt(2 * (slots + 1)) - 1), rel=1e-9)
    assert q.wait_s_p99 == 0.0 and q.wait_s_p50 < 1e-6  # no prompt waits at p99
    long = Requests(input_len=3800, output_len=290, rate_per_s=1.0, max_batch=1024)
    b = 20.0
    step = step_at(m, sh, hw, lay, long, batch=b)
    q = prompt_queue(hw, lay, long, step, batch=b)  # 3,800 tokens of the 4,076 left: one prompt a step
    rho = float(step.share) * float(step.carrying.total_s) / float(step.total_s)
    service = float(step.carrying.total_s)
    assert q.wait_share == pytest.approx(rho, rel=1e-9)
    assert q.wait_s_p50 == pytest.approx(rho * service / (2 * (1 - rho)), rel=1e-9)  # M/D/1's mean wait


def test_the_open_loop_batch_is_littles_law() -> None:
    """B = R (prefill(B) + t(B)/2 + (O - 1) t(B)), recomputed from the step and TTFT functions at the solved B."""
    s = resolve("llama-3.1-8b", gpu="h100-sxm", gpus=1, context=1200)
    for rate in (3.0, 12.0):
        req = Requests(input_len=1000, output_len=200, rate_per_s=rate)
        pt = load_point(s.model, s.shape, s.hw, s.layout, req)
        t = pipeline_factor(s.hw, s.layout) * float(
            step_at(s.model, s.shape, s.hw, s.layout, req, batch=pt.batch).total_s
        )
        pre = float(ttft_s(s.model, s.shape, s.hw, s.layout, req, batch=pt.batch))
        busy = 1 - math.exp(-pt.batch)  # Poisson sequences in flight: a step runs unless none is
        assert pt.batch == pytest.approx(rate * (pre + busy * t / 2 + 199 * t), rel=1e-3)


def test_closed_loop_tpot_p99_has_no_batch_spread() -> None:
    """C users hold the batch at C: TPOT p99 only from the chunk-carrying steps."""
    r = serve_report("llama-3.1-8b", **SERVE, concurrency=32)  # type: ignore[arg-type]
    s = resolve("llama-3.1-8b", gpu="h100-sxm", gpus=1, context=1200)
    req = Requests(input_len=1000, output_len=200, concurrency=32.0)
    step = step_at(s.model, s.shape, s.hw, s.layout, req, batch=32.0)
    tp, tc, f = float(step.plain.total_s), float(step.carrying.total_s), float(step.share)
    own = f * 31 / 32  # the other 31 users' prompts ride in a request's intervals, its own is in its TTFT
    assert r["tpot_s"] == pytest.approx((1 - own) * tp + own * tc, rel=1e-12)
    assert r["tpot_s_p99"] == pytest.approx(r["tpot_s"] + Z99 * math.sqrt(own * (1 - own) * (tc - tp) ** 2 / 199))


def test_serve_plan_holds_tpot_p99_to_the_target() -> None:
    """Every ranked plan's TPOT p99 meets --tpot-p99, and the p99 is what binds: a target between a plan's mean and
    its p99 turns that batch cap away."""
    kw = {"gpu": "h100-sxm", "gpus": 1, "input_len": 4000, "output_len": 300, "top": 50}
    r = serve_plan_report("llama-3.1-8b", tpot_p99_s=0.03, **kw)  # type: ignore[arg-type]
    assert r["top"]
    for p in r["top"]:
        assert p["tpot_s"] <= p["tpot_s_p99"] <= 0.03
    best = r["best"]
    assert best["tpot_s_p99"] > best["tpot_s"]
    tighter = serve_plan_report("llama-3.1-8b", tpot_p99_s=(best["tpot_s"] + best["tpot_s_p99"]) / 2, **kw)  # type: ignore[arg-type]
    same = [p for p in tighter["top"] if p["layout"] == best["layout"]]
    assert same and same[0]["batch_cap_per_replica"] < best["batch_cap_per_replica"]


def test_sglang_runs_a_prompt_as_a_forward_of_its_own() -> None:
    """SGLang without --enable-mixed-chunk: a step that takes a prompt is the prompt's prefill forward and then the
    decode step (re-derived from phases.prefill and decode_step); vLLM puts both in one forward."""
    from meshplan.core.serving.phases import decode_step, prefill

    for engine in ("sglang", "vllm"):
        s = resolve("llama-3.1-8b", gpu="h100-sxm", gpus=1, context=1200, engine=engine)
        req = Requests(input_len=1000, output_len=200, concurrency=64.0)
        step = step_at(s.model, s.shape, s.hw, s.layout, req, batch=64.0)
        decode = decode_step(s.model, s.shape, s.hw, s.layout, batch=64.0, context=1100.0)
        chunk = max(1000.0, 64 * 1000 / 200)  # sglang's budget does not count the running decodes
        alone = prefill(s.model, s.shape, s.hw, s.layout, tokens=chunk, sequences=chunk / 1000)
        separate = float(alone.total_s) + float(decode.total_s)
        if engine == "sglang":
            assert float(step.carrying.total_s) == pytest.approx(separate, rel=1e-12)
        else:
            assert float(step.carrying.total_s) < separate


@settings(max_examples=30, deadline=None)
@given(
    load=st.sampled_from(["rate", "concurrency"]),
    amount=st.floats(0.05, 500.0),
    k=st.integers(1, 8),
    a=st.floats(0.0, 1.0),
    hit=st.floats(0.0, 1.0),
    spec=st.booleans(),
    engine=st.sampled_from(["trtllm", "vllm", "sglang"]),
)
def test_percentiles_hold_their_order_under_any_load(
    load: str, amount: float, k: int, a: float, hit: float, spec: bool, engine: str
) -> None:
    """Whatever the load, drafting and prefix hits: p99 >= p50 >= 0 for TTFT (unless saturated) and TPOT, and the
    throughput is the batch over the mean TPOT."""
    kw = {"speculative": f"eagle:{k}", "spec_acceptance": a} if spec else {}
    r = serve_report("llama-3.1-8b", **SERVE, engine=engine, prefix_hit_rate=hit, **{load: amount}, **kw)  # type: ignore[arg-type]
    assert r["tpot_s_p99"] >= r["tpot_s_p50"] > 0 and r["itl_s_p99"] > 0
    if r["ttft_s_p99"] is not None:
        assert r["ttft_s_p99"] >= r["ttft_s_p50"] >= 0 and r["ttft_s_mean"] >= 0
    else:
        assert r["saturated"]
    if (
        load == "concurrency"
    ):  # a closed loop's own intervals leave its own prompt out: the engine's mean step is longer
        assert r["tokens_per_s_per_gpu"] <= r["batch_per_replica"] / r["tpot_s"] * (1 + 1e-9)
    else:
        assert r["tokens_per_s_per_gpu"] == pytest.approx(r["batch_per_replica"] / r["tpot_s"], rel=1e-9)


def test_a_request_s_intervals_carry_only_the_other_users_prompts() -> None:
    """ITL as AIPerf takes it, (latency - TTFT) / (O - 1): a request's own prompt ran before its first token. One
    user's intervals are plain decode steps; C users' carry C - 1 of every C prompts; the throughput is still the
    batch over the engine's mean step, every prompt in it."""
    s = resolve("llama-3.3-70b", gpu="h100-sxm", gpus=2, tp=2, weights_dtype="fp8", context=5500)
    for users in (1.0, 2.0, 25.0):
        req = Requests(input_len=5000, output_len=500, concurrency=users)
        pt = load_point(s.model, s.shape, s.hw, s.layout, req)
        step = step_at(s.model, s.shape, s.hw, s.layout, req, batch=users)
        tp, tc, f = float(step.plain.total_s), float(step.carrying.total_s), float(step.share)
        assert f == pytest.approx(users * 5000 / 500 / 5000)  # a whole 5,000-token prompt per carrying step
        own = f * (users - 1) / users
        assert pt.tpot_s == pytest.approx((1 - own) * tp + own * tc, rel=1e-12)
        assert pt.output_tokens_per_s == pytest.approx(users / ((1 - f) * tp + f * tc), rel=1e-12)
        pre = float(ttft_s(s.model, s.shape, s.hw, s.layout, req, batch=users - 1))
        busy = min(users - 1, 1.0)  # one user finds the engine idle: no step boundary to wait for
        queue = float(prompt_queue(s.hw, s.layout, req, step, batch=users, users=users).wait_s_p50)
        assert pt.ttft_s_mean == pytest.approx(pre + busy * pt.tpot_s / 2 + queue, rel=1e-9)
    assert own_share(0.1, 1.0, closed=True) == 0.0 and own_share(0.1, 4.0, closed=False) == 0.1
    assert busy_share(0.5, closed=True) == 0.0 and busy_share(3.0, closed=True) == 1.0
    assert busy_share(2.0, closed=False) == pytest.approx(1 - math.exp(-2.0))
