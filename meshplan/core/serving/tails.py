"""Latency percentiles of a replica under load: TTFT and TPOT at p50, p99 and their means.

TTFT = prefill (beside the batch) + the wait for the next step boundary (uniform over a step: t/2 at the mean
and the median, a whole step at p99) + a fixed wait (a closed loop's users beyond the batch cap: (C - B) / X) +
the queue waits W1 + W2 for a batch slot (M/D/c) and for the step's prompt-token budget (M/D/c, as many servers as
whole prompts fit in what a step leaves). Each queue wait
is 0 with probability 1 - p_i and otherwise exponential of mean a (W1) or b (W2), its queue's heavy-traffic
tail, so the sum's tail is

  P(W1 + W2 > x) = p1 (1 - p2) e^(-x/a) + p2 (1 - p1) e^(-x/b) + p1 p2 (a e^(-x/a) - b e^(-x/b)) / (a - b)

((1 + x/a) e^(-x/a) for a = b), whose quantiles are found by bisection (arrays broadcast).

TPOT of a request is the mean of its n = (O - 1) / E step intervals (E tokens a step, 1 without speculation).
A step carries a prefill chunk with probability f (t_c, else t_p), the batch a request sees over its life varies
(an open loop's batch is Poisson, M/G/inf; its mean over a window as long as a request's life has variance
2B/3 for a deterministic life), and a speculative step yields X tokens (variance Var X). With the three
independent and n large (normal):

  mean = ((1 - f) t_p + f t_c) / E
  var  = f (1 - f) (t_c - t_p)^2 / (E (O - 1))  +  t^2 Var X / (E^3 (O - 1))  +  sigma_batch^2
  p50 = mean,  p99 = mean + z_0.99 sqrt(var)

sigma_batch = (t(B_hi) - t(B)) / z_0.99 / E, B_hi = min(B + z_0.99 sqrt(2B/3), cap) (0 in a closed loop, whose
batch is its users). The p99 of one token's interval (ITL) is a whole step with a chunk where more than 1% of the
steps carry one, a plain step otherwise.

What a request's own intervals see (``own_share``): TPOT and ITL as the benchmarks take them leave the first token
out (AIPerf and genai-perf: ITL = (request latency - TTFT) / (output tokens - 1), per request, then averaged), so
the step that ran the request's own prompt is in its TTFT, not in its intervals. The steps between its tokens
carry the other sequences' prompts only: at rate lambda under Poisson arrivals (the others arrive as the whole
stream does), but in a closed loop of B sequences a slot's next prompt follows its request's end, so the B - 1
other slots send (B - 1) / B of the stream: f_own = f (B - 1) / B, none at B = 1.

The wait for the step boundary (``busy_share``): an engine with no sequence in flight takes a new request at once
(TensorRT-LLM's executor waits on its request queue only while no request is active and fetches new ones before each
iteration, cpp/tensorrt_llm/executor/executorImpl.cpp, getLeaderNewReqWithIds: 'mQueuedReqCv.wait(lck, ...
!mQueuedRequests.empty() || numActiveRequests > 0 ...)'; with nothing in flight no step runs, in any engine), so the
half step (a whole one at p99) is waited only where another sequence is in flight: always in a closed loop of two or
more, never in one of one (busy = min(max(B - 1, 0), 1)); under Poisson arrivals the sequences in flight are Poisson
of mean B (M/G/inf), busy = 1 - e^(-B).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from meshplan.core.num import Num

Z99 = 2.3263478740408408
"""The standard normal's 99th percentile."""
P99 = 0.99
BISECTIONS = 60


def _scalar(x: np.ndarray) -> Num:
    return x.item() if np.ndim(x) == 0 else x


def tail_sum(x: Num, p1: Num, th1: Num, p2: Num, th2: Num) -> Num:
    """P(W1 + W2 > x) for waits that are 0 w.p. 1 - p_i and exponential of scale th_i otherwise."""
    x, p1, p2 = (np.asarray(v, dtype=np.float64) for v in (x, p1, p2))
    a, b = (np.maximum(np.asarray(v, dtype=np.float64), 1e-300) for v in (th1, th2))
    ea, eb = np.exp(-x / a), np.exp(-x / b)
    close = np.abs(a - b) <= 1e-9 * np.maximum(a, b)
    both = np.where(close, (1 + x / a) * ea, (a * ea - b * eb) / np.where(close, 1.0, a - b))
    return _scalar(p1 * (1 - p2) * ea + p2 * (1 - p1) * eb + p1 * p2 * both)


