"""Planner reports: ``meshplan plan`` (search, rank, explain) and the comparison of named layouts."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, Unpack

import numpy as np

from meshplan import io
from meshplan.core.memory.bill import TERMS
from meshplan.core.memory.pressure import hbm_pressure, near_capacity, pressure_warning
from meshplan.core.placement import place
from meshplan.core.plan import mesh_sizes
from meshplan.core.time.flops import MFU_CONVENTION
from meshplan.render import jsonable
from meshplan.reports.conditions import workload_kwargs
from meshplan.reports.cost import CostRequest, checkpoint_dict
from meshplan.reports.estimate import placement_dict, uncertainty, widen_for_pressure
from meshplan.reports.inputs import (
    FinetuneRequest,
    FleetArgs,
    finetune_fields,
    layout_dict,
    resolve_cluster,
    resolve_finetune,
    resolve_order,
    resolve_workload,
)
from meshplan.reports.pins import pinned_space, refuse_pins
from meshplan.reports.plan_cost import cheapest_fleet, plan_costs
from meshplan.reports.plan_explain import STEP_TERMS, explanations
from meshplan.reports.plan_fleet import Deadline, SearchRules, fewest_for_deadline, tried_json, what_would_fit
from meshplan.reports.published_range import mark_plans
from meshplan.search.order import Objective
from meshplan.search.rank import SearchResult
from meshplan.search.space import SearchSpace
from meshplan.spec.cluster import Cluster
from meshplan.spec.finetune import Finetune
from meshplan.spec.layout import Layout
from meshplan.spec.model import ModelSpec
from meshplan.spec.requests import MAX_GPUS
from meshplan.spec.workload import Workload


def _candidate(
    result: SearchResult,
    i: int,
    cluster: Cluster,
    order: tuple[str, ...],
    profile: str | None,
    stack: str | None = None,
) -> dict[str, Any]:
    step, mem = result.step, result.memory
    lay = result.candidates.layout(i)
    per_gpu = {name: float(np.asarray(getattr(mem, name))[i]) for name in TERMS}
    per_gpu["optimizer_bytes"] = per_gpu["master_weights_bytes"] + per_gpu["optimizer_moments_bytes"]
    per_gpu["total_bytes"] = sum(per_gpu[name] for name in TERMS)
    breakdown = {name: float(np.asarray(getattr(step, name))[i]) for name in STEP_TERMS}
    step_time_s = float(np.asarray(step.step_time_s)[i])
    pressure = float(hbm_pressure(per_gpu["total_bytes"], cluster.gpu.hbm_bytes))
    band = widen_for_pressure(
        uncertainty(
            step_time_s,
            profile,
            cp=int(lay.cp),
            ep=int(lay.ep),
            gpu=cluster.gpu.name,
            tp=int(lay.tp),
            pp=int(lay.pp),
            stack=stack,
        ),
        pressure,
    )
    return {
        "layout": layout_dict(lay),
        "step_time_s": step_time_s,
        "step_time_s_p10": band["step_time_s_p10"],
        "step_time_s_p90": band["step_time_s_p90"],
        "mfu": float(np.asarray(step.mfu)[i]),
        "hfu": float(np.asarray(step.hfu)[i]),
        "mfu_fp8_peak": None if step.mfu_fp8_peak is None else float(np.asarray(step.mfu_fp8_peak)[i]),
        "tokens_per_s_per_gpu": float(np.asarray(step.tokens_per_s_per_gpu)[i]),
        "per_gpu": per_gpu,
        "free_bytes_per_gpu": cluster.gpu.hbm_bytes - per_gpu["total_bytes"],
        "hbm_pressure": pressure,
        "near_capacity": bool(near_capacity(pressure)),
        "breakdown": breakdown,
        "placement": placement_dict(place(mesh_sizes(lay), order=order, domain=cluster.domain_size), cluster),
    }


def _first_axes(plans: list[dict[str, Any]]) -> dict[str, int]:
    """Tensor-, pipeline-, context- and expert-parallel degrees of plan 1 (1 when nothing fits)."""
    return {axis: int(plans[0]["layout"][axis]) if plans else 1 for axis in ("tp", "pp", "cp", "ep")}


def run_search(
    spec: ModelSpec,
    cluster: Cluster,
    work: Workload,
    *,
    top: int,
    rules: SearchRules,
    objective: Objective,
    engine: str | None = None,
    profile: str | None = None,
    refuse: bool = True,
    stack: str | None = None,
) -> tuple[SearchResult, list[dict[str, Any]]]:
    """The search's result and its best distinct plans as JSON (``profile``: the ``--profile`` text whose band, if
    it carries one, the plans' step times take). Pins that no layout of the fleet can have are refused (unless
    ``refuse`` is False: the cost objective's halvings, where a smaller fleet holding none is not an error)."""
    result = rules.search(spec, cluster, work, objective=objective)
    if refuse and not result.valid and pinned_space(rules.pins)[0] is not None:  # pins no layout of the fleet has
        refuse_pins(spec, work, cluster, rules.pins, allow_cross_node_tp=rules.allow_cross_node_tp)
    accept = None if engine is None else _runs_on(engine, spec, work)
    picked = distinct(result, top, accept=accept)
    plans = [_candidate(result, i, cluster, rules.order, profile, stack) for i in picked]
    return result, plans


