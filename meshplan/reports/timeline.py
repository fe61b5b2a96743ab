"""The ``timeline`` key of ``estimate``: one step as a Gantt chart, the memory each stage holds over it, and where
the ranks sit (core/time/timeline.py draws the step from the step-time model's own terms)."""

from __future__ import annotations

from typing import Any

from meshplan.core import pipeline
from meshplan.core.params import count_params
from meshplan.core.plan import Plan
from meshplan.core.time.step_time import stage_step
from meshplan.core.time.timeline import Interval, StageRow, Timeline, step_timeline
from meshplan.reports.inputs import layout_dict

PLACEMENT_RANKS = 512
"""Ranks the placement lists (every node up to this many ranks); a larger fleet's drawing says how many more."""
GROUP_MEMBERS = 64
"""Members of rank 0's group listed per axis."""


def plan_timeline(plan: Plan) -> Timeline:
    """The step timeline of an evaluated layout, from the same ``stage_step`` its step time came from."""
    lay, work = plan.layout, plan.workload
    m = pipeline.micro_batches(work.global_batch, micro_batch=lay.micro_batch, dp=lay.dp_replicate * lay.dp_shard)
    st = stage_step(plan.model, count_params(plan.model), lay, work, plan.cluster, plan.placement, m=m, calls=True)
    return step_timeline(st, plan.step, lay, m=int(m), group=work.conditions.microbatch_group)


def _interval(it: Interval) -> dict[str, Any]:
    return {
        "start_s": it.start_s,
        "end_s": it.end_s,
        "kind": it.kind,
        "axis": it.axis,
        "exposed": it.exposed,
        "what": it.what,
        "micro_batch": it.micro_batch,
        "chunk": it.chunk,
        "count": it.count,
    }


def row_totals(intervals: list[dict[str, Any]]) -> dict[str, float]:
    """A stage row's seconds by kind, as the estimate's ``breakdown`` names them, and where the row ends."""
    out = {"step_time_s": max((i["end_s"] for i in intervals), default=0.0)}
    out |= {k: 0.0 for k in ("compute_s", "bubble_s", "optimizer_s", "host_s", "exposed_comm_s")}
    out |= {f"exposed_{a}_s": 0.0 for a in ("tp", "cp", "ep", "pp", "dp")}
    for i in intervals:
        d = i["end_s"] - i["start_s"]
        if i["kind"] in ("forward", "backward"):
            out["compute_s"] += d
        elif i["kind"] == "comm" and i["exposed"]:
            out["exposed_comm_s"] += d
            out[f"exposed_{i['axis']}_s"] += d
        elif i["kind"] != "comm":
            out[f"{i['kind']}_s"] += d
    return out


def _memory(row: StageRow, plan: Plan) -> dict[str, Any]:
    """The stage's bill over the step: its activations scale with the chunks it holds, at the most held the
    stage's own bill (``memory``'s stage total); everything else it holds all step."""
    bill = plan.memory.stages[row.stage]
    total, activations = float(bill.total_bytes), float(bill.activations_bytes)
    most = max(n for _, n in row.in_flight) or 1.0
    base = total - activations
    return {
        "stage": row.stage,
        "peak_bytes": total,
        "base_bytes": base,
        "activations_bytes": activations,
        "most_chunks_held": most,
        "points": [[t, base + activations * n / most] for t, n in row.in_flight],
    }


def placement_drawing(plan: Plan) -> dict[str, Any]:
    """Nodes (scale-up domains) and each axis's stride, with rank 0's group: enough to draw who shares a node."""
    cluster = plan.cluster
    axes = {}
    for axis in plan.order:
        p = plan.placement[axis]
        if int(p.size) == 1:
            continue
        size, stride = int(p.size), int(p.stride)
        axes[axis] = {
            "size": size,
            "stride": stride,
            "crosses_fabric": bool(p.outer > 1),
            "link": (cluster.scale_out if p.outer > 1 else cluster.scale_up).name,
            "group_of_rank_0": [k * stride for k in range(min(size, GROUP_MEMBERS))],
        }
    return {
        "gpus": cluster.num_gpus,
        "gpus_per_node": cluster.domain_size,
        "nodes": -(-cluster.num_gpus // cluster.domain_size),
        "ranks_drawn": min(cluster.num_gpus, PLACEMENT_RANKS),
        "axis_order": list(plan.order),
        "axes": axes,
        "scale_up": cluster.scale_up.name,
        "scale_out": cluster.scale_out.name,
    }


def timeline_dict(plan: Plan) -> dict[str, Any]:
    """``estimate``'s ``timeline`` key: the Gantt rows, their totals, the memory over the step and the placement."""
    tl = plan_timeline(plan)
    stages = []
    for row in tl.rows:
        intervals = [_interval(i) for i in row.intervals]
        stages.append(
            {
                "stage": row.stage,
                "intervals": intervals,
                "hidden": [_interval(i) for i in row.hidden],
                "totals": row_totals(intervals),
            }
        )
    return {
        "schedule": layout_dict(plan.layout)["schedule"],
        "drawn_as": tl.drawn_as,
        "pp": len(tl.rows),
        "vpp": tl.vpp,
        "micro_batches": tl.micro_batches,
        "slot_send_s": tl.slot_send_s,
        "bubble_scale": tl.bubble_scale,
        "totals": stages[0]["totals"],
        "stages": stages,
        "memory": [_memory(row, plan) for row in tl.rows],
        "placement": placement_drawing(plan),
    }
