"""Serving under load: continuous batching capped by KV capacity, max batch and tokens per step.

Steady state of a replica holding B sequences (I input and O output tokens each; b = B / (pp x d) per
forward, d = tp under attention-DP, else 1):
  step      t(b) = pp x forward(b decode tokens at mean context I + O/2, + b I / O prefill tokens riding along)
  TPOT=ITL  t(b);   output tokens/s per replica  B / t(b)
  TTFT      ceil(I / (N_step - b)) chunks of a step with the chunk in it, + half a step of waiting for the
            step boundary (p99: a whole step), + the queue for a batch slot
Closed loop (C users, no think time): B = min(C, cap); beyond the cap the extra users queue, W = (C - B) / X
by Little's law (X requests/s). Open loop (rate R): B solves B = R (TTFT + (O - 1) t(b)); the slot queue is
M/D/c with c = cap (Erlang C halved for deterministic service; Allen-Cunneen), its p99 from the exponential
tail. The knee is the smallest batch reaching 90% of the throughput at the cap.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from meshplan.core.num import Num
from meshplan.core.serving.phases import MixedStep, decode_step, pipeline_factor, prefill
from meshplan.core.serving.shape import Hardware, ReplicaShape, ServeLayout, graph_batch
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

    def __post_init__(self) -> None:
        if self.input_len < 1 or self.output_len < 1:
            raise ValueError(f"input and output lengths must be >= 1, got {self.input_len} and {self.output_len}")
        if (self.concurrency is None) == (self.rate_per_s is None):
            raise ValueError("give exactly one of concurrency and rate")
        if (self.concurrency or 1) <= 0 or (self.rate_per_s or 1) <= 0:
            raise ValueError("concurrency and rate must be positive")


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
    kv = int(shape.max_sequences(model, tokens_per_sequence=reserve)) * ranks
    engine = hw.cal.max_batch * ranks
    caps = [(kv, BatchLimit.KV_CACHE), (engine, BatchLimit.MAX_BATCH)]
    if req.max_batch is not None:
        caps.append((req.max_batch, BatchLimit.MAX_BATCH))
    per_sequence = 1 + req.input_len / req.output_len if prefill_in_step else 1.0
    tokens_cap = math.floor(hw.cal.max_num_tokens / per_sequence) * layout.pp * ranks
    caps.append((tokens_cap, BatchLimit.MAX_TOKENS))
    seqs, limit = min(caps, key=lambda c: c[0])
    return Capacity(sequences=max(seqs, 0), limit=limit, kv_sequences=kv, per_forward=layout.pp * ranks)


def _chunks(hw: Hardware, layout: ServeLayout, req: Requests, batch: object) -> tuple[Num, Num, Num]:
    """(sequences per forward, prompt tokens a carrying step carries, share of the steps that carry them)."""
    arr = np.asarray(batch, dtype=np.float64) / (layout.pp * (layout.tp if layout.dp_attention else 1))
    demand = arr * req.input_len / req.output_len
    budget = np.maximum(hw.cal.max_num_tokens - arr, 0.0)
    chunk = np.minimum(np.maximum(float(req.input_len), demand), budget)
    share = np.where(chunk > 0, np.minimum(demand / np.maximum(chunk, 1e-9), 1.0), 0.0)
    b, c, f = (x.item() if np.ndim(x) == 0 else x for x in (arr, chunk, share))
    return b, c, f


def step_at(
    model: ModelSpec, shape: ReplicaShape, hw: Hardware, layout: ServeLayout, req: Requests, *, batch: object
) -> MixedStep:
    """The average steady-state forward with ``batch`` sequences per replica (arrays broadcast): new prompts
    arrive at b I / O tokens per step and ride in chunks of min(max(I, b I / O), N_step - b) tokens, so a share
    b I / O / chunk of the steps carries one."""
    b, c, f = _chunks(hw, layout, req, batch)
    context = req.input_len + req.output_len / 2
    rows = graph_batch(b) if hw.cal.cuda_graph_padding else b  # decode-only steps replay a padded graph
    plain = decode_step(model, shape, hw, layout, batch=b, context=context, rows=rows)
    carrying = decode_step(model, shape, hw, layout, batch=b, context=context, prefill_tokens=c)
    return MixedStep(plain=plain, carrying=carrying, share=f)


def ttft_s(
    model: ModelSpec, shape: ReplicaShape, hw: Hardware, layout: ServeLayout, req: Requests, *, batch: Num
) -> Num:
    """Prefill of one request in chunks beside ``batch`` decoding sequences per replica (no queueing, no
    wait for the step boundary); arrays of batches broadcast."""
    ranks = layout.tp if layout.dp_attention else 1
    b = np.asarray(batch, dtype=np.float64) / (layout.pp * ranks)
    chunk = np.minimum(float(req.input_len), np.maximum(hw.cal.max_num_tokens - b, 1.0))
    chunks = np.ceil(req.input_len / chunk)
    alone = prefill(model, shape, hw, layout, tokens=chunk, cached=(req.input_len - chunk) / 2).total_s
    context = req.input_len + req.output_len / 2
    beside = decode_step(model, shape, hw, layout, batch=b, context=context, prefill_tokens=chunk).total_s
    out = chunks * pipeline_factor(hw, layout) * np.where(b < 1, alone, beside)
    return float(out) if out.ndim == 0 else out


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptQueue:
    """The wait of a prompt for the step budget that prompts ahead of it hold (mean and p99), and the budget's
    utilization (arrays where the batch is one)."""

    utilization: Num
    wait_s_p50: Num
    wait_s_p99: Num


def prompt_queue(
    hw: Hardware, layout: ServeLayout, req: Requests, step: MixedStep, *, batch: object, users: object = None
) -> PromptQueue:
    """Prompts queue for the tokens a step may carry, first come first served: TensorRT-LLM's micro-batch scheduler
    admits a context request only when its tokens fit in what is left of max_num_tokens and stops at the first
    that does not (cpp/tensorrt_llm/batch_manager/microBatchScheduler.cpp: 'if (maxNumTokensRuntime &&
    batchNumTokens + reqNumTokens > maxNumTokensRuntime.value()) break;', chunked context off by default); the
    chunked-prefill engines (vLLM, SGLang) fill the same budget in arrival order. The budget is a server busy for
    the carrying steps: utilization rho = share x t_carrying / t (< 1 while the steps are not all carrying), one
    prompt holding it for S = t_carrying x I / chunk. Arrivals taken as Poisson: M/D/1, mean wait
    rho S / (2 (1 - rho)), p99 from the exponential tail (P(wait) = rho); a closed loop of C users never holds more
    than C - 1 prompts ahead (a saturated budget: rho = 1). Arrays of batches (and users) broadcast."""
    _, chunk, share = _chunks(hw, layout, req, batch)
    carrying, mean = np.asarray(step.carrying.total_s, dtype=np.float64), np.asarray(step.total_s, dtype=np.float64)
    busy = np.asarray(share, dtype=np.float64) * carrying
    rho = np.where(mean > 0, np.minimum(busy / np.maximum(mean, 1e-30), 1.0), 0.0)
    tokens = np.maximum(np.asarray(chunk, dtype=np.float64), 1e-9)
    service = pipeline_factor(hw, layout) * carrying * np.minimum(req.input_len / tokens, 1.0)
    cap = np.inf if users is None else np.maximum(np.asarray(users, dtype=np.float64) - 1, 0.0) * service
    free = np.maximum(1 - rho, 1e-12)
    mean_wait = np.where(rho < 1, rho * service / (2 * free), np.inf)
    tail = np.where(rho > P99_TAIL, service / (2 * free) * np.log(np.maximum(rho, P99_TAIL) / P99_TAIL), 0.0)
    tail = np.where(rho < 1, tail, np.inf)
    p50, p99 = np.minimum(mean_wait, cap), np.minimum(tail, cap)
    u, w50, w99 = (x.item() if np.ndim(x) == 0 else x for x in (rho, p50, p99))
    return PromptQueue(utilization=u, wait_s_p50=w50, wait_s_p99=w99)


def erlang_c(servers: int, offered: float) -> float:
    """Probability an arrival waits in M/M/c (Erlang B recurrence, then C)."""
    if offered >= servers:
        return 1.0
    b = 1.0
    for k in range(1, servers + 1):
        b = offered * b / (k + offered * b)
    rho = offered / servers
    return b / (1 - rho + rho * b)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Steady:
    """What a load model settles on: the batch, its step, the prefill and queue times, the request rate."""

    batch: float
    limit: BatchLimit
    tpot_s: float
    prefill_s: float
    wait_s_p50: float
    wait_s_p99: float
    requests_per_s: float


def _closed_loop(
    req: Requests, cap: Capacity, tpot: Callable[[float], float], first: Callable[[float], float]
) -> _Steady:
    """C users with no think time: B = min(C, cap); the rest wait, (C - B) / X by Little's law."""
    assert req.concurrency is not None
    batch = min(req.concurrency, float(cap.sequences))
    t, pre = tpot(batch), first(batch - 1)
    rate = batch / (pre + t / 2 + (req.output_len - 1) * t)
    wait = (req.concurrency - batch) / rate
    limit = BatchLimit.LOAD if req.concurrency <= cap.sequences else cap.limit
    return _Steady(
        batch=batch, limit=limit, tpot_s=t, prefill_s=pre, wait_s_p50=wait, wait_s_p99=wait, requests_per_s=rate
    )


