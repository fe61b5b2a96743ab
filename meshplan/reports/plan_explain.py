"""Why one plan beats another: the step-time and memory terms side by side (``plan --explain`` and
``--compare``), and the key=value layouts ``--compare`` names."""

from __future__ import annotations

from typing import Any

from meshplan.core.memory.bill import TERMS
from meshplan.core.plan import Plan, evaluate
from meshplan.reports.estimate import evaluated_plan_dict
from meshplan.reports.inputs import LayoutRequest, resolve_layout
from meshplan.spec.cluster import Cluster
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


def parse_compare(text: str) -> LayoutRequest:
    """A layout from 'tp=8,pp=16,dp=128': any layout field of the schema (mb for micro_batch), none dropped."""
    raw: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        if "=" not in item:
            raise ValueError(f"layout item {item!r} must look like key=value (e.g. tp=8,pp=16,dp=128)")
        key, value = (x.strip() for x in item.split("=", 1))
        raw[key.lower().replace("-", "_")] = value
    return LayoutRequest.parse(raw)


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
    order: tuple[str, ...],
    compare: str | None,
) -> list[dict[str, Any]]:
    out = []
    if len(plans) >= 2:
        out.append(_explain(plans[0], plans[1], "best", "runner-up"))
    if compare and plans:
        req = parse_compare(compare)
        lay = resolve_layout(req, gpus=cluster.num_gpus)
        named = _plan_as_candidate(evaluate(spec, cluster, lay, work, order=order))
        item = _explain(plans[0], named, "best", compare)
        item["named"] = named
        out.append(item)
    return out
