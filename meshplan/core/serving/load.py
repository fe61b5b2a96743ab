"""Serving under load: continuous batching capped by KV capacity, max batch and tokens per step.

Steady state of a replica holding B sequences (I input and O output tokens each, P = I - cached of the prompt
computed, E output tokens a step: 1, or speculative decoding's; b = B / (pp x d) per forward, d = tp under
attention-DP, else 1):
  step      t(b) = pp x forward(b decode tokens at mean context I + O/2, + b P E / O prefill tokens riding along)
  TPOT      t(b) / E with the other sequences' prompts only (a closed loop's own: (B - 1) / B of the share; mean;
            p50 and p99 in core/serving/tails.py);   output tokens/s per replica  B E / t(b)
  TTFT      ceil(P / (N_step - b)) chunks of a step with the chunk in it, + half a step of waiting for the
            step boundary where a step runs (p99: a whole step), + the queues for a batch slot and for the step's
            token budget
Closed loop (C users, no think time): B = min(C, cap); beyond the cap the extra users queue, W = (C - B) / X
by Little's law (X requests/s). Open loop (rate R): B solves B = R (TTFT + (O - 1) TPOT(B)), the least root,
bracketed and bisected; the slot queue is M/D/c with c = cap (Erlang C halved for deterministic service;
Allen-Cunneen), exponential beyond. The knee is the smallest batch reaching 90% of the throughput at the cap.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from meshplan.core.num import Num
from meshplan.core.serving.phases import Forward, MixedStep, decode_step, pipeline_factor, prefill
from meshplan.core.serving.shape import Hardware, ReplicaShape, ServeLayout, graph_batch
from meshplan.core.serving.speculative import Speculation, add_forwards, spec_step
from meshplan.core.serving.tails import (
    P99,
    Z99,
    batch_high,
    busy_share,
    erlang_c,
    mdc_wait_share,
    own_share,
    tpot_tails,
    wait_quantile,
)
from meshplan.spec.model import ModelSpec

KNEE_SHARE = 0.9
"""The knee: the smallest batch whose throughput reaches this share of the throughput at the cap."""
P99_TAIL = 0.01


class BatchLimit(StrEnum):
    """What stops the batch from growing."""

    LOAD = "load"
    """The offered load: fewer requests than slots."""
    KV_CACHE = "kv-cache"
    """The KV cache: no room for another sequence."""
    MAX_BATCH = "max-batch"
    """The engine's cap on sequences per step."""
    MAX_TOKENS = "max-tokens"
    """The engine's cap on tokens per step."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Requests:
    """The traffic: request shape and either closed-loop concurrency or an open-loop rate (per replica)."""

    input_len: int
    output_len: int
    concurrency: float | None = None
    rate_per_s: float | None = None
    max_batch: int | None = None
    """A batch cap below the engine's (the planner's knob)."""
    prefix_hit_rate: float = 0.0
    """Share of each prompt whose KV the engine finds in its prefix cache (computed once, still held)."""
    speculation: Speculation | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.prefix_hit_rate <= 1.0:
            raise ValueError(f"the prefix hit rate is a share of the prompt (0..1), got {self.prefix_hit_rate}")
        if self.input_len < 1 or self.output_len < 1:
            raise ValueError(f"input and output lengths must be >= 1, got {self.input_len} and {self.output_len}")
        if (self.concurrency is None) == (self.rate_per_s is None):
            raise ValueError("give exactly one of concurrency and rate")
        if (self.concurrency or 1) <= 0 or (self.rate_per_s or 1) <= 0:
            raise ValueError("concurrency and rate must be positive")

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens found in the prefix cache: H I, all but the last (an engine computes at least one token
        to sample from: vLLM's KV cache manager caps a full hit at I - 1, SGLang matches at most I - 1)."""
        return min(math.floor(self.prefix_hit_rate * self.input_len), self.input_len - 1)

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens a prefill computes: I - cached."""
        return self.input_len - self.cached_tokens

    @property
    def tokens_per_step(self) -> float:
        """Output tokens a sequence gains per step: 1, or E with speculative decoding."""
        return 1.0 if self.speculation is None else self.speculation.tokens_per_step

    @property
    def step_tokens(self) -> int:
        """Tokens a decoding sequence puts in a step: 1, or K + 1 with speculative decoding."""
        return 1 if self.speculation is None else self.speculation.k + 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Capacity:
    """How many sequences a replica can batch, and which cap binds."""

    sequences: int
    limit: BatchLimit
    kv_sequences: int
    per_forward: int
    """Divisor from replica sequences to the batch of one forward (pp x attention-DP ranks)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadPoint:
    """A replica at steady state under the given traffic."""

    batch: float
    """Sequences in flight per replica."""
    limit: BatchLimit
    capacity: Capacity
    step: MixedStep
    """The average forward (per GPU, per micro-batch) at that batch: decode-only steps and chunk-carrying ones."""
    tpot_s: float
    ttft_s_p50: float | None
    ttft_s_p99: float | None
    ttft_unloaded_s: float
    queue_s_p50: float
    queue_s_p99: float
    output_tokens_per_s: float
    requests_per_s: float
    saturated: bool
    knee_batch: int
    max_output_tokens_per_s: float
    ttft_s_mean: float | None = None
    tpot_s_p50: float = 0.0
    tpot_s_p99: float = 0.0
    itl_s_p99: float = 0.0


