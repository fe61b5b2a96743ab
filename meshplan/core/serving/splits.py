"""The prefill/decode splits of one replica layout worth ranking, found without trying every split.

R replicas of a layout split into p prefill and R - p decode replicas (``serve_disagg.SplitTerms``). At a decode
batch cap b the TPOT and the TTFT do not depend on p; the request rate the decode pool drives, (R - p) b /
(TTFT + O t(b)), falls as p grows and the prefill pool's limit, p r_prefill, rises. So a batch cap is usable
from one smallest split p*(b) on (found by bisection on the very comparison the curve makes, which is monotone
in p in floating point too: (R - p) b is an exact integer for any fleet the CLI takes), and from there on its
tokens/s per GPU only falls.

Sort the thresholds p*(b): between two consecutive ones the usable batch caps stay the same, so every split of
that run is matched or beaten, on tokens/s per GPU and on TPOT alike, by each smaller split of the run (which
the planner lists first): each run is already in ranking order, and a layout's ``keep`` best splits are the
first ``keep`` of a merge of the runs. That takes one row of batch caps per run (at most one per batch cap) and
one more per split taken, each the exact arithmetic of the full curve, whatever the size of the fleet.
On the Pareto front of tokens/s per GPU against tokens/s per user, (p*(b), b) matches or beats every other
split at b (same tokens/s per user, no more per GPU), so those points alone give the same front.
"""

from __future__ import annotations

import collections
import heapq
from dataclasses import dataclass

import numpy as np

from meshplan.core.serving.disagg import SplitTerms

CHUNK_POINTS = 1 << 18
"""(split, batch cap) points evaluated at once: the rows of a chunk hold a few MB whatever the fleet."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FrontPoint:
    """The smallest split at which one batch cap is usable: the split's one candidate for the Pareto front."""

    prefill_replicas: int
    batch_index: int
    tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Splits:
    prefill_replicas: list[int]
    """The layout's ``keep`` best splits (prefill replicas), ascending."""
    front: list[FrontPoint]
    """The (p*(b), b) on the front among themselves (b usable and served by some split), by split then batch cap."""
    evaluated_points: int
    """(split, batch cap) points computed to find them."""


def smallest_splits(terms: SplitTerms, usable: np.ndarray, *, replicas: int) -> tuple[np.ndarray, int]:
    """For each batch cap: the fewest prefill replicas (1 .. replicas - 1) whose pool keeps up with the decode
    pool, 0 where the cap is not ``usable`` or no split keeps up; and the points computed (a bisection each)."""
    n = terms.batches.size
    lo = np.ones(n, dtype=np.int64)
    hi = np.full(n, replicas - 1, dtype=np.int64)
    served = usable & terms.curve(hi, replicas - hi)[3]
    points = n
    while (open_ := served & (lo < hi)).any():
        mid = (lo + hi) // 2
        keeps_up = terms.curve(mid, replicas - mid)[3]
        points += n
        hi = np.where(open_ & keeps_up, mid, hi)
        lo = np.where(open_ & ~keeps_up, mid + 1, lo)
    return np.where(served, lo, 0), points


