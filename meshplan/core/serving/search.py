"""The serving planner: every replica layout x dtype x batch cap, under latency targets.

A candidate is a replica layout (TP x PP, experts over the TP group, attention-DP for MoE), its weight and
KV dtypes, and a batch cap. For each layout the batch caps 1 .. capacity (every one to 64, then 2% apart)
are evaluated at once (numpy)
with the same step and TTFT formulas as ``meshplan serve``: a replica at batch B runs B users in a closed
loop, TPOT p99 from its steps with and without a prompt chunk (core/serving/tails.py), TTFT p99 = prefill
beside B - 1 decoding sequences + one whole step of waiting + the p99 wait for the step's token budget. The
largest batch meeting both targets is the layout's best throughput; every batch meeting them is a point of
the Pareto front of tokens/s per GPU against tokens/s per user. A layout with no such batch keeps the
reason: out of memory, or the TTFT / TPOT it reaches at batch 1 against the target.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from meshplan.core.serving.disagg import SplitTerms, split_terms
from meshplan.core.serving.load import P99_TAIL, Requests, capacity, prompt_queue, step_at, ttft_s
from meshplan.core.serving.phases import pipeline_factor
from meshplan.core.serving.shape import Hardware, ReplicaShape, ServeLayout
from meshplan.core.serving.splits import kept_splits
from meshplan.core.serving.tails import busy_share, own_share, tpot_tails
from meshplan.spec.model import ModelSpec


class Objective(StrEnum):
    """What the planner ranks by, among the plans that meet the targets."""

    THROUGHPUT = "throughput"
    """The most output tokens/s per GPU."""
    LATENCY = "latency"
    """The shortest time per output token (the most tokens/s per user)."""
    FEWEST_GPUS = "fewest-gpus"
    """The fewest GPUs that serve the given concurrency; ties by tokens/s per GPU."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Targets:
    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One layout at its best batch cap under the targets."""

    layout: ServeLayout
    batch_cap: int
    """Sequences per replica."""
    kv_sequences: int
    ttft_p99_s: float
    tpot_s: float
    tpot_p99_s: float
    tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float
    gpus: int
    """GPUs this plan uses: replicas x gpus per replica."""
    replicas: int
    prefill_replicas: int = 0
    """Replicas that only prefill, the rest only decode (0: every replica does both)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    layout: ServeLayout
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ParetoPoint:
    layout: ServeLayout
    batch_cap: int
    tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float
    prefill_replicas: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchResult:
    ranked: list[Candidate]
    pareto: list[ParetoPoint]
    rejected: list[Rejection]
    evaluated_layouts: int
    evaluated_points: int


ShapeOf = Callable[[ServeLayout], ReplicaShape]
DENSE_BATCHES = 64
"""Batch caps up to this are all tried; beyond, a geometric grid ..."""
GRID_RATIO = 1.02
"""... 2% apart (throughput changes smoothly there), and the capacity itself."""


def batch_grid(cap: int) -> np.ndarray:
    """Batch caps 1 .. cap: every one up to DENSE_BATCHES, then 2% apart, and cap."""
    dense = np.arange(1, min(cap, DENSE_BATCHES) + 1, dtype=np.float64)
    if cap <= DENSE_BATCHES:
        return dense
    steps = int(np.ceil(np.log(cap / DENSE_BATCHES) / np.log(GRID_RATIO)))
    sparse = np.unique(np.floor(DENSE_BATCHES * GRID_RATIO ** np.arange(1, steps + 1)))
    return np.concatenate([dense, sparse[sparse < cap], [float(cap)]])


def _curve(
    model: ModelSpec, shape: ReplicaShape, hw: Hardware, layout: ServeLayout, req: Requests
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, np.ndarray]:
    """(batches, TPOT mean, TPOT p99, TTFT p99) for every batch cap 1 .. the replica's capacity, that capacity and
    the output tokens/s per replica (a closed loop of as many users as the cap: core/serving/tails.py; a request's
    TPOT carries the other users' prompts, the engine's throughput all of them)."""
    cap = capacity(model, shape, hw, layout, req)
    batches = batch_grid(max(cap.sequences, 0))
    if batches.size == 0:
        return batches, batches, batches, batches, cap.kv_sequences, batches
    step = step_at(model, shape, hw, layout, req, batch=batches)
    rounds = pipeline_factor(hw, layout)
    step_s = rounds * np.asarray(step.total_s)
    spec = req.speculation
    tails = tpot_tails(
        plain_s=rounds * np.asarray(step.plain.total_s),
        carrying_s=rounds * np.asarray(step.carrying.total_s),
        share=own_share(step.share, batches, closed=True),
        output_len=req.output_len,
        tokens_per_step=req.tokens_per_step,
        tokens_variance=0.0 if spec is None else spec.tokens_per_step_variance,
    )
    wait = prompt_queue(hw, layout, req, step, batch=batches, users=batches).wait_s_p99  # prompts ahead of it
    boundary = np.where(np.asarray(busy_share(batches, closed=True)) > P99_TAIL, step_s, 0.0)  # p99: a whole step
    ttft = np.asarray(ttft_s(model, shape, hw, layout, req, batch=batches - 1)) + boundary + np.asarray(wait)
    rate = batches * req.tokens_per_step / step_s
    return batches, np.asarray(tails.mean_s), np.asarray(tails.p99_s), ttft, cap.kv_sequences, rate