def capacity(
    model: ModelSpec,
    shape: ReplicaShape,
    hw: Hardware,
    layout: ServeLayout,
    req: Requests,
    *,
    prefill_in_step: bool = True,
) -> Capacity:
    """Sequences per replica: the least of the KV cache, the engine's max batch, the user's cap and the tokens a
    step may carry. Where prompts ride in the decode steps (``prefill_in_step``), a forward of b sequences carries
    b decode tokens and, on average, b I / O prompt tokens: b (1 + I / O) <= N_step (trtllm-bench sizes
    max_num_tokens the same way, tensorrt_llm/bench/build/tuning.py); a decode-only pool needs one token each."""
    reserve = req.input_len + (req.output_len if hw.cal.reserve_full_sequence else req.output_len / 2)
    ranks = layout.tp if layout.dp_attention else 1
    held = shape if req.speculation is None else req.speculation.holding(shape, model)
    kv = int(max(held.max_sequences(model, tokens_per_sequence=reserve), 0)) * ranks
    engine = hw.cal.max_batch * ranks
    caps = [(kv, BatchLimit.KV_CACHE), (engine, BatchLimit.MAX_BATCH)]
    if req.max_batch is not None:
        caps.append((req.max_batch, BatchLimit.MAX_BATCH))
    prompts = req.prompt_tokens * req.tokens_per_step / req.output_len if prefill_in_step else 0.0
    per_sequence = req.step_tokens + prompts
    tokens_cap = math.floor(hw.cal.max_num_tokens / per_sequence) * layout.pp * ranks
    caps.append((tokens_cap, BatchLimit.MAX_TOKENS))
    seqs, limit = min(caps, key=lambda c: c[0])
    return Capacity(sequences=max(seqs, 0), limit=limit, kv_sequences=kv, per_forward=layout.pp * ranks)


def _prompt_room(hw: Hardware, req: Requests, per_forward: Num) -> Num:
    """Tokens of max_num_tokens left for prompts beside ``per_forward`` decoding sequences (unclamped)."""
    return hw.cal.max_num_tokens - (0.0 if hw.cal.separate_prefill else per_forward * req.step_tokens)


