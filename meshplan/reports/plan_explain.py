"""Why one plan beats another: the step-time and memory terms side by side (``plan --explain`` and
``--compare``), and the key=value layouts ``--compare`` names."""

from __future__ import annotations

import dataclasses
from typing import Any

from meshplan.core.memory.bill import TERMS
from meshplan.core.plan import Plan, evaluate
from meshplan.reports.estimate import evaluated_plan_dict
from meshplan.reports.inputs import LAYOUT_ALIASES, LayoutRequest, layout_dict
from meshplan.reports.pins import refuse_pins
from meshplan.reports.plan_fleet import SearchRules
from meshplan.spec import requests
from meshplan.spec.cluster import Cluster
from meshplan.spec.layout import Layout
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload

STEP_TERMS = (
    "compute_s",
    "exposed_tp_s",
    "exposed_cp_s",
    "exposed_ep_s",
    "exposed_pp_s",
    "exposed_dp_s",
    "bubble_s",
    "optimizer_s",
    "host_s",
)
STEP_LABELS = {
    "compute_s": "compute",
    "exposed_tp_s": "TP/SP traffic",
    "exposed_cp_s": "CP traffic",
    "exposed_ep_s": "EP all-to-all",
    "exposed_pp_s": "pipeline sends and syncs",
    "exposed_dp_s": "DP/ZeRO traffic",
    "bubble_s": "pipeline bubble",
    "optimizer_s": "optimizer step",
    "host_s": "host overhead",
}


def compare_fields(text: str) -> dict[str, Any]:
    """The fields 'tp=8,pp=16,dp=128' states, parsed by the schema (any layout field; mb for micro_batch)."""
    raw: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        if "=" not in item:
            raise ValueError(f"layout item {item!r} must look like key=value (e.g. tp=8,pp=16,dp=128)")
        key, value = (x.strip() for x in item.split("=", 1))
        raw[key.lower().replace("-", "_")] = value
    layout = requests.group(requests.Group.LAYOUT)
    return requests.parse_values(raw, allowed=layout, what="layout", aliases=LAYOUT_ALIASES)


def parse_compare(text: str) -> LayoutRequest:
    """A layout from 'tp=8,pp=16,dp=128', the fields it does not state at their defaults."""
    return LayoutRequest(**compare_fields(text))


MESH = ("tp", "pp", "cp", "dp")


def named_layout(
    spec: ModelSpec, cluster: Cluster, work: Workload, rules: SearchRules, text: str
) -> tuple[Layout, dict[str, Any], str]:
    """The layout ``--compare`` names: its stated fields, the others filled as the planner would fill them (the
    best layout with the stated fields that fits, or the lightest where none fits); the fields filled and
    how. Stated fields no layout of the fleet can have are refused."""
    stated = compare_fields(text)
    pins = {k: int(v) if k == "sp" else v for k, v in stated.items()}  # an explicit sp=false pins sp off too
    cross = rules.allow_cross_node_tp or int(stated.get("tp", 1)) > cluster.domain_size
    named_rules = dataclasses.replace(rules, pins=pins, allow_cross_node_tp=cross)
    found = named_rules.search(spec, cluster, work)
    if found.feasible:
        layout, how = found.candidates.layout(0), "the fastest that fits"
    elif found.lightest is not None:
        layout, how = found.lightest, "the lightest (none with the stated fields fits)"
    else:
        refuse_pins(spec, work, cluster, pins, allow_cross_node_tp=cross)
    given = set(stated)
    implied = set(MESH) - given if len(set(MESH) & given) == 3 else set()  # three of the mesh's four set the last
    dp_known = "dp" in given or {"tp", "pp", "cp"} <= given
    if dp_known and {"dp_shard", "dp_replicate"} & given:
        implied |= {"dp_shard", "dp_replicate"}
    if spec.moe is None:
        implied |= {"ep", "expert_tp"}  # no experts: nothing to choose
    if layout.cp == 1:
        implied.add("cp_kind")
    filled = {k: v for k, v in layout_dict(layout).items() if k not in stated and k not in implied}
    return layout, filled, how


def _plan_as_candidate(plan: Plan) -> dict[str, Any]:
    r = evaluated_plan_dict(plan)
    return {k: r[k] for k in ("layout", "step_time_s", "mfu", "tokens_per_s_per_gpu", "per_gpu", "fits")} | {
        "free_bytes_per_gpu": r["free_bytes_per_gpu"],
        "breakdown": {name: r["breakdown"][name] for name in STEP_TERMS},
        "warnings": r["warnings"],
    }


def _explain(a: dict[str, Any], b: dict[str, Any], label_a: str, label_b: str) -> dict[str, Any]:
    """Term-by-term difference of two plans, and the terms that decide it."""
    rows = []
    for name in STEP_TERMS:
        rows.append(
            {
                "term": STEP_LABELS[name],
                "unit": "s",
                "value_a": a["breakdown"][name],
                "value_b": b["breakdown"][name],
                "difference": b["breakdown"][name] - a["breakdown"][name],
            }
        )
    for name in (*TERMS, "total_bytes"):
        rows.append(
            {
                "term": name,
                "unit": "bytes",
                "value_a": a["per_gpu"][name],
                "value_b": b["per_gpu"][name],
                "difference": b["per_gpu"][name] - a["per_gpu"][name],
            }
        )
    time_rows = [r for r in rows if r["unit"] == "s"]
    worst = max(time_rows, key=lambda r: r["difference"])
    best = min(time_rows, key=lambda r: r["difference"])
    gap = b["step_time_s"] - a["step_time_s"]
    if gap >= 0:
        why = (
            f"{label_b} is {gap:.3g} s slower per step; its largest loss is {worst['term']} "
            f"(+{worst['difference']:.3g} s)"
        )
        if best["difference"] < 0:
            why += f", partly offset by {best['term']} ({best['difference']:.3g} s)"
    else:
        why = (
            f"{label_b} is {-gap:.3g} s faster per step; its largest gain is {best['term']} "
            f"({best['difference']:.3g} s)"
        )
        if worst["difference"] > 0:
            why += f", but it loses {worst['difference']:.3g} s on {worst['term']}"
    return {"a": label_a, "b": label_b, "rows": rows, "why": why}


def explanations(
    spec: ModelSpec,
    cluster: Cluster,
    work: Workload,
    plans: list[dict[str, Any]],
    rules: SearchRules,
    compare: str | None,
) -> list[dict[str, Any]]:
    out = []
    if len(plans) >= 2:
        out.append(_explain(plans[0], plans[1], "best", "runner-up"))
    if compare and plans:
        lay, filled, how = named_layout(spec, cluster, work, rules, compare)
        named = _plan_as_candidate(evaluate(spec, cluster, lay, work, order=rules.order))
        item = _explain(plans[0], named, "best", compare)
        item["named"] = named
        item["filled"] = filled
        item["filled_with"] = how
        out.append(item)
    return out
