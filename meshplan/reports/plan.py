"""Planner reports: ``meshplan plan`` (search, rank, explain) and the comparison of named layouts."""

from __future__ import annotations

from typing import Any

import numpy as np

from meshplan import io
from meshplan.core.memory import TERMS
from meshplan.core.placement import place
from meshplan.core.plan import Plan, evaluate, mesh_sizes
from meshplan.render import jsonable
from meshplan.reports.estimate import evaluated_plan_dict
from meshplan.reports.inputs import (
    FinetuneRequest,
    LayoutRequest,
    finetune_fields,
    layout_dict,
    resolve_cluster,
    resolve_finetune,
    resolve_layout,
    resolve_order,
    resolve_workload,
)
from meshplan.search.rank import Objective, SearchResult, search
from meshplan.spec.cluster import Cluster
from meshplan.spec.finetune import Finetune
from meshplan.spec.model import ModelSpec
from meshplan.spec.requests import Group, group, parse_key_values
from meshplan.spec.workload import Workload

MAX_GPUS = 1 << 20
STEP_TERMS = (
    "compute_s",
    "exposed_tp_s",
    "exposed_cp_s",
    "exposed_ep_s",
    "exposed_pp_s",
    "exposed_dp_s",
    "bubble_s",
    "optimizer_s",
)
STEP_LABELS = {
    "compute_s": "compute",
    "exposed_tp_s": "TP/SP traffic",
    "exposed_cp_s": "CP traffic",
    "exposed_ep_s": "EP all-to-all",
    "exposed_pp_s": "pipeline sends",
    "exposed_dp_s": "DP/ZeRO traffic",
    "bubble_s": "pipeline bubble",
    "optimizer_s": "optimizer step",
}


def parse_compare(text: str) -> LayoutRequest:
    """A layout from 'tp=8,pp=16,dp=128': any layout field of the schema (mb for micro_batch), none dropped."""
    return LayoutRequest(**parse_key_values(text, allowed=group(Group.LAYOUT), what="layout"))


def _placement(layout: Any, cluster: Cluster, order: tuple[str, ...]) -> dict[str, Any]:
    """Each parallel axis of a layout: inside one NVLink domain, or across the fabric."""
    out = {}
    for axis, p in place(mesh_sizes(layout), order=order, domain=cluster.domain_size).items():
        if int(p.size) > 1:
            crosses = bool(p.outer > 1)
            out[axis] = {
                "size": int(p.size),
                "domains": int(p.outer),
                "crosses_fabric": crosses,
                "link": (cluster.scale_out if crosses else cluster.scale_up).name,
            }
    return out