def _runs_on(engine: str, spec: ModelSpec, work: Workload) -> Callable[[Layout], bool]:
    """Whether ``engine``'s export accepts a layout (the check ``meshplan export ENGINE --from-plan`` runs)."""
    from meshplan.exports import TRAINING_EXPORTERS, Engine, UnsupportedByEngine

    exporter = TRAINING_EXPORTERS[Engine(engine)]

    def accept(layout: Layout) -> bool:
        try:
            exporter(spec, layout, dataclasses.replace(work, global_batch=work.global_batch))
        except UnsupportedByEngine:
            return False
        return True

    return accept


DISTINCT_BY = ("tp", "cp", "pp", "ep", "zero", "sp", "recompute")
"""Plans that differ only in virtual stages, micro-batch or how DP splits into shard and replicas are variants
of one layout: the report shows the best of each."""


ENGINE_SCAN = 20_000
"""Candidates an engine filter examines at most, best first (each one is an export)."""


def distinct(result: SearchResult, top: int, *, accept: Callable[[Layout], bool] | None = None) -> list[int]:
    """Indices of the best candidate of each distinct layout, best first, at most ``top`` (only those ``accept``
    takes, among the first ENGINE_SCAN candidates, when given)."""
    cand = result.candidates
    keys = np.stack([np.asarray(getattr(cand, name), dtype=np.int64) for name in DISTINCT_BY], axis=1)
    seen: set[tuple[int, ...]] = set()
    out: list[int] = []
    for i in range(len(cand) if accept is None else min(len(cand), ENGINE_SCAN)):
        key = tuple(keys[i].tolist())
        if key not in seen and (accept is None or accept(cand.layout(i))):
            seen.add(key)
            out.append(i)
            if len(out) == top:
                break
    return out


