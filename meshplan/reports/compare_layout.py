"""Where a run's collectives or memory say it ran another layout than the plan: ``meshplan compare``'s flags.

Each rule reads what a layout's strategy does to the trace, per step (core/comm's collectives of the plan, the
trace's calls counted on the host side):
- ZeRO-3 and FSDP gather each unit's parameters before its forward and again before its backward, and
  reduce-scatter its gradients once: about two all-gathers per reduce-scatter. ZeRO-1 and ZeRO-2 (Megatron's
  distributed optimizer) reduce-scatter the gradients and gather the parameters once per step: about one per
  reduce-scatter. Plain data parallelism (DDP, ZeRO-0) all-reduces the gradients and gathers nothing.
- A collective the plan issues and the run never did, or the reverse (send/recv: pipeline stages; all-to-all:
  experts; broadcast: DDP's module buffers), and calls that differ from the plan's by more than ``COUNT_RATIO``.
- Parameters or optimizer state held per GPU that differ from the bill by more than ``MEMORY_RATIO`` (a snapshot
  with frames): a different sharding of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

COUNT_RATIO = 2.0
MEMORY_RATIO = 1.5
GATHERS_PER_SCATTER_ZERO3 = 1.5
"""All-gathers per reduce-scatter at or above which the run gathered per unit twice a step (ZeRO-3, FSDP)."""
WHAT_ISSUES = {
    "send_recv": "pipeline parallelism (or context parallelism's ring)",
    "all_to_all": "expert parallelism (or Ulysses context parallelism)",
    "broadcast": "DDP's module buffers, synchronised before each forward",
    "all_gather": "sharded parameters (ZeRO-1 and up) or sequence parallelism",
    "reduce_scatter": "sharded gradients (ZeRO-1 and up) or sequence parallelism",
    "all_reduce": "tensor parallelism or plain data parallelism",
}


def predicted_calls(collectives: list[Mapping[str, Any]]) -> dict[str, float]:
    """The plan's calls per step, by collective kind (groups of one rank issue nothing)."""
    out: dict[str, float] = {}
    for c in collectives:
        if int(c["group_size"]) > 1:
            out[c["op"]] = out.get(c["op"], 0.0) + float(c["count_per_step"])
    return out


def layout_flags(
    layout: Mapping[str, Any],
    predicted: Mapping[str, float],
    measured: Mapping[str, float] | None,
    memory: Mapping[str, tuple[float, float]] | None = None,
) -> list[str]:
    """Each sign that the run used another layout than ``layout`` (estimate's ``layout`` dict): from ``measured``
    calls per step (None: no trace) and ``memory``'s (measured, predicted) bytes of parameters and optimizer state."""
    flags: list[str] = []
    zero = int(layout["zero"])
    if measured is not None:
        flags += _zero_flags(zero, predicted, measured)
        flags += _kind_flags(predicted, measured)
    for term, (got, want) in (memory or {}).items():
        if got > 0 and want > 0 and max(got / want, want / got) > MEMORY_RATIO:
            flags.append(
                f"{term}: the run holds {got:,.0f} bytes per GPU where the plan holds {want:,.0f} "
                f"({got / want:.2f}x): they are sharded differently (ZeRO stage, data-parallel shards or TP/PP)"
            )
    return flags


def _zero_flags(zero: int, predicted: Mapping[str, float], measured: Mapping[str, float]) -> list[str]:
    gathers, scatters = measured.get("all_gather", 0.0), measured.get("reduce_scatter", 0.0)
    plan_gathers, plan_scatters = predicted.get("all_gather", 0.0), predicted.get("reduce_scatter", 0.0)
    per_unit = scatters > 0 and gathers >= GATHERS_PER_SCATTER_ZERO3 * scatters
    plan_per_unit = plan_scatters > 0 and plan_gathers >= GATHERS_PER_SCATTER_ZERO3 * plan_scatters
    out = []
    if plan_per_unit and scatters > 0 and not per_unit:
        out.append(
            f"the run all-gathered {gathers:g} times per {scatters:g} reduce-scatters, once per step as ZeRO-1/2 "
            f"does, where the plan (ZeRO-{zero}) gathers each unit before its forward and its backward "
            f"({plan_gathers:g} per {plan_scatters:g})"
        )
    if not plan_per_unit and per_unit:
        out.append(
            f"the run all-gathered {gathers:g} times per {scatters:g} reduce-scatters: parameters gathered per unit "
            f"in forward and backward, as ZeRO-3/FSDP does, where the plan says ZeRO-{zero}"
        )
    if plan_scatters > 0 and scatters == 0 and measured.get("all_reduce", 0.0) > 0:
        out.append(
            f"no reduce-scatter in the run: its gradients were all-reduced (plain data parallelism, ZeRO-0), where "
            f"the plan (ZeRO-{zero}) reduce-scatters them"
        )
    if plan_scatters == 0 and scatters > 0:
        out.append(
            f"the run reduce-scattered {scatters:g} times per step: it shards gradients (ZeRO-1 or more, FSDP), "
            f"where the plan (ZeRO-{zero}) reduce-scatters nothing"
        )
    return out


def _kind_flags(predicted: Mapping[str, float], measured: Mapping[str, float]) -> list[str]:
    out = []
    for kind in sorted(set(predicted) | {k for k, v in measured.items() if v > 0}):
        want, got = predicted.get(kind, 0.0), measured.get(kind, 0.0)
        if want > 0 and got == 0:
            out.append(f"{kind}: the plan issues {want:g} per step ({WHAT_ISSUES[kind]}); the run issued none")
        elif want == 0 and got > 0:
            out.append(f"{kind}: the run issued {got:g} per step, which the plan has none of ({WHAT_ISSUES[kind]})")
        elif want > 0 and max(got / want, want / got) > COUNT_RATIO:
            out.append(f"{kind}: the run issued {got:g} calls per step, the plan {want:g} ({got / want:.2f}x)")
    return out
