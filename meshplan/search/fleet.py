"""Fleet sizes: which GPU counts admit a layout of a model, and the fewest of them that pass a test.

The planner's "fewest GPUs" answers (nothing fits; the fewest-gpus objective; ``meshplan fit``) all come from
``fewest``: it doubles the fleet from where it starts until a size passes, then tries every size of the grid
between the last size that failed and the first that passed, in increasing order, each with a full search.
The grid (``fleet_sizes``) is whole scale-up domains (nodes), their count 2^a 3^b 5^c (at most 12.5% apart:
2,048, 2,304, 2,560, 2,880, 3,072, ... GPUs of 8-GPU nodes), and any such count below one node, where the
model's rules admit a mesh. Every size it names was searched and a layout passed; the sizes it tried are kept,
to be shown.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from meshplan.search.space import divisors
from meshplan.spec.model import ModelSpec

MAX_PROBES = 24
"""Searches one ``fewest`` question may run at most (doublings and the bracket together)."""


def fleet_sizes(
    model: ModelSpec,
    *,
    seq: int,
    global_batch: int | None,
    low: int,
    high: int,
    domain: int,
    max_tp: int,
    max_cp: int = 64,
    pins: Mapping[str, int] | None = None,
) -> list[int]:
    """The fleet sizes ``fewest`` tries, in [low, high]: on the grid (whole scale-up domains past one, their
    count 2^a 3^b 5^c; any such count up to one domain), and splitting into tp x cp x pp x dp as the search's
    rules allow: TP dividing the KV heads (at most ``max_tp``), CP splitting the sequence into 2 cp chunks (at
    most ``max_cp``), no more stages than layers, and data parallelism dividing the global batch (any, where
    ``global_batch`` is None). Pinned degrees take only their value. Other rules (the FFN, the experts) are
    left to the search of each size."""
    pins = pins or {}
    grid = [n for n in _smooth_upto(min(high, domain)) if n >= low]
    grid += [domain * k for k in _smooth_upto(high // domain) if k > 1 and domain * k >= low]
    tps = [t for t in divisors(model.num_kv_heads) if t <= max_tp]
    cps = [c for c in range(1, max_cp + 1) if c == 1 or seq % (2 * c) == 0]
    pps = list(range(1, model.num_layers + 1))
    for name, values in (("tp", tps), ("cp", cps), ("pp", pps)):
        if name in pins:
            values[:] = [v for v in values if v == pins[name]]
    mesh = {t * c * p for t in tps for c in cps for p in pps if t * c * p <= high}

    def data_ok(dp: int) -> bool:
        if "dp" in pins:
            return dp == pins["dp"]
        return global_batch is None or global_batch % dp == 0

    return sorted(n for n in grid if any(d in mesh and data_ok(n // d) for d in divisors(n)))


def _smooth_upto(limit: int) -> list[int]:
    """The numbers 2^a 3^b 5^c up to ``limit``."""
    out, p2 = [], 1
    while p2 <= limit:
        p3 = p2
        while p3 <= limit:
            p5 = p3
            while p5 <= limit:
                out.append(p5)
                p5 *= 5
            p3 *= 3
        p2 *= 2
    return sorted(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    """One fleet size tried: whether it passed, and a figure the test keeps with it (the days to train of its best
    plan; for a fit, the smallest tp x cp x pp x dp_shard among the layouts that fit)."""

    gpus: int
    passed: bool
    value: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Fewest:
    """The answer of ``fewest``: the smallest size found to pass (None: none up to the limit did), every size
    tried in the order tried, and how many sizes the bracket held."""

    gpus: int | None
    tried: tuple[Probe, ...]
    sizes_in_bracket: int = 0
    """Sizes on the grid strictly between the last doubling that failed and the first that passed."""
    untried_below: int = 0
    """Of those, the ones left untried when MAX_PROBES ran out (0: every size below the answer was tried)."""


def fewest(sizes: list[int], test: Callable[[int], Probe], *, start: int, include_start: bool) -> Fewest:
    """The smallest of ``sizes`` (sorted) from ``start`` that passes ``test``.

    Doubling from ``start`` (the first size at or above each double) finds a bracket (the last size that
    failed, the first that passed); every size inside it is then tried in increasing order, so the answer is
    the smallest that passes whatever the test does between sizes (a throughput may fall where a pipeline must
    absorb an odd factor). Sizes below the last doubling that failed are not tried. At most MAX_PROBES
    searches: past them, the smallest size that passed is returned and ``untried_below`` says how many of the
    bracket's sizes were left."""
    tried: list[Probe] = []

    def at_least(n: int) -> int | None:
        i = bisect.bisect_left(sizes, n)
        return sizes[i] if i < len(sizes) else None

    lo, hi = (start - 1 if include_start else start), None
    target = start if include_start else start * 2
    while hi is None and len(tried) < MAX_PROBES:
        n = at_least(max(target, lo + 1))
        if n is None:
            break
        tried.append(test(n))
        if tried[-1].passed:
            hi = n
        else:
            lo, target = n, n * 2
    if hi is None:
        return Fewest(gpus=None, tried=tuple(tried))
    inside = sizes[bisect.bisect_right(sizes, lo) : bisect.bisect_left(sizes, hi)]
    for i, n in enumerate(inside):
        if len(tried) >= MAX_PROBES:
            return Fewest(gpus=hi, tried=tuple(tried), sizes_in_bracket=len(inside), untried_below=len(inside) - i)
        tried.append(test(n))
        if tried[-1].passed:
            hi = n
            break
    return Fewest(gpus=hi, tried=tuple(tried), sizes_in_bracket=len(inside))
