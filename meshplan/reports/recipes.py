"""Published recipes (``meshplan recipe``): each evaluated, and ranked against the planner's own search."""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

import numpy as np

from meshplan import io
from meshplan.core.plan import Plan, evaluate
from meshplan.reports.conditions import WORKLOAD_SET_BY_STACK, condition_names, workload_kwargs
from meshplan.reports.estimate import evaluated_plan_dict, uncertainty
from meshplan.reports.inputs import (
    LayoutRequest,
    layout_dict,
    resolve_cluster,
    resolve_layout,
    resolve_order,
    resolve_workload,
)
from meshplan.search.rank import HEADROOM, search
from meshplan.spec import requests

FIELDS = {
    "title",
    "source",
    "why",
    "model",
    "model_overrides",
    "gpu",
    "gpus",
    "scale_out",
    "seq",
    "global_batch",
    "precision",
    "attention",
    "axis_order",
    "layout",
} | {f.name for f in requests.group(requests.Group.CONDITIONS)}
"""A recipe's keys: what it is, the model and fleet, and schema fields as a user types them (the overlap of each
axis and the other conditions among them)."""


@cache
def recipes() -> dict[str, dict[str, Any]]:
    """Every recipe of catalog/recipes by name."""
    table = io.catalog_tables("recipes")
    for name, data in table.items():
        unknown = sorted(set(data) - FIELDS)
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r} in recipe {name}.toml")
    return table


def _recipe(name: str) -> dict[str, Any]:
    table = recipes()
    if name not in table:
        raise io.UnknownName(f"unknown recipe {name!r} (recipes: {', '.join(table)})")
    return table[name]


def evaluate_recipe(name: str) -> Plan:
    """The recipe's published layout evaluated."""
    return _evaluated(name)[0]


def _evaluated(name: str) -> tuple[Plan, dict[str, Any]]:
    """The recipe's published layout evaluated, and the report's stack and conditions fields."""
    r = _recipe(name)
    model = io.load_model(r["model"])
    if r.get("model_overrides"):
        model = dataclasses.replace(model, **r["model_overrides"])
    cluster = resolve_cluster(gpu=r["gpu"], gpus=r["gpus"], scale_out=r.get("scale_out"))
    layout = resolve_layout(LayoutRequest.parse(r["layout"]), gpus=r["gpus"])
    named = [name for name in ("stack", *condition_names()) if name not in WORKLOAD_SET_BY_STACK]
    conditions = requests.parse_values({k: r[k] for k in named if k in r}, allowed=requests.FIELDS, what="recipe")
    kwargs, shown = workload_kwargs(
        conditions, precision=r.get("precision"), attention=r.get("attention"), kernels=None
    )
    work = resolve_workload(layout=layout, seq=r["seq"], global_batch=r["global_batch"], **kwargs)
    return evaluate(model, cluster, layout, work, order=resolve_order(r.get("axis_order"))), shown


def factors(name: str) -> dict[str, int]:
    """The recipe's parallel degrees (the fleet ruler's marks) and the GPUs they multiply to."""
    lay = resolve_layout(LayoutRequest.parse(_recipe(name)["layout"]), gpus=_recipe(name)["gpus"])
    out = {"tp": lay.tp, "cp": lay.cp, "pp": lay.pp, "ep": lay.ep, "dp": lay.dp}
    return {k: v for k, v in out.items() if v > 1 or k in ("tp", "pp", "dp")} | {"gpus": lay.num_gpus}


def list_report() -> dict[str, Any]:
    """``meshplan recipe --list``: every recipe with its factors."""
    items = []
    for name, r in recipes().items():
        items.append(
            {
                "name": name,
                "title": r["title"],
                "model": r["model"],
                "gpu": r["gpu"],
                "gpus": r["gpus"],
                "seq": r["seq"],
                "factors": factors(name),
                "why": r["why"],
                "source": r["source"],
            }
        )
    return {"recipes": items}


def recipe_report(name: str, *, rank: bool = True) -> dict[str, Any]:
    """``meshplan recipe NAME``: the published layout evaluated, and where the planner ranks it."""
    r = _recipe(name)
    plan, shown = _evaluated(name)
    band = uncertainty(
        float(plan.step.step_time_s), None, cp=int(plan.layout.cp), ep=int(plan.layout.ep), gpu=plan.cluster.gpu.name
    )
    out = evaluated_plan_dict(plan) | shown | band
    out.update({"recipe": name, "title": r["title"], "source": r["source"], "why": r["why"], "factors": factors(name)})
    if rank:
        found = search(plan.model, plan.cluster, plan.workload, order=plan.order)
        times = np.asarray(found.step.step_time_s) * np.ones(found.feasible)
        published = float(plan.step.step_time_s)
        out["search"] = {
            "evaluated": found.evaluated,
            "feasible": found.feasible,
            "rank_of_published": int(np.sum(times < published * (1 - 1e-9))) + 1,
            "best_step_time_s": float(times[0]) if found.feasible else None,
            "best_layout": layout_dict(found.candidates.layout(0)) if found.feasible else None,
            "published_step_time_s": published,
            "published_fits_with_headroom": bool(
                plan.memory.per_gpu.total_bytes <= (1 - HEADROOM) * plan.cluster.gpu.hbm_bytes
            ),
        }
    return out
