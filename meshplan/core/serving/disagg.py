"""Disaggregated serving: prefill and decode in separate pools, the KV cache handed over between them.

With g GPUs per replica, P prefill GPUs (P/g replicas) and D decode GPUs (D/g replicas):
  prefill pool  a replica prefills chunks of N_step tokens back to back, I-token prompts:
                requests/s = (P/g) N_step / (I t_prefill(N_step))
  decode pool   decode steps with nothing riding along, t(B) = decode_step(B, I + O/2):
                requests/s = (D/g) B / (O t(B)), B capped by the KV cache and the engine
  hand-over     a request's I-token KV cache leaves each prefill GPU through its NIC:
                I kv_tok / bw_out + alpha (DistServe, Zhong et al. 2024, Sec. 4; Mooncake)
  TTFT          prefill of I alone + the hand-over + the prefill queue (M/D/c, c = P/g) + half a decode step
The pool that saturates first sets the request rate (the bottleneck).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from meshplan.core.serving.load import P99_TAIL, BatchLimit, Capacity, Requests, capacity
from meshplan.core.serving.phases import Forward, decode_step, pipeline_factor, prefill
from meshplan.core.serving.shape import Hardware, ReplicaShape, ServeLayout
from meshplan.core.serving.tails import erlang_c
from meshplan.spec.model import ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Pools:
    """Replicas of each pool (all with the same layout)."""

    prefill_replicas: int
    decode_replicas: int

    def __post_init__(self) -> None:
        if self.prefill_replicas < 1 or self.decode_replicas < 1:
            raise ValueError("each pool needs at least one replica")


@dataclass(frozen=True, slots=True, kw_only=True)
class DisaggPoint:
    """Both pools at steady state."""

    batch: float
    """Sequences per decode replica."""
    limit: BatchLimit
    cap: int
    step: Forward
    """One decode forward (per GPU) at that batch."""
    tpot_s: float
    prefill_s: float
    kv_transfer_s: float
    ttft_s_p50: float | None
    ttft_s_p99: float | None
    queue_s_p50: float
    queue_s_p99: float
    requests_per_s: float
    prefill_requests_per_s_max: float
    decode_requests_per_s_max: float
    output_tokens_per_s: float
    """All decode replicas together."""
    saturated: bool

    @property
    def bottleneck(self) -> str:
        return "prefill" if self.prefill_requests_per_s_max <= self.decode_requests_per_s_max else "decode"


def kv_transfer_s(shape: ReplicaShape, hw: Hardware, *, tokens: int) -> float:
    """One request's KV cache from a prefill GPU to its decode peer over the NIC (each GPU sends its share)."""
    link = hw.scale_out
    return link.latency_s + tokens * shape.kv_bytes_per_token / link.effective_bytes_per_s


def _prefill_rate(model: ModelSpec, shape: ReplicaShape, hw: Hardware, layout: ServeLayout, req: Requests) -> float:
    """Requests/s one prefill replica sustains: chunks of the engine's tokens per step, back to back."""
    chunk = float(hw.cal.max_num_tokens)
    sequences = chunk / req.input_len
    t = pipeline_factor(hw, layout) * float(
        prefill(model, shape, hw, layout, tokens=chunk, sequences=sequences).total_s
    )
    if layout.pp > 1:
        t /= layout.pp  # pp chunks in flight
    return sequences / t


@dataclass(frozen=True, slots=True, kw_only=True)
class _Settled:
    """Where the decode pool settles under the load: its batch, what limits it, the rate, the prefill wait."""

    batch: float
    limit: BatchLimit
    rate: float
    wait_s_p50: float
    wait_s_p99: float


def disaggregated_point(
    model: ModelSpec, shape: ReplicaShape, hw: Hardware, layout: ServeLayout, req: Requests, pools: Pools
) -> DisaggPoint:
    """Latency and throughput of the two pools under ``req`` (concurrency or rate for the whole fleet)."""
    cap = capacity(model, shape, hw, layout, req, prefill_in_step=False)
    if cap.sequences < 1:
        raise ValueError(f"no sequence of {req.input_len}+{req.output_len} tokens fits in the KV cache")
    rounds = pipeline_factor(hw, layout)
    ranks = layout.pp * (layout.tp if layout.dp_attention else 1)
    context = req.input_len + req.output_len / 2

    def step(b: float) -> Forward:
        return decode_step(model, shape, hw, layout, batch=b / ranks, context=context)

    def tpot(b: float) -> float:
        return rounds * float(step(b).total_s)

    alone = rounds * float(prefill(model, shape, hw, layout, tokens=float(req.input_len)).total_s)
    handover = kv_transfer_s(shape, hw, tokens=req.input_len)
    prefill_max = pools.prefill_replicas * _prefill_rate(model, shape, hw, layout, req)
    decode_max = pools.decode_replicas * cap.sequences / (req.output_len * tpot(cap.sequences))
    in_system = alone + handover  # before the first decode step
    if req.concurrency is not None:
        settled = _closed_loop(req, pools, cap, tpot, in_system=in_system, prefill_max=prefill_max)
    else:
        settled = _open_loop(req, pools, cap, tpot, prefill_max=prefill_max, decode_max=decode_max)
    t = tpot(settled.batch)
    saturated = math.isinf(settled.wait_s_p50)
    return DisaggPoint(
        batch=settled.batch,
        limit=settled.limit,
        cap=cap.sequences,
        step=step(settled.batch),
        tpot_s=t,
        prefill_s=alone,
        kv_transfer_s=handover,
        ttft_s_p50=None if saturated else in_system + t / 2 + settled.wait_s_p50,
        ttft_s_p99=None if saturated else in_system + t + settled.wait_s_p99,
        queue_s_p50=settled.wait_s_p50,
        queue_s_p99=settled.wait_s_p99,
        requests_per_s=settled.rate,
        prefill_requests_per_s_max=prefill_max,
        decode_requests_per_s_max=decode_max,
        output_tokens_per_s=pools.decode_replicas * settled.batch / t,
        saturated=saturated,
    )