def _reason(tpot: np.ndarray, ttft: np.ndarray, targets: Targets) -> str:
    parts = []
    if targets.ttft_p99_s is not None and ttft[0] > targets.ttft_p99_s:
        parts.append(f"TTFT p99 {ttft[0]:.3g} s > {targets.ttft_p99_s:.3g} s at batch 1")
    if targets.tpot_p99_s is not None and tpot[0] > targets.tpot_p99_s:
        parts.append(f"TPOT p99 {tpot[0]:.3g} s > {targets.tpot_p99_s:.3g} s at batch 1")
    return "; ".join(parts) or "no batch meets both targets together"


def search(
    model: ModelSpec,
    hw: Hardware,
    layouts: Iterator[ServeLayout],
    shape_of: ShapeOf,
    req: Requests,
    *,
    gpus: int,
    targets: Targets,
    objective: Objective,
    concurrency: float | None = None,
    disaggregate: bool = False,
    keep_splits: int = 5,
    splits: Collection[int] | None = None,
) -> SearchResult:
    """Every layout evaluated at every batch cap; the best batch of each ranked by ``objective``. With
    ``disaggregate``, each layout's prefill/decode splits too: its ``keep_splits`` best (``_splits``), or only the
    prefill replica counts in ``splits`` (how a saved plan's own split is evaluated again)."""
    ranked, pareto, rejected = [], [], []
    layouts_seen = points = 0
    for layout in layouts:
        layouts_seen += 1
        try:
            shape = shape_of(layout)
        except ValueError as exc:
            rejected.append(Rejection(layout=layout, reason=str(exc)))
            continue
        batches, tpot, tpot99, ttft, kv, rate = _curve(model, shape, hw, layout, req)
        points += batches.size
        if batches.size == 0:
            rejected.append(Rejection(layout=layout, reason="out of memory: no sequence fits beside the weights"))
            continue
        g, replicas = layout.gpus_per_replica, gpus // layout.gpus_per_replica
        per_gpu = rate / g
        found = _best(layout, batches, per_gpu, tpot, ttft, kv, targets, objective, replicas=replicas, tpot99=tpot99)
        if found is None:
            rejected.append(Rejection(layout=layout, reason=_reason(tpot99, ttft, targets)))
        elif objective is Objective.FEWEST_GPUS:
            assert concurrency is not None
            needed = int(np.ceil(concurrency / found[0].batch_cap)) * g
            found = _fewest(found, concurrency=concurrency, gpus=gpus)
            if found is None:
                rejected.append(Rejection(layout=layout, reason=f"needs {needed} GPUs > {gpus}"))
        if found is not None:
            ranked.append(found[0])
            pareto += found[1]
        if disaggregate and objective is not Objective.FEWEST_GPUS:
            terms = split_terms(model, shape, hw, layout, req, batches=batches)
            split_ranked, split_pareto, split_points = _splits(
                layout, terms, kv, targets, objective, replicas=replicas, keep=keep_splits, only=splits
            )
            ranked += split_ranked
            pareto += split_pareto
            points += split_points
    return SearchResult(
        ranked=sorted(ranked, key=_key(objective)),
        pareto=pareto_front(pareto),
        rejected=rejected,
        evaluated_layouts=layouts_seen,
        evaluated_points=points,
    )


EVERY_SPLIT_UP_TO = 16
"""A layout with at most this many splits (replicas - 1) has every one ranked; beyond, only those that can be
among its ``keep_splits`` best (core/serving/splits.py): the same best plans and Pareto front, bounded work."""