def _chunks(hw: Hardware, layout: ServeLayout, req: Requests, batch: object) -> tuple[Num, Num, Num]:
    """(sequences per forward, prompt tokens a carrying step carries, share of the steps that carry them)."""
    arr = np.asarray(batch, dtype=np.float64) / (layout.pp * (layout.tp if layout.dp_attention else 1))
    demand = arr * req.prompt_tokens * req.tokens_per_step / req.output_len
    budget = np.maximum(_prompt_room(hw, req, arr), 0.0)
    chunk = np.minimum(np.maximum(float(req.prompt_tokens), demand), budget)
    share = np.where(chunk > 0, np.minimum(demand / np.maximum(chunk, 1e-9), 1.0), 0.0)
    b, c, f = (x.item() if np.ndim(x) == 0 else x for x in (arr, chunk, share))
    return b, c, f


def step_at(
    model: ModelSpec, shape: ReplicaShape, hw: Hardware, layout: ServeLayout, req: Requests, *, batch: object
) -> MixedStep:
    """The average steady-state forward with ``batch`` sequences per replica (arrays broadcast): new prompts
    arrive at b P E / O tokens per step (P the prompt tokens computed, E the output tokens a step) and ride in chunks
    of min(max(P, b P E / O), N_step - b q) tokens (q tokens each decoding sequence puts in a step), so a share
    b P E / O / chunk of the steps carries one."""
    b, c, f = _chunks(hw, layout, req, batch)
    context = req.input_len + req.output_len / 2
    rows = graph_batch(b) if hw.cal.cuda_graph_padding else b  # decode-only steps replay a padded graph
    plain = _decode(model, shape, hw, layout, req, batch=b, context=context, rows=rows)
    carrying = _carrying(model, shape, hw, layout, req, batch=b, context=context, chunk=c)
    return MixedStep(plain=plain, carrying=carrying, share=f)


def _carrying(
    model: ModelSpec,
    shape: ReplicaShape,
    hw: Hardware,
    layout: ServeLayout,
    req: Requests,
    *,
    batch: Num,
    context: Num,
    chunk: Num,
) -> Forward:
    """A decode step with a prompt chunk: in the same forward, or (``separate_prefill`` engines) the chunk's own
    prefill forward and then the decode step, which the decoding sequences wait through."""
    if not hw.cal.separate_prefill:
        return _decode(model, shape, hw, layout, req, batch=batch, context=context, prefill_tokens=chunk)
    p = float(req.prompt_tokens)
    alone = prefill(
        model,
        shape,
        hw,
        layout,
        tokens=chunk,
        cached=req.cached_tokens + np.maximum(p - chunk, 0.0) / 2,
        sequences=np.maximum(chunk / p, 1.0),
    )
    return add_forwards(alone, _decode(model, shape, hw, layout, req, batch=batch, context=context))


def _decode(
    model: ModelSpec,
    shape: ReplicaShape,
    hw: Hardware,
    layout: ServeLayout,
    req: Requests,
    *,
    batch: Num,
    context: Num,
    prefill_tokens: Num = 0.0,
    rows: Num | None = None,
) -> Forward:
    """A decode step, or a speculative one (verify and draft) where ``req`` drafts."""
    if req.speculation is None:
        return decode_step(
            model, shape, hw, layout, batch=batch, context=context, prefill_tokens=prefill_tokens, rows=rows
        )
    return spec_step(
        model,
        shape,
        hw,
        layout,
        req.speculation,
        batch=batch,
        context=context,
        prefill_tokens=prefill_tokens,
        rows=rows,
    )