def _closed_loop(
    req: Requests, pools: Pools, cap: Capacity, tpot: Callable[[float], float], *, in_system: float, prefill_max: float
) -> _Settled:
    """C users with no think time over the decode replicas; beyond the prefill pool's rate, fewer sequences
    decode (Little's law) and the rest wait."""
    assert req.concurrency is not None
    batch = min(req.concurrency / pools.decode_replicas, float(cap.sequences))
    limit = cap.limit if req.concurrency > pools.decode_replicas * cap.sequences else BatchLimit.LOAD
    rate = pools.decode_replicas * batch / (in_system + req.output_len * tpot(batch))
    if rate > prefill_max:  # the prefill pool holds the rest back
        rate, limit = prefill_max, BatchLimit.LOAD
        for _ in range(3):
            batch = rate * req.output_len * tpot(batch) / pools.decode_replicas
    wait = max(req.concurrency / rate - (in_system + req.output_len * tpot(batch)), 0.0)
    return _Settled(batch=batch, limit=limit, rate=rate, wait_s_p50=wait, wait_s_p99=wait)


def _open_loop(
    req: Requests, pools: Pools, cap: Capacity, tpot: Callable[[float], float], *, prefill_max: float, decode_max: float
) -> _Settled:
    """Poisson arrivals at R: past the slower pool's maximum the queue grows without bound; below it the
    batch is B = R per replica x O t(B) (monotone: a fixed point from below) and prefill waits M/D/c."""
    assert req.rate_per_s is not None
    rate = req.rate_per_s
    if rate >= min(prefill_max, decode_max):
        top = min(prefill_max, decode_max)
        return _Settled(batch=float(cap.sequences), limit=cap.limit, rate=top, wait_s_p50=math.inf, wait_s_p99=math.inf)
    batch = 1.0
    for _ in range(60):
        nxt = min(rate / pools.decode_replicas * req.output_len * tpot(batch), float(cap.sequences))
        if abs(nxt - batch) < 1e-3:
            break
        batch = nxt
    p50, p99 = _prefill_queue(rate, prefill_max, pools.prefill_replicas)
    return _Settled(batch=batch, limit=BatchLimit.LOAD, rate=rate, wait_s_p50=p50, wait_s_p99=p99)


def _prefill_queue(rate: float, rate_max: float, servers: int) -> tuple[float, float]:
    """Mean and p99 wait for a prefill replica: M/D/c (Erlang C halved, its exponential tail)."""
    service = servers / rate_max
    p_wait = erlang_c(servers, rate * service)
    spare = rate_max - rate
    p99 = 0.5 * math.log(p_wait / P99_TAIL) / spare if p_wait > P99_TAIL else 0.0
    return 0.5 * p_wait / spare, p99


@dataclass(frozen=True, slots=True, kw_only=True)
class SplitTerms:
    """What a split's curve shares with every other split of the layout: the decode step at each batch cap,
    prefill alone + the KV hand-over, one prefill replica's rate. ``curve`` takes the pools as ints or as
    arrays that broadcast against the batch caps (one row per split), with the same arithmetic either way."""

    batches: np.ndarray
    tpot_s: np.ndarray
    first_s: float
    prefill_rate: float
    """Requests/s one prefill replica sustains."""
    output_len: int
    gpus_per_replica: int

    def curve(
        self, prefill: int | np.ndarray, decode: int | np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(tokens/s per GPU, TPOT, TTFT p99, whether the prefill pool keeps up) with these replicas."""
        rate = decode * self.batches / (self.first_s + self.output_len * self.tpot_s)
        keeps_up = rate <= prefill * self.prefill_rate
        gpus = (prefill + decode) * self.gpus_per_replica
        return rate * self.output_len / gpus, self.tpot_s, self.first_s + self.tpot_s, keeps_up


def split_terms(
    model: ModelSpec, shape: ReplicaShape, hw: Hardware, layout: ServeLayout, req: Requests, *, batches: np.ndarray
) -> SplitTerms:
    """The parts of a split's curve that do not depend on how the replicas are split (``SplitTerms.curve``).

    The planner's closed loop: B users per decode replica; requests/s = (D/g) B / (TTFT + O t(B)); the
    prefill pool keeps up when that is within its maximum (no prefill queue), else the point is dropped."""
    rounds = pipeline_factor(hw, layout)
    ranks = layout.pp * (layout.tp if layout.dp_attention else 1)
    context = req.input_len + req.output_len / 2
    t = rounds * np.asarray(decode_step(model, shape, hw, layout, batch=batches / ranks, context=context).total_s)
    first = rounds * float(prefill(model, shape, hw, layout, tokens=float(req.input_len)).total_s)
    first += kv_transfer_s(shape, hw, tokens=req.input_len)
    return SplitTerms(
        batches=batches,
        tpot_s=t,
        first_s=first,
        prefill_rate=_prefill_rate(model, shape, hw, layout, req),
        output_len=req.output_len,
        gpus_per_replica=layout.gpus_per_replica,
    )