def _splits(
    layout: ServeLayout,
    terms: SplitTerms,
    kv: int,
    targets: Targets,
    objective: Objective,
    *,
    replicas: int,
    keep: int,
    only: Collection[int] | None = None,
) -> tuple[list[Candidate], list[ParetoPoint], int]:
    """The ranked splits of ``replicas`` into prefill and decode pools, their Pareto points, the points computed
    (``only``: just these prefill replica counts, each evaluated whole)."""
    ranked, pareto, points = [], [], 0
    batches = terms.batches
    every = only is not None or replicas - 1 <= EVERY_SPLIT_UP_TO
    if only is not None:
        choices: Iterable[int] = sorted(p for p in set(only) if 0 < p < replicas)
    elif every:
        choices = range(1, replicas)
    else:
        usable = np.ones(batches.size, dtype=bool)
        if targets.ttft_p99_s is not None:
            usable &= terms.first_s + terms.tpot_s <= targets.ttft_p99_s
        if targets.tpot_p99_s is not None:
            usable &= terms.tpot_s <= targets.tpot_p99_s
        kept = kept_splits(terms, usable, replicas=replicas, keep=keep, first_usable=objective is Objective.LATENCY)
        choices, points = kept.prefill_replicas, kept.evaluated_points
        pareto = [
            ParetoPoint(layout=layout, batch_cap=int(batches[f.batch_index]),
                        tokens_per_s_per_gpu=f.tokens_per_s_per_gpu,
                        tokens_per_s_per_user=f.tokens_per_s_per_user,
                        prefill_replicas=f.prefill_replicas)
            for f in kept.front
        ]  # fmt: skip
    for p in choices:
        gpu_rate, t, first, keeps_up = terms.curve(p, replicas - p)
        points += batches.size
        split = _best(layout, batches, gpu_rate, t, first, kv, targets, objective, replicas=replicas,
                      prefill_replicas=p, valid=keeps_up, with_points=every)  # fmt: skip
        if split is not None:
            ranked.append(split[0])
            pareto += split[1]
    return ranked, pareto, points


def _best(
    layout: ServeLayout,
    batches: np.ndarray,
    per_gpu: np.ndarray,
    tpot: np.ndarray,
    ttft: np.ndarray,
    kv: int,
    targets: Targets,
    objective: Objective,
    *,
    replicas: int,
    prefill_replicas: int = 0,
    valid: np.ndarray | None = None,
    with_points: bool = True,
    tpot99: np.ndarray | None = None,
) -> tuple[Candidate, list[ParetoPoint]] | None:
    """The batch cap ``objective`` prefers among those meeting the targets (TPOT's p99, ``tpot99``, where it is
    known, else its mean), and (``with_points``) the points that meet them."""
    ok = np.ones(batches.size, dtype=bool) if valid is None else valid.copy()
    if targets.ttft_p99_s is not None:
        ok &= ttft <= targets.ttft_p99_s
    if targets.tpot_p99_s is not None:
        ok &= (tpot if tpot99 is None else tpot99) <= targets.tpot_p99_s
    if not ok.any():
        return None
    idx = np.flatnonzero(ok)
    i = int(idx[0]) if objective is Objective.LATENCY else int(idx[np.argmax(per_gpu[ok])])
    points = [
        ParetoPoint(layout=layout, batch_cap=int(b), tokens_per_s_per_gpu=float(x),
                    tokens_per_s_per_user=float(1.0 / t), prefill_replicas=prefill_replicas)
        for b, x, t in zip(batches[ok], per_gpu[ok], tpot[ok], strict=True)
    ] if with_points else []  # fmt: skip
    best = Candidate(
        layout=layout,
        batch_cap=int(batches[i]),
        kv_sequences=kv,
        ttft_p99_s=float(ttft[i]),
        tpot_s=float(tpot[i]),
        tpot_p99_s=float(tpot[i] if tpot99 is None else tpot99[i]),
        tokens_per_s_per_gpu=float(per_gpu[i]),
        tokens_per_s_per_user=float(1.0 / tpot[i]),
        gpus=replicas * layout.gpus_per_replica,
        replicas=replicas,
        prefill_replicas=prefill_replicas,
    )
    return best, points


def _fewest(
    found: tuple[Candidate, list[ParetoPoint]], *, concurrency: float, gpus: int
) -> tuple[Candidate, list[ParetoPoint]] | None:
    """The same plan with just the replicas that serve ``concurrency`` users (None beyond the fleet)."""
    best, points = found
    replicas = int(np.ceil(concurrency / best.batch_cap))
    if replicas * best.layout.gpus_per_replica > gpus:
        return None
    return dataclasses.replace(best, replicas=replicas, gpus=replicas * best.layout.gpus_per_replica), points


def _key(objective: Objective) -> Callable[[Candidate], tuple[float, ...]]:
    if objective is Objective.THROUGHPUT:
        return lambda c: (-c.tokens_per_s_per_gpu,)
    if objective is Objective.LATENCY:
        return lambda c: (c.tpot_s, -c.tokens_per_s_per_gpu)
    return lambda c: (c.gpus, -c.tokens_per_s_per_gpu)


def pareto_front(points: list[ParetoPoint]) -> list[ParetoPoint]:
    """The points no other beats on both tokens/s per GPU and tokens/s per user, fastest per user first."""
    front: list[ParetoPoint] = []
    best_gpu = -1.0
    for p in sorted(points, key=lambda p: (-p.tokens_per_s_per_user, -p.tokens_per_s_per_gpu)):
        if p.tokens_per_s_per_gpu > best_gpu:
            front.append(p)
            best_gpu = p.tokens_per_s_per_gpu
    return front
