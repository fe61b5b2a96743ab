"""The order of a search's plans: the objective, the ranking, and the Pareto front of step time and memory."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt


class Objective(StrEnum):
    """What the planner ranks by."""

    STEP_TIME = "step-time"
    """Fastest optimizer step on the given fleet (highest throughput), memory headroom breaking ties."""
    TOKENS_PER_GPU = "tokens-per-gpu"
    """Most tokens per second per GPU (equal to step time on a fixed fleet)."""
    HEADROOM = "headroom"
    """Most free memory per GPU among layouts within 5% of the fastest."""
    COST = "cost"
    """Fewest GPU-hours per token trained, GPUs x step time / tokens per step: on one fleet every layout uses
    every GPU, so this is the step-time order; the plan report searches halvings of the fleet too and keeps the
    fleet that trains a token budget cheapest (reports/plan_cost.py)."""


def _dense_rank(x: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """0 for the smallest value of ``x``, 1 for the next distinct one, and so on (equal values, equal ranks)."""
    order = np.argsort(x)
    ordered = x[order]
    rank = np.empty(len(x), dtype=np.int64)
    rank[order] = np.concatenate(([0], np.cumsum(ordered[1:] != ordered[:-1])))
    return rank


def lex_order(primary: npt.NDArray[Any], secondary: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """``np.lexsort((secondary, primary))``: by ``primary``, ties by ``secondary``, then by index; as one sort of
    an integer key of the two ranks and the index (lexsort's two float passes are 2-3x slower)."""
    n = len(primary)
    if n**3 >= 2**63:  # the key would overflow
        return np.lexsort((secondary, primary)).astype(np.int64)
    key = (_dense_rank(primary) * n + _dense_rank(secondary)) * n + np.arange(n, dtype=np.int64)
    return np.argsort(key).astype(np.int64)


def pareto_front(times: npt.NDArray[np.float64], memory: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Indices of the points no other point beats on both step time and memory, fastest first."""
    order = lex_order(times, memory)
    mem = memory[order]
    best_before = np.concatenate(([np.inf], np.minimum.accumulate(mem)[:-1]))
    return order[mem < best_before].astype(np.int64)


def rank(
    times: npt.NDArray[np.float64], memory: npt.NDArray[np.float64], objective: Objective
) -> npt.NDArray[np.int64]:
    """Candidate order: fastest first with less memory breaking ties, or most headroom near the fastest."""
    if objective is Objective.HEADROOM and len(times):
        near = times <= times.min() * 1.05
        return np.lexsort((times, memory, ~near))
    return lex_order(np.round(times, 9), memory)