def _open_loop(
    req: Requests, cap: Capacity, tpot: Callable[[float], float], first: Callable[[float], float]
) -> _Steady:
    """Poisson arrivals at R: B = R x time in system (a fixed point from below, monotone in B); the wait
    for a batch slot is M/D/c with c = cap."""
    assert req.rate_per_s is not None
    lam, batch = req.rate_per_s, 1.0
    for _ in range(60):
        t = tpot(batch)
        nxt = lam * (first(batch) + t / 2 + (req.output_len - 1) * t)
        if nxt >= cap.sequences or abs(nxt - batch) < 1e-3:
            batch = min(nxt, float(cap.sequences))
            break
        batch = max(nxt, 1e-6)
    t, pre = tpot(batch), first(batch)
    service = pre + t / 2 + (req.output_len - 1) * t
    servers = cap.sequences
    if lam * service >= servers:
        return _Steady(
            batch=float(servers),
            limit=cap.limit,
            tpot_s=t,
            prefill_s=pre,
            wait_s_p50=math.inf,
            wait_s_p99=math.inf,
            requests_per_s=servers / service,
        )
    p_wait = erlang_c(servers, lam * service)
    spare = servers / service - lam
    p99 = 0.5 * math.log(p_wait / P99_TAIL) / spare if p_wait > P99_TAIL else 0.0
    return _Steady(
        batch=batch,
        limit=BatchLimit.LOAD,
        tpot_s=t,
        prefill_s=pre,
        wait_s_p50=0.5 * p_wait / spare,
        wait_s_p99=p99,
        requests_per_s=lam,
    )