def ttft_s(
    model: ModelSpec, shape: ReplicaShape, hw: Hardware, layout: ServeLayout, req: Requests, *, batch: Num
) -> Num:
    """Prefill of one request in chunks beside ``batch`` decoding sequences per replica (no queueing, no
    wait for the step boundary); arrays of batches broadcast."""
    ranks = layout.tp if layout.dp_attention else 1
    b = np.asarray(batch, dtype=np.float64) / (layout.pp * ranks)
    p = float(req.prompt_tokens)
    chunk = np.minimum(p, np.maximum(_prompt_room(hw, req, b), 1.0))
    chunks = np.ceil(p / chunk)
    alone = prefill(model, shape, hw, layout, tokens=chunk, cached=req.cached_tokens + (p - chunk) / 2).total_s
    context = req.input_len + req.output_len / 2
    beside = _carrying(model, shape, hw, layout, req, batch=b, context=context, chunk=chunk).total_s
    out = chunks * pipeline_factor(hw, layout) * np.where(b < 1, alone, beside)
    return float(out) if out.ndim == 0 else out


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptQueue:
    """The wait of a prompt for the step budget that prompts ahead of it hold (mean and p99), and the budget's
    utilization (arrays where the batch is one)."""

    wait_share: Num
    """The chance a prompt waits for the budget (the utilization where one prompt fills it)."""
    wait_s_p50: Num
    """The mean wait."""
    wait_s_p99: Num
    scale_s: Num
    """theta: a prompt that waits, waits exponentially with this mean."""
    cap_s: Num
    """The longest wait a closed loop allows (inf in an open one)."""


def prompt_queue(
    hw: Hardware, layout: ServeLayout, req: Requests, step: MixedStep, *, batch: object, users: object = None
) -> PromptQueue:
    """Prompts queue for the tokens a step may carry, first come first served: TensorRT-LLM's micro-batch scheduler
    admits a context request only where its tokens fit in what is left of max_num_tokens and stops at the first
    that does not (cpp/tensorrt_llm/batch_manager/microBatchScheduler.cpp, chunked context off by default); vLLM
    and SGLang fill the same budget in arrival order. What a step leaves beside the decoding tokens holds c =
    max(floor(left / I), 1) whole prompts: c servers, each prompt holding one for S = t_carrying max(I / chunk, 1),
    rho = (prompts a step) (S / t) / c; Poisson arrivals, M/D/c (tails.py ``mdc_wait_share``; exactly M/D/1 at
    c = 1), at most C - 1 prompts ahead in a closed loop (docs/formulas.md, prompt queue). Arrays broadcast."""
    b, chunk, share = _chunks(hw, layout, req, batch)
    carrying, mean = np.asarray(step.carrying.total_s, dtype=np.float64), np.asarray(step.total_s, dtype=np.float64)
    left = np.maximum(_prompt_room(hw, req, np.asarray(b, dtype=np.float64)), 1.0)
    prompt = float(req.prompt_tokens)
    slots = np.maximum(np.floor(left / prompt), 1.0)
    tokens = np.maximum(np.asarray(chunk, dtype=np.float64), 1e-9)
    per_step = np.asarray(share, dtype=np.float64) * tokens / prompt  # prompts arriving a step
    time_share = np.where(mean > 0, carrying / np.maximum(mean, 1e-30), 0.0)
    steps = np.maximum(prompt / tokens, 1.0)  # the steps one prompt's chunks take (1: it runs whole)
    rho = np.minimum(per_step * time_share * steps / slots, 1.0)
    service = pipeline_factor(hw, layout) * carrying * steps
    cap = np.inf if users is None else np.maximum(np.asarray(users, dtype=np.float64) - 1, 0.0) * service
    waits = mdc_wait_share(rho, slots)  # 1 at rho = 1, where the scale (and so every wait) is unbounded
    scale = np.where(rho < 1, service / (2 * slots * np.maximum(1 - rho, 1e-12)), np.inf)
    tail = np.where(waits > P99_TAIL, scale * np.log(np.maximum(waits, P99_TAIL) / P99_TAIL), 0.0)
    p50, p99 = np.minimum(waits * scale, cap), np.minimum(tail, cap)
    u, w50, w99, th, c = (np.asarray(x).item() if np.ndim(x) == 0 else x for x in (waits, p50, p99, scale, cap))
    return PromptQueue(wait_share=u, wait_s_p50=w50, wait_s_p99=w99, scale_s=th, cap_s=c)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Steady:
    """What a load model settles on: the batch, its step, the prefill and queue times, the request rate. The wait
    for a batch slot is ``fixed_s`` plus, with probability ``wait_share``, an exponential of mean ``wait_scale_s``."""

    batch: float
    limit: BatchLimit
    tpot_s: float
    prefill_s: float
    fixed_s: float
    wait_share: float
    wait_scale_s: float
    requests_per_s: float