def _candidate(result: SearchResult, i: int, cluster: Cluster, order: tuple[str, ...]) -> dict[str, Any]:
    step, mem = result.step, result.memory
    lay = result.candidates.layout(i)
    per_gpu = {name: float(np.asarray(getattr(mem, name))[i]) for name in TERMS}
    per_gpu["optimizer_bytes"] = per_gpu["master_weights_bytes"] + per_gpu["optimizer_moments_bytes"]
    per_gpu["total_bytes"] = sum(per_gpu[name] for name in TERMS)
    breakdown = {name: float(np.asarray(getattr(step, name))[i]) for name in STEP_TERMS}
    return {
        "layout": layout_dict(lay),
        "step_time_s": float(np.asarray(step.step_time_s)[i]),
        "mfu": float(np.asarray(step.mfu)[i]),
        "tokens_per_s_per_gpu": float(np.asarray(step.tokens_per_s_per_gpu)[i]),
        "per_gpu": per_gpu,
        "free_bytes_per_gpu": cluster.gpu.hbm_bytes - per_gpu["total_bytes"],
        "breakdown": breakdown,
        "placement": _placement(lay, cluster, order),
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


def _plan_as_candidate(plan: Plan) -> dict[str, Any]:
    r = evaluated_plan_dict(plan)
    return {k: r[k] for k in ("layout", "step_time_s", "mfu", "tokens_per_s_per_gpu", "per_gpu", "fits")} | {
        "free_bytes_per_gpu": r["free_bytes_per_gpu"],
        "breakdown": {name: r["breakdown"][name] for name in STEP_TERMS},
        "warnings": r["warnings"],
    }


def run_search(
    spec: ModelSpec,
    cluster: Cluster,
    work: Workload,
    *,
    top: int,
    headroom: float,
    allow_cross_node_tp: bool,
    order: tuple[str, ...],
    objective: Objective,
) -> tuple[SearchResult, list[dict[str, Any]]]:
    result = search(
        spec,
        cluster,
        work,
        headroom=headroom,
        allow_cross_node_tp=allow_cross_node_tp,
        order=order,
        objective=objective,
    )
    return result, [_candidate(result, i, cluster, order) for i in distinct(result, top)]


DISTINCT_BY = ("tp", "cp", "pp", "ep", "zero", "sp", "recompute")
"""Plans that differ only in virtual stages, micro-batch or how DP splits into shard and replicas are variants
of one layout: the report shows the best of each."""


def distinct(result: SearchResult, top: int) -> list[int]:
    """Indices of the best candidate of each distinct layout, best first, at most ``top``."""
    cand = result.candidates
    keys = np.stack([np.asarray(getattr(cand, name), dtype=np.int64) for name in DISTINCT_BY], axis=1)
    seen: set[tuple[int, ...]] = set()
    out: list[int] = []
    for i in range(len(cand)):
        key = tuple(keys[i].tolist())
        if key not in seen:
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
    precision: str = "bf16",
    attention: str = "flash",
    kernels: str = "fused",
    node_size: int | None = None,
    scale_out: str | None = None,
    axis_order: str | None = None,
    explain: bool = False,
    compare: str | None = None,
    tokens: float | None = None,
    days: float | None = None,
    finetune: FinetuneRequest | None = None,
    profile: str | None = None,
) -> dict[str, Any]:
    """``meshplan plan``: the fastest layouts that fit, why they win, and what every rejection was for."""
    spec = io.load_model(model) if isinstance(model, str) else model
    ft = resolve_finetune(finetune, spec) if finetune else None
    if global_batch_tokens % seq:
        raise ValueError(f"global batch of {global_batch_tokens} tokens is not a whole number of {seq}-token sequences")
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom must be in [0, 1), got {headroom}")
    if top < 1:
        raise ValueError(f"top must be >= 1, got {top}")
    order = resolve_order(axis_order)
    obj = _objective(objective, tokens=tokens, days=days)
    work = _workload(seq, global_batch_tokens // seq, precision, attention, kernels, ft)
    fewest: dict[str, Any] | None = None
    if not isinstance(obj, Objective):  # "fewest-gpus"
        assert tokens is not None and days is not None
        start = gpus
        gpus = _fewest_gpus(
            spec,
            gpu=gpu,
            start=gpus,
            work=work,
            tokens=tokens,
            days=days,
            headroom=headroom,
            allow=allow_cross_node_tp,
            order=order,
            node_size=node_size,
            scale_out=scale_out,
            profile=profile,
        )
        fewest = {"gpus": gpus, "searched_from": start, "tokens": tokens, "days": days}
        obj = Objective.STEP_TIME
    cluster = resolve_cluster(gpu=gpu, gpus=gpus, node_size=node_size, scale_out=scale_out, profile=profile)
    result, plans = run_search(
        spec,
        cluster,
        work,
        top=top,
        headroom=headroom,
        allow_cross_node_tp=allow_cross_node_tp,
        order=order,
        objective=obj,
    )
    front = [
        {
            "step_time_s": float(np.asarray(result.step.step_time_s)[i]),
            "memory_bytes_per_gpu": float(np.asarray(result.memory.total_bytes)[i]),
            "layout": layout_dict(result.candidates.layout(int(i))),
        }
        for i in result.pareto
    ]
    out: dict[str, Any] = {
        "model": spec.name,
        "gpu": cluster.gpu.name,
        "gpus": cluster.num_gpus,
        "seq": seq,
        "global_batch": work.global_batch,
        "global_batch_tokens": global_batch_tokens,
        "objective": "fewest-gpus" if fewest else str(obj),
        "headroom_fraction": headroom,
        **finetune_fields(spec, work.finetune),
        "evaluated": result.evaluated,
        "feasible": result.feasible,
        "elapsed_s": result.elapsed_s,
        "plans": plans,
        "pareto": front,
        "rejections": dict(sorted(result.rejections.items(), key=lambda kv: -kv[1])),
    }
    if fewest:
        out["fewest_gpus"] = fewest
    if tokens:
        for p in out["plans"]:
            p["time_to_train_days"] = tokens / (p["tokens_per_s_per_gpu"] * cluster.num_gpus) / 86400
    if explain or compare:
        out["explain"] = _explanations(spec, cluster, work, plans, order, compare)
    data: dict[str, Any] = jsonable(out)
    return data


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


def _workload(
    seq: int, batch: int, precision: str, attention: str, kernels: str, finetune: Finetune | None = None
) -> Workload:
    from meshplan.spec.layout import Layout

    return resolve_workload(
        layout=Layout(),
        seq=seq,
        global_batch=batch,
        precision=precision,
        attention=attention,
        kernels=kernels,
        finetune=finetune,
    )


def _explanations(
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


def _fewest_gpus(
    spec: ModelSpec,
    *,
    gpu: str,
    start: int,
    work: Workload,
    tokens: float,
    days: float,
    headroom: float,
    allow: bool,
    order: tuple[str, ...],
    node_size: int | None,
    scale_out: str | None,
    profile: str | None = None,
) -> int:
    """The smallest fleet (powers of two times the node, from ``start``) whose best plan trains in ``days``."""
    n = max(start, 1)
    while n <= MAX_GPUS:
        cluster = resolve_cluster(gpu=gpu, gpus=n, node_size=node_size, scale_out=scale_out, profile=profile)
        result = search(spec, cluster, work, headroom=headroom, allow_cross_node_tp=allow, order=order)
        if result.feasible:
            rate = float(np.asarray(result.step.tokens_per_s_per_gpu)[0]) * n
            if tokens / rate / 86400 <= days:
                return n
        n *= 2
    raise ValueError(f"no fleet of up to {MAX_GPUS} {gpu} trains {tokens:.3g} tokens within {days} days")