def candidates(
    terms: SplitTerms, usable: np.ndarray, prefill: np.ndarray, *, replicas: int, first_usable: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens/s per GPU, TPOT) of each split's candidate, as the planner picks it: among the usable batch caps
    its pool keeps up at, the one with the most tokens/s per GPU (the first of equals), or with ``first_usable``
    the smallest. Every split must keep up at one usable cap at least. Computed ``CHUNK_POINTS`` at a time."""
    gpu, tpot = np.empty(prefill.size), np.empty(prefill.size)
    rows = max(1, CHUNK_POINTS // max(terms.batches.size, 1))
    for lo in range(0, prefill.size, rows):
        p = prefill[lo : lo + rows, None]
        per_gpu, t, _, keeps_up = terms.curve(p, replicas - p)
        ok = keeps_up & usable[None, :]
        at = np.argmax(ok if first_usable else np.where(ok, per_gpu, -np.inf), axis=1)
        gpu[lo : lo + rows] = per_gpu[np.arange(p.shape[0]), at]
        tpot[lo : lo + rows] = t[at]
    return gpu, tpot


def _merged(
    terms: SplitTerms, usable: np.ndarray, smallest: np.ndarray, *, replicas: int, keep: int, first_usable: bool
) -> tuple[list[int], int]:
    """The first ``keep`` splits of the runs merged in ranking order, and the points computed: one row per run,
    then rows ahead in the runs taken from, 1, 2, 4, ... at a time (a run taken from often costs few calls)."""
    n = terms.batches.size
    starts = np.unique(smallest[smallest > 0])
    ends = np.append(starts[1:], replicas)

    def keys(prefill: np.ndarray) -> list[tuple[float, ...]]:
        gpu, tpot = candidates(terms, usable, prefill, replicas=replicas, first_usable=first_usable)
        return [
            (float(t), -float(g), int(p)) if first_usable else (-float(g), int(p))
            for p, g, t in zip(prefill, gpu, tpot, strict=True)
        ]

    heap = [(k, run) for run, k in enumerate(keys(starts))]
    heapq.heapify(heap)
    points = starts.size * n
    ahead: dict[int, collections.deque[tuple[float, ...]]] = {}
    block: dict[int, int] = {}
    chosen: list[int] = []
    while heap and len(chosen) < keep:
        key, run = heapq.heappop(heap)
        chosen.append(int(key[-1]))
        queue = ahead.setdefault(run, collections.deque())
        if not queue:
            nxt = int(key[-1]) + 1
            block[run] = size = min(2 * block.get(run, 0) or 1, int(ends[run]) - nxt, keep - len(chosen))
            if size > 0:
                queue.extend(keys(np.arange(nxt, nxt + size, dtype=np.int64)))
                points += size * n
        if queue:
            heapq.heappush(heap, (queue.popleft(), run))
    return sorted(chosen), points


def _front(terms: SplitTerms, smallest: np.ndarray, *, replicas: int) -> list[FrontPoint]:
    """The points (p*(b), b) on the front among themselves, in the planner's order (split, then batch cap): a point
    off it is matched or beaten by an earlier one here, and so off the whole front too."""
    served = np.flatnonzero(smallest)
    order = served[np.lexsort((served, smallest[served]))]
    gpu = terms.curve(smallest, replicas - smallest)[0][order]
    user = 1.0 / terms.tpot_s[order]
    ranked = np.lexsort((np.arange(order.size), -gpu, -user))
    best_before = np.concatenate([[-np.inf], np.maximum.accumulate(gpu[ranked])[:-1]])
    on = np.sort(ranked[gpu[ranked] > best_before])
    return [
        FrontPoint(prefill_replicas=int(smallest[order[j]]), batch_index=int(order[j]),
                   tokens_per_s_per_gpu=float(gpu[j]), tokens_per_s_per_user=float(user[j]))
        for j in on
    ]  # fmt: skip


def kept_splits(terms: SplitTerms, usable: np.ndarray, *, replicas: int, keep: int, first_usable: bool) -> Splits:
    """The ``keep`` splits of ``replicas`` (1 .. replicas - 1 prefill replicas) that rank first in the layout,
    and the layout's split points of the Pareto front.

    ``usable``: the batch caps that meet the targets (the same at every split). A split ranks by its candidate's
    tokens/s per GPU, or with ``first_usable`` by its TPOT and then tokens/s per GPU, ties to the smaller split,
    as in a search that tries every split in order."""
    if replicas < 2 or keep < 1:
        return Splits(prefill_replicas=[], front=[], evaluated_points=0)
    smallest, found = smallest_splits(terms, usable, replicas=replicas)
    chosen, merged = _merged(terms, usable, smallest, replicas=replicas, keep=keep, first_usable=first_usable)
    front = _front(terms, smallest, replicas=replicas)
    return Splits(prefill_replicas=chosen, front=front, evaluated_points=found + merged + terms.batches.size)
