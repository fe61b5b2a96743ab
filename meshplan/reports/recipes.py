"""Published recipes (``meshplan recipe``): each evaluated, and ranked against the planner's own search."""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

import numpy as np

from meshplan import io
from meshplan.core.plan import Plan, evaluate, metric_value
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
    "kernels",
    "axis_order",
    "layout",
    "published",
} | {f.name for f in requests.group(requests.Group.CONDITIONS)}
"""A recipe's keys: what it is, the model and fleet, schema fields as a user types them (the overlap of each
axis and the other conditions among them), and ``published``: the catalog run (``run``, a catalog/runs file,
and ``case``, its id) that measured it, whose conditions the recipe states."""


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
        conditions, precision=r.get("precision"), attention=r.get("attention"), kernels=r.get("kernels")
    )
    work = resolve_workload(layout=layout, seq=r["seq"], global_batch=r["global_batch"], **kwargs)
    return evaluate(model, cluster, layout, work, order=resolve_order(r.get("axis_order"))), shown


def published_figure(name: str, plan: Plan) -> dict[str, Any]:
    """What the recipe's catalog run measured, where it was published, and meshplan's prediction of it in the
    same unit (``core.plan.metric_value``, as ``meshplan validate`` predicts it: the recipe states that run's
    conditions)."""
    ref = _recipe(name)["published"]
    runs = io.run_sources()
    if ref["run"] not in runs:
        raise ValueError(f"recipe {name}: no catalog run {ref['run']!r}")
    source = runs[ref["run"]]["source"]
    cases = [c for c in runs[ref["run"]]["case"] if c["id"] == ref["case"]]
    if not cases:
        raise ValueError(f"recipe {name}: no case {ref['case']!r} in catalog/runs/{ref['run']}.toml")
    measured, metric = float(cases[0]["measured"]), source["metric"]
    predicted = metric_value(plan, metric)
    return {
        "metric": metric,
        "value": measured,
        "predicted": predicted,
        "error": predicted / measured - 1,
        "source": source["title"],
        "locator": source.get("locator"),
        "url": source.get("url"),
        "run": ref["run"],
        "case": ref["case"],
    }


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
        float(plan.step.step_time_s),
        None,
        cp=int(plan.layout.cp),
        ep=int(plan.layout.ep),
        gpu=plan.cluster.gpu.name,
        tp=int(plan.layout.tp),
        pp=int(plan.layout.pp),
        stack=shown.get("stack"),
    )
    out = evaluated_plan_dict(plan) | shown | band
    out.update({"recipe": name, "title": r["title"], "source": r["source"], "why": r["why"], "factors": factors(name)})
    out["published"] = published_figure(name, plan)
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
