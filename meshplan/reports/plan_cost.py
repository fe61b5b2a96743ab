"""``plan``'s days, dollars and goodput: each plan's GPU-hours, cost and goodput, the fleet's checkpoint, and the
``cost`` objective's choice of fleet.

On one fleet every layout uses every GPU, so GPU-hours to train a token budget, tokens / (tokens/s per GPU) /
3600, order the layouts as their step times do (only a checkpoint interval of whole steps moves the goodput a
little from layout to layout). What the cost objective adds is the fleet: it searches the fleet given and every
halving of it, and keeps the one whose best layout trains the tokens for the fewest GPU-hours (with failures
paid when an MTBF is given), among those that finish within ``--days`` when a deadline is given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from meshplan.reports.cost import CostRequest, checkpoint_dict, layout_costs
from meshplan.spec.cluster import Cluster
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload
from meshplan.units import SECONDS_PER_DAY, SECONDS_PER_HOUR

Best = Callable[[int], Mapping[str, Any] | None]
"""The best plan on a fleet of n GPUs (its ``step_time_s`` and ``tokens_per_s_per_gpu``), or None: nothing fits."""
Checkpoint = Callable[[int], Mapping[str, Any] | None]
"""The ``checkpoint`` key on a fleet of n GPUs (None without a bandwidth)."""


def training_hours(
    plan: Mapping[str, Any], *, gpus: int, tokens: float, checkpoint: Mapping[str, Any] | None, req: CostRequest
) -> dict[str, Any]:
    """Wall days and GPU-hours to train ``tokens`` with one plan: with failures paid when an MTBF is given (None
    where the job never finishes), the goodput and the cost where asked for."""
    costs = layout_costs(
        step_time_s=plan["step_time_s"],
        tokens_per_s_per_gpu=plan["tokens_per_s_per_gpu"],
        gpus=gpus,
        checkpoint=checkpoint,
        tokens=tokens,
        req=req,
    )
    if "goodput" in costs:
        g = costs["goodput"]
        out = {"wall_time_days": g["wall_time_days"], "gpu_hours_total": g["gpu_hours_total"]}
        out |= {"goodput_fraction": g["goodput_fraction"]} | (
            {"cost_total": g["cost_total"]} if "cost" in costs else {}
        )
        return out
    seconds = tokens / (plan["tokens_per_s_per_gpu"] * gpus)
    out = {"wall_time_days": seconds / SECONDS_PER_DAY, "gpu_hours_total": seconds * gpus / SECONDS_PER_HOUR}
    return out | ({"cost_total": costs["cost"]["cost_total"]} if "cost" in costs else {})


MAX_HALVINGS = 24
"""Fleets the cost objective searches at most: the one given and 23 halvings (10,000,000 GPUs down to 1)."""


def cheapest_fleet(
    best: Best,
    checkpoint: Checkpoint,
    *,
    start: int,
    tokens: float | None,
    days: float | None,
    req: CostRequest,
) -> tuple[int, dict[str, Any]]:
    """The fleet, of ``start`` GPUs or a halving of it, whose best plan trains ``tokens`` for the fewest GPU-hours
    within ``days`` (when given), and every fleet searched, largest first; halving stops at an odd fleet, or where
    nothing fits (fewer GPUs hold more each). ``start`` itself when nothing fits on it."""
    if not tokens:
        raise ValueError("the cost objective ranks plans by GPU-hours to train --tokens: give --tokens")
    rows: list[dict[str, Any]] = []
    n = start
    for _ in range(MAX_HALVINGS):
        plan = best(n)
        row: dict[str, Any] = {"gpus": n, "fits": plan is not None}
        if plan is not None:
            row |= {"step_time_s": plan["step_time_s"], "tokens_per_s_per_gpu": plan["tokens_per_s_per_gpu"]}
            row |= training_hours(plan, gpus=n, tokens=tokens, checkpoint=checkpoint(n), req=req)
            row["meets_deadline"] = None if days is None else _within(row["wall_time_days"], days)
        rows.append(row)
        if plan is None or n % 2:
            break
        n //= 2
    fleet: dict[str, Any] = {"gpus": start, "searched_from": start, "tokens": tokens, "days": days, "fleets": rows}
    kept = [r for r in rows if r["fits"] and r["gpu_hours_total"] is not None and r["meets_deadline"] is not False]
    if kept:
        fleet["gpus"] = min(kept, key=lambda r: (r["gpu_hours_total"], r["wall_time_days"]))["gpus"]
    elif rows[0]["fits"]:
        raise ValueError(_none_in_time(rows[0], tokens=tokens, days=days))
    return int(fleet["gpus"]), fleet


def _within(wall_days: float | None, days: float) -> bool:
    return wall_days is not None and wall_days <= days


def _none_in_time(largest: Mapping[str, Any], *, tokens: float, days: float | None) -> str:
    took = "never finishes" if largest["wall_time_days"] is None else f"takes {largest['wall_time_days']:.1f} days"
    what = f"within {days:g} days" if days is not None else "at this failure rate"
    return (
        f"no fleet of {largest['gpus']:,} GPUs or a halving of it trains {tokens:.3g} tokens {what}: the largest "
        f"{took}; raise --gpus"
    )


def plan_costs(
    out: dict[str, Any],
    plans: list[dict[str, Any]],
    *,
    spec: ModelSpec,
    cluster: Cluster,
    work: Workload,
    tokens: float | None,
    req: CostRequest | None,
    cheapest: dict[str, Any] | None = None,
) -> None:
    """Add ``plan``'s cost keys in place: the fleet's ``checkpoint`` and ``cheapest_fleet`` (the cost objective's
    search) to ``out``; each plan's ``gpu_hours_total`` (with ``tokens``), ``cost`` and ``goodput``; under the cost
    objective the plans ordered by the GPU-hours they train the tokens in (with failures paid where an MTBF is
    given; a stable sort, so step time breaks ties)."""
    if cheapest is not None:
        out["cheapest_fleet"] = cheapest
    gpus = cluster.num_gpus
    for p in plans if tokens else ():
        p["gpu_hours_total"] = tokens / (p["tokens_per_s_per_gpu"] * gpus) * gpus / SECONDS_PER_HOUR
    if req is None or not req.asked:
        return
    checkpoint = checkpoint_dict(spec, work, cluster, req)
    if checkpoint is not None:
        out["checkpoint"] = checkpoint
    for p in plans:
        p |= layout_costs(
            step_time_s=p["step_time_s"],
            tokens_per_s_per_gpu=p["tokens_per_s_per_gpu"],
            gpus=gpus,
            checkpoint=checkpoint,
            tokens=tokens,
            req=req,
        )
    if cheapest is not None and req.mtbf_gpu_hours is not None:
        plans.sort(key=_hours_with_failures)


def _hours_with_failures(plan: Mapping[str, Any]) -> float:
    hours = plan["goodput"]["gpu_hours_total"]
    return float("inf") if hours is None else float(hours)