def wait_quantile(q: float, p1: Num, th1: Num, p2: Num = 0.0, th2: Num = 1.0) -> Num:
    """The ``q`` quantile of W1 + W2 (0 where the chance of any wait is below 1 - q; inf where a scale is)."""
    p1, th1, p2, th2 = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (p1, th1, p2, th2)))
    p1, p2 = np.where(th1 > 0, np.clip(p1, 0, 1), 0.0), np.where(th2 > 0, np.clip(p2, 0, 1), 0.0)
    infinite = (np.isinf(th1) & (p1 > 0)) | (np.isinf(th2) & (p2 > 0))
    a, b = np.where(np.isfinite(th1), th1, 1.0), np.where(np.isfinite(th2), th2, 1.0)
    top = np.maximum(a, b) * (math.log(1 / (1 - q)) + 5)
    lo, hi = np.zeros_like(top), top
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        above = np.asarray(tail_sum(mid, p1, a, p2, b)) > 1 - q
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    none = 1 - (1 - p1) * (1 - p2) <= 1 - q
    return _scalar(np.where(infinite, np.inf, np.where(none, 0.0, hi)))


@dataclass(frozen=True, slots=True, kw_only=True)
class TpotTails:
    mean_s: Num
    p50_s: Num
    p99_s: Num
    itl_p99_s: Num
    """One token's interval at p99: a whole step (with a chunk where chunks are common)."""


def tpot_tails(
    *,
    plain_s: Num,
    carrying_s: Num,
    share: Num,
    output_len: int,
    tokens_per_step: float = 1.0,
    tokens_variance: float = 0.0,
    batch_sd_s: Num = 0.0,
) -> TpotTails:
    """Per-request TPOT (module docstring): ``plain_s`` and ``carrying_s`` are whole steps (all stages), ``share``
    the steps carrying a chunk, ``batch_sd_s`` the spread of a request's mean step from its batch's."""
    tp, tc, f = (np.asarray(v, dtype=np.float64) for v in (plain_s, carrying_s, share))
    e, n = tokens_per_step, max(output_len - 1, 1)
    step = (1 - f) * tp + f * tc
    mean = step / e
    var = f * (1 - f) * (tc - tp) ** 2 / (e * n) + step**2 * tokens_variance / (e**3 * n)
    var = var + np.asarray(batch_sd_s, dtype=np.float64) ** 2
    p99 = mean + Z99 * np.sqrt(var)
    itl = np.where(f > 1 - P99, tc, tp)
    return TpotTails(mean_s=_scalar(mean), p50_s=_scalar(mean), p99_s=_scalar(p99), itl_p99_s=_scalar(itl))


def own_share(share: Num, batch: Num, *, closed: bool) -> Num:
    """The share of the steps between a request's own tokens that carry another's prompt (module docstring)."""
    f = np.asarray(share, dtype=np.float64)
    if not closed:
        return _scalar(f)
    b = np.asarray(batch, dtype=np.float64)
    return _scalar(f * np.maximum(b - 1, 0.0) / np.maximum(b, 1e-12))


def busy_share(batch: Num, *, closed: bool) -> Num:
    """The chance an arriving request finds a step running, and waits for its boundary (module docstring)."""
    b = np.asarray(batch, dtype=np.float64)
    return _scalar(np.clip(b - 1, 0.0, 1.0) if closed else -np.expm1(-b))


def batch_high(batch: float, cap: float) -> float:
    """The p99 of an open loop's batch over a request's life, capped: B + z sqrt(2B/3) (module docstring)."""
    return min(batch + Z99 * math.sqrt(2 * batch / 3), cap)


def erlang_c(servers: int, offered: float) -> float:
    """Probability an arrival waits in M/M/c (Erlang B recurrence, then C)."""
    if offered >= servers:
        return 1.0
    b = 1.0
    for k in range(1, servers + 1):
        b = offered * b / (k + offered * b)
    rho = offered / servers
    return b / (1 - rho + rho * b)


def mdc_wait_share(rho: Num, servers: Num) -> Num:
    """The chance an arrival waits in M/D/c at utilization rho (arrays broadcast): Sakasegawa's approximation of
    M/M/c's queue, rho^(sqrt(2 (c + 1)) - 1), whose mean wait S p / (c (1 - rho)) is halved for a deterministic
    service by the caller; exactly rho (M/D/1's and M/M/1's) at c = 1."""
    r, c = np.asarray(rho, dtype=np.float64), np.asarray(servers, dtype=np.float64)
    return _scalar(np.where(r > 0, np.maximum(r, 1e-300) ** (np.sqrt(2 * (c + 1)) - 1), 0.0))