def _closed_loop(
    req: Requests, cap: Capacity, tpot: Callable[[float], float], first: Callable[[float], float]
) -> _Steady:
    """C users with no think time: B = min(C, cap); the rest wait, (C - B) / X by Little's law."""
    assert req.concurrency is not None
    batch = min(req.concurrency, float(cap.sequences))
    t, pre = tpot(batch), first(batch - 1)
    rate = batch / (pre + busy_share(batch, closed=True) * t / 2 + (req.output_len - 1) * t)
    wait = (req.concurrency - batch) / rate if req.concurrency > batch else 0.0  # none wait below the cap
    limit = BatchLimit.LOAD if req.concurrency <= cap.sequences else cap.limit
    return _Steady(
        batch=batch,
        limit=limit,
        tpot_s=t,
        prefill_s=pre,
        fixed_s=wait,
        wait_share=0.0,
        wait_scale_s=0.0,
        requests_per_s=rate,
    )


SOLVE_POINTS = 513
"""Batches the open loop's fixed point is first bracketed on (then bisected)."""


def _open_loop(
    req: Requests,
    cap: Capacity,
    tpot: Callable[[float], float],
    first: Callable[[float], float],
    sojourn: Callable[[np.ndarray], np.ndarray],
) -> _Steady:
    """Poisson arrivals at R: B = R x time in system S(B) (Little's law), S growing with B through the step. The
    least root of R S(B) - B on [0, cap] is found on a grid, then by bisection (iterating B <- R S(B) converges
    at the rate R S'(B), ever slower as the load nears what the replica serves); with none the batch stays at the
    cap and the queue grows without bound. The wait for a batch slot is M/D/c with c = cap."""
    assert req.rate_per_s is not None
    lam, servers = req.rate_per_s, cap.sequences
    grid = np.linspace(0.0, float(servers), min(servers, SOLVE_POINTS - 1) + 1)
    gap = lam * sojourn(grid) - grid
    below = np.flatnonzero(gap <= 0)
    if below.size == 0:
        batch = float(servers)
    else:
        i = int(below[0])
        lo, hi = float(grid[max(i - 1, 0)]), float(grid[i])
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if lam * float(sojourn(np.asarray(mid))) > mid else (lo, mid)
        batch = hi
    t, pre = tpot(batch), first(batch)
    service = pre + float(busy_share(batch, closed=False)) * t / 2 + (req.output_len - 1) * t
    if lam * service >= servers:
        return _Steady(
            batch=float(servers),
            limit=cap.limit,
            tpot_s=t,
            prefill_s=pre,
            fixed_s=0.0,
            wait_share=1.0,
            wait_scale_s=math.inf,
            requests_per_s=servers / service,
        )
    spare = servers / service - lam
    return _Steady(
        batch=batch,
        limit=BatchLimit.LOAD,
        tpot_s=t,
        prefill_s=pre,
        fixed_s=0.0,
        wait_share=erlang_c(servers, lam * service),
        wait_scale_s=0.5 / spare,
        requests_per_s=lam,
    )