def load_point(model: ModelSpec, shape: ReplicaShape, hw: Hardware, layout: ServeLayout, req: Requests) -> LoadPoint:
    """The replica's batch, latencies and throughput under ``req``."""
    cap = capacity(model, shape, hw, layout, req)
    if cap.sequences < 1:
        raise ValueError(f"no sequence of {req.input_len}+{req.output_len} tokens fits in the KV cache")
    rounds = pipeline_factor(hw, layout)
    sizes = np.arange(1, cap.sequences + 1, dtype=np.float64)
    curve = sizes / (rounds * step_at(model, shape, hw, layout, req, batch=sizes).total_s)
    best = float(curve[-1])

    def tpot(b: float) -> float:
        return float(rounds * step_at(model, shape, hw, layout, req, batch=b).total_s)

    def first(b: float) -> float:
        return float(ttft_s(model, shape, hw, layout, req, batch=b))

    steady = (_closed_loop if req.concurrency is not None else _open_loop)(req, cap, tpot, first)
    step = step_at(model, shape, hw, layout, req, batch=steady.batch)
    prompts = prompt_queue(hw, layout, req, step, batch=steady.batch, users=req.concurrency)
    saturated = math.isinf(steady.wait_s_p50) or math.isinf(float(prompts.wait_s_p50))
    t = steady.tpot_s
    return LoadPoint(
        batch=steady.batch,
        limit=steady.limit,
        capacity=cap,
        step=step,
        tpot_s=t,
        ttft_s_p50=None if saturated else steady.prefill_s + t / 2 + steady.wait_s_p50 + float(prompts.wait_s_p50),
        ttft_s_p99=None if saturated else steady.prefill_s + t + steady.wait_s_p99 + float(prompts.wait_s_p99),
        ttft_unloaded_s=first(0.0),
        queue_s_p50=steady.wait_s_p50,
        queue_s_p99=steady.wait_s_p99,
        output_tokens_per_s=steady.batch / t,
        requests_per_s=steady.requests_per_s,
        saturated=saturated,
        knee_batch=int(np.argmax(curve >= KNEE_SHARE * best)) + 1,
        max_output_tokens_per_s=best,
    )


def static_batch_s(
    model: ModelSpec,
    shape: ReplicaShape,
    hw: Hardware,
    layout: ServeLayout,
    *,
    batch: int,
    input_len: int,
    output_len: int,
) -> tuple[float, float]:
    """(prefill, decode) seconds of a static batch: all prompts prefilled at once, then O - 1 decode steps
    at the mean context (the KV read is linear in context, so the mean step is the step at the mean)."""
    b = batch / layout.pp
    pre = pipeline_factor(hw, layout) * prefill(model, shape, hw, layout, tokens=b * input_len, sequences=b).total_s
    steps = max(output_len - 1, 0)
    dec = (
        pipeline_factor(hw, layout)
        * decode_step(model, shape, hw, layout, batch=b, context=input_len + output_len / 2).total_s
    )
    return float(pre), float(steps * dec)