def plan_report(
    model: ModelSpec | str,
    *,
    gpu: str,
    gpus: int,
    seq: int,
    global_batch_tokens: int,
    top: int = 5,
    headroom: float = 0.10,
    allow_cross_node_tp: bool = False,
    objective: str = "step-time",
    precision: str | None = None,
    attention: str | None = None,
    kernels: str | None = None,
    axis_order: str | None = None,
    explain: bool = False,
    compare: str | None = None,
    tokens: float | None = None,
    days: float | None = None,
    finetune: FinetuneRequest | None = None,
    pins: Mapping[str, Any] | None = None,
    training_engine: str | None = None,
    max_gpus: int = MAX_GPUS,
    conditions: Mapping[str, Any] | None = None,
    cost: CostRequest | None = None,
    **fleet_args: Unpack[FleetArgs],
) -> dict[str, Any]:
    """``meshplan plan``: the fastest layouts that fit, why they win, and what every rejection was for.

    ``pins`` keeps layouts with the fields it sets; ``training_engine`` those its export accepts (``export
    --from-plan`` runs what was picked), scored under that engine's stack unless ``conditions`` names one;
    ``max_gpus`` bounds the fewest-gpus objective's fleets; ``cost``: the price, checkpoint and failure fields
    (reports/plan_cost.py; the cost objective searches halvings of the fleet); ``fleet_args``: ``resolve_cluster``'s."""
    spec = io.load_model(model) if isinstance(model, str) else model
    ft = resolve_finetune(finetune, spec) if finetune else None
    _check_numbers(
        seq=seq, global_batch_tokens=global_batch_tokens, headroom=headroom, tokens=tokens, days=days, top=top
    )
    order = resolve_order(axis_order)
    set_by, shown = workload_kwargs(
        conditions, precision=precision, attention=attention, kernels=kernels, engine=training_engine
    )
    work = _workload(seq, global_batch_tokens // seq, set_by, ft)
    fleet = functools.partial(resolve_cluster, gpu=gpu, **fleet_args)
    rules = SearchRules(headroom=headroom, allow_cross_node_tp=allow_cross_node_tp, order=order, pins=pins)
    obj, fewest, gpus = _fleet_size(spec, fleet, work, gpus, objective, tokens, days, rules, max_gpus)
    cheapest, cost = None, cost or CostRequest()
    if obj is Objective.COST:  # the fleet first: the one given or a halving, whichever trains the tokens cheapest
        kw = dict(
            top=1,
            rules=rules,
            objective=obj,
            engine=training_engine,
            profile=fleet_args.get("profile"),
            refuse=False,
            stack=shown.get("stack"),
        )
        gpus, cheapest = cheapest_fleet(
            lambda n: next(iter(run_search(spec, fleet(gpus=n), work, **kw)[1]), None),
            lambda n: checkpoint_dict(spec, work, fleet(gpus=n), cost),
            start=gpus,
            tokens=tokens,
            days=days,
            req=cost,
        )
    cluster = fleet(gpus=gpus)
    result, plans = run_search(
        spec,
        cluster,
        work,
        top=top,
        rules=rules,
        objective=obj,
        engine=training_engine,
        profile=fleet_args.get("profile"),
        stack=shown.get("stack"),
    )
    out: dict[str, Any] = {
        **_run_fields(spec, cluster, work, global_batch_tokens),
        "objective": "fewest-gpus" if fewest else str(obj),
        "engine": training_engine,
        "mfu_convention": MFU_CONVENTION,
        "headroom_fraction": headroom,
        **finetune_fields(spec, work.finetune),
        **shown,
        **_search_fields(result, plans),
        # the band's source as it applies to plan 1 (a layout with context or expert parallelism takes the band
        # of the published runs of its kind)
        "uncertainty": uncertainty(
            1.0, fleet_args.get("profile"), **_first_axes(plans), gpu=cluster.gpu.name, stack=shown.get("stack")
        )["uncertainty"],
        **({"fewest_gpus": fewest} if fewest else {}),
        "not_searched": _not_searched(rules),
    }
    if not plans:
        out["nothing_fits"] = what_would_fit(spec, fleet, cluster, work, result, rules, finetune=ft, max_gpus=max_gpus)
    _time_to_train(plans, tokens, cluster.num_gpus)
    out |= mark_plans(plans, gpu=cluster.gpu.name, moe=spec.moe is not None, dtype=work.precision.compute)
    if plans and plans[0]["near_capacity"]:  # never ranked first without saying so
        out["warnings"] = [*out["warnings"], f"plan 1: {pressure_warning(plans[0]['hbm_pressure'], fits=True)[0]}"]
    plan_costs(out, plans, spec=spec, cluster=cluster, work=work, tokens=tokens, req=cost, cheapest=cheapest)
    if explain or compare:
        out["explain"] = explanations(spec, cluster, work, plans, rules, compare)
    data: dict[str, Any] = jsonable(out)
    return data


def _run_fields(spec: ModelSpec, cluster: Cluster, work: Workload, global_batch_tokens: int) -> dict[str, Any]:
    """What was planned for: the model, the fleet, the sequence and the batch."""
    return {
        "model": spec.name,
        "gpu": cluster.gpu.name,
        "gpus": cluster.num_gpus,
        "seq": work.seq_len,
        "global_batch": work.global_batch,
        "global_batch_tokens": global_batch_tokens,
    }


def _time_to_train(plans: list[dict[str, Any]], tokens: float | None, gpus: int) -> None:
    """Days each plan takes to train ``tokens`` on the fleet."""
    for p in plans if tokens else ():
        p["time_to_train_days"] = tokens / (p["tokens_per_s_per_gpu"] * gpus) / 86400


def _fleet_size(
    spec: ModelSpec,
    fleet: Callable[..., Cluster],
    work: Workload,
    gpus: int,
    objective: str,
    tokens: float | None,
    days: float | None,
    rules: SearchRules,
    max_gpus: int,
) -> tuple[Objective, dict[str, Any] | None, int]:
    """The objective to rank by and the fleet to search: ``fewest-gpus`` first finds the smallest fleet that
    trains ``tokens`` within ``days`` (``plan_fleet.fewest_for_deadline``) and then ranks its layouts by step
    time."""
    obj = _objective(objective, tokens=tokens, days=days)
    if isinstance(obj, Objective):
        return obj, None, gpus
    assert tokens is not None and days is not None
    found = fewest_for_deadline(
        spec, fleet, work, rules, start=gpus, deadline=Deadline(tokens=tokens, days=days), high=max_gpus
    )
    assert found.gpus is not None
    fewest = {
        "gpus": found.gpus,
        "searched_from": gpus,
        "tokens": tokens,
        "days": days,
        "tried": tried_json(found, deadline=True),
        "sizes_in_bracket": found.sizes_in_bracket,
        "sizes_untried_below": found.untried_below,
    }
    return Objective.STEP_TIME, fewest, found.gpus


def _not_searched(rules: SearchRules) -> list[str]:
    """What the search leaves out, in words."""
    space, _ = pinned_space(rules.pins)
    out = (space or SearchSpace()).left_out()
    if not rules.allow_cross_node_tp:
        out.append("TP across the scale-up domain (add --allow-cross-node-tp to search it)")
    return out


def _search_fields(result: SearchResult, plans: list[dict[str, Any]]) -> dict[str, Any]:
    """What the search did: how many layouts it evaluated, how many fit, the plans, the front, the rejections."""
    return {
        "evaluated": result.evaluated,
        "feasible": result.feasible,
        "elapsed_s": result.elapsed_s,
        "plans": plans,
        "pareto": _pareto(result),
        "rejections": dict(sorted(result.rejections.items(), key=lambda kv: -kv[1])),
    }


def _check_numbers(
    seq: int, global_batch_tokens: int, *, headroom: float, tokens: float | None, days: float | None, top: int
) -> None:
    """The library's own checks (the CLI and the API bound these fields in the schema already)."""
    if global_batch_tokens % seq:
        raise ValueError(f"global batch of {global_batch_tokens} tokens is not a whole number of {seq}-token sequences")
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom must be in [0, 1), got {headroom}")
    for name, value, high in (("tokens", tokens, 1e16), ("days", days, 3650.0)):
        if value is not None and not 0 < value <= high:  # also refuses NaN and infinities
            raise ValueError(f"{name} must be in (0, {high:g}], got {value:g}")
    if top < 1:
        raise ValueError(f"top must be >= 1, got {top}")


def _pareto(result: SearchResult) -> list[dict[str, Any]]:
    """The step-time / memory Pareto front, fastest first."""
    return [
        {
            "step_time_s": float(np.asarray(result.step.step_time_s)[i]),
            "memory_bytes_per_gpu": float(np.asarray(result.memory.total_bytes)[i]),
            "layout": layout_dict(result.candidates.layout(int(i))),
        }
        for i in result.pareto
    ]


def _objective(text: str, *, tokens: float | None, days: float | None) -> Objective | str:
    if text == "fewest-gpus":
        if not tokens or not days:
            raise ValueError("the fewest-gpus objective needs --tokens and --days")
        return "fewest-gpus"
    try:
        return Objective(text)
    except ValueError:
        names = ", ".join([o.value for o in Objective] + ["fewest-gpus"])
        raise ValueError(f"unknown objective {text!r} (choose from {names})") from None


def _workload(seq: int, batch: int, set_by: Mapping[str, Any], finetune: Finetune | None = None) -> Workload:
    from meshplan.spec.layout import Layout

    return resolve_workload(layout=Layout(), seq=seq, global_batch=batch, finetune=finetune, **set_by)