def load_point(model: ModelSpec, shape: ReplicaShape, hw: Hardware, layout: ServeLayout, req: Requests) -> LoadPoint:
    """The replica's batch, latencies (means and percentiles, core/serving/tails.py) and throughput under ``req``."""
    cap = capacity(model, shape, hw, layout, req)
    if cap.sequences < 1:
        raise ValueError(f"no sequence of {req.input_len}+{req.output_len} tokens fits in the KV cache")
    rounds, per_step = pipeline_factor(hw, layout), req.tokens_per_step
    sizes = np.arange(1, cap.sequences + 1, dtype=np.float64)
    curve = sizes * per_step / (rounds * step_at(model, shape, hw, layout, req, batch=sizes).total_s)
    best = float(curve[-1])

    closed = req.concurrency is not None

    def tpot(b: float) -> float:  # the request's own intervals: the other sequences' prompts (core/serving/tails.py)
        st = step_at(model, shape, hw, layout, req, batch=b)
        f = own_share(st.share, b, closed=closed)
        return float(rounds * ((1 - f) * st.plain.total_s + f * st.carrying.total_s) / per_step)

    def first(b: float) -> float:
        return float(ttft_s(model, shape, hw, layout, req, batch=b))

    def sojourn(b: np.ndarray) -> np.ndarray:
        t = rounds * np.asarray(step_at(model, shape, hw, layout, req, batch=b).total_s) / per_step
        wait = np.asarray(busy_share(b, closed=False)) * t / 2
        return np.asarray(ttft_s(model, shape, hw, layout, req, batch=b)) + wait + (req.output_len - 1) * t

    if req.concurrency is not None:
        steady = _closed_loop(req, cap, tpot, first)
    else:
        steady = _open_loop(req, cap, tpot, first, sojourn)
    step = step_at(model, shape, hw, layout, req, batch=steady.batch)
    prompts = prompt_queue(hw, layout, req, step, batch=steady.batch, users=req.concurrency)
    saturated = math.isinf(steady.wait_scale_s) or math.isinf(float(prompts.wait_s_p50))
    t, busy = steady.tpot_s, float(busy_share(steady.batch, closed=closed))
    ttft_mean = ttft_p50 = ttft_p99 = None
    if not saturated:
        base = steady.prefill_s + steady.fixed_s
        waits = (steady.wait_share, steady.wait_scale_s, prompts.wait_share, prompts.scale_s)
        cap_s = float(prompts.cap_s)  # a closed loop holds at most C - 1 prompts ahead
        ttft_mean = base + busy * t / 2 + steady.wait_share * steady.wait_scale_s + float(prompts.wait_s_p50)
        ttft_p50 = base + busy * t / 2 + min(float(wait_quantile(0.5, *waits)), cap_s)
        ttft_p99 = base + (t if busy > P99_TAIL else 0.0) + min(float(wait_quantile(P99, *waits)), cap_s)
    spread = 0.0
    if req.rate_per_s is not None and not saturated:  # an open loop's batch varies over a request's life
        spread = (tpot(batch_high(steady.batch, float(cap.sequences))) - t) / Z99
    spec = req.speculation
    tails = tpot_tails(
        plain_s=rounds * float(step.plain.total_s),
        carrying_s=rounds * float(step.carrying.total_s),
        share=float(own_share(step.share, steady.batch, closed=closed)),
        output_len=req.output_len,
        tokens_per_step=per_step,
        tokens_variance=0.0 if spec is None else spec.tokens_per_step_variance,
        batch_sd_s=spread,
    )
    return LoadPoint(
        batch=steady.batch,
        limit=steady.limit,
        capacity=cap,
        step=step,
        tpot_s=t,
        ttft_s_p50=ttft_p50,
        ttft_s_p99=ttft_p99,
        ttft_unloaded_s=first(0.0),
        queue_s_p50=steady.fixed_s + float(wait_quantile(0.5, steady.wait_share, steady.wait_scale_s)),
        queue_s_p99=steady.fixed_s + float(wait_quantile(P99, steady.wait_share, steady.wait_scale_s)),
        output_tokens_per_s=steady.batch * per_step / (rounds * float(step.total_s)),
        requests_per_s=steady.requests_per_s,
        saturated=saturated,
        knee_batch=int(np.argmax(curve >= KNEE_SHARE * best)) + 1,
        max_output_tokens_per_s=best,
        ttft_s_mean=ttft_mean,
        tpot_s_p50=float(tails.p50_s),
        tpot_s_p99=float(tails.p99_s),
        itl_s_p99=float(tails.itl_p99_s),
    )
