"""Days, dollars and goodput: the ``cost``, ``checkpoint`` and ``goodput`` keys of ``estimate`` and ``plan``, and
``serve``'s cost per million output tokens (the formulas: core/goodput.py; docs/formulas.md, section 11)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshplan.core import goodput as gp
from meshplan.core.finetune import trainable_params
from meshplan.core.memory.bill import moment_bytes_per_param
from meshplan.core.params import count_params
from meshplan.spec.cluster import Cluster
from meshplan.spec.model import ModelSpec
from meshplan.spec.requests import Group, field, group
from meshplan.spec.schema.cost import RESTART_MINUTES
from meshplan.spec.workload import Workload
from meshplan.units import GB, SECONDS_PER_DAY, SECONDS_PER_HOUR

MILLION = 1e6


@dataclass(frozen=True, slots=True, kw_only=True)
class CostRequest:
    """The cost and goodput fields as given (spec/schema/cost.py): None where unset."""

    price_per_gpu_hour: float | None = None
    mtbf_gpu_hours: float | None = None
    checkpoint_bandwidth: float | None = None
    """GB/s each node writes."""
    checkpoint_interval: int | None = None
    """Steps between saves."""
    checkpoint_interval_minutes: float | None = None
    restart_minutes: float = RESTART_MINUTES

    def __post_init__(self) -> None:
        for name in (f.name for f in group(Group.COST)):
            field(name).check(getattr(self, name))
        if self.checkpoint_interval is not None and self.checkpoint_interval_minutes is not None:
            raise ValueError("give --checkpoint-interval (steps) or --checkpoint-interval-minutes, not both")
        if self.mtbf_gpu_hours is not None and self.checkpoint_bandwidth is None:
            raise ValueError(
                "--mtbf-gpu-hours needs --checkpoint-bandwidth (GB/s per node): a save's time sets the checkpoint "
                "interval and what it costs"
            )
        interval = self.checkpoint_interval is not None or self.checkpoint_interval_minutes is not None
        if interval and self.mtbf_gpu_hours is None:
            raise ValueError(
                "a checkpoint interval sets the goodput: give --mtbf-gpu-hours (and --checkpoint-bandwidth)"
            )

    @property
    def asked(self) -> bool:
        """Whether any key of this module is asked for."""
        return self.price_per_gpu_hour is not None or self.checkpoint_bandwidth is not None


def cost_request(values: Mapping[str, Any]) -> CostRequest:
    """The request from schema values by name (a missing or None restart time takes the default)."""
    given: dict[str, Any] = {f.name: values.get(f.name) for f in group(Group.COST)}
    if given["restart_minutes"] is None:
        given["restart_minutes"] = RESTART_MINUTES
    return CostRequest(**given)


def checkpoint_dict(model: ModelSpec, work: Workload, cluster: Cluster, req: CostRequest) -> dict[str, Any] | None:
    """One checkpoint of the whole model and its save time on this fleet (None without a bandwidth): weights of
    every parameter (of the adapters alone under LoRA / QLoRA: the base is the published checkpoint) and the
    optimizer state, master copy and moments, of the trained ones."""
    if req.checkpoint_bandwidth is None:
        return None
    prec, trained = work.precision, trainable_params(model, work.finetune).trainable
    saved = trained if work.finetune.adapted else count_params(model).total
    optimizer = prec.master_bytes + moment_bytes_per_param(model, work)
    total = gp.checkpoint_bytes(
        saved_params=saved, trained_params=trained, weight_bytes=prec.weight_bytes, optimizer_bytes_per_param=optimizer
    )
    nodes = math.ceil(cluster.num_gpus / cluster.gpu.gpus_per_node)
    bandwidth = req.checkpoint_bandwidth * GB
    return {
        "bytes_total": total,
        "bytes_per_gpu": total / cluster.num_gpus,
        "weight_bytes_per_param": prec.weight_bytes,
        "optimizer_bytes_per_param": optimizer,
        "bandwidth_bytes_per_s_per_node": bandwidth,
        "nodes": nodes,
        "save_s": gp.save_time_s(total, bandwidth_bytes_per_s_per_node=bandwidth, nodes=nodes),
    }


def _train_s(tokens: float, tokens_per_s_per_gpu: float, gpus: int) -> float:
    return tokens / (tokens_per_s_per_gpu * gpus)


def cost_dict(tokens_per_s_per_gpu: float, gpus: int, tokens: float | None, req: CostRequest) -> dict[str, Any]:
    """The ``cost`` key (with a price; failures not counted): per million tokens trained, and in total."""
    if req.price_per_gpu_hour is None:
        return {}
    price = req.price_per_gpu_hour
    out = {
        "price_per_gpu_hour": price,
        "cost_per_million_tokens": price * MILLION / (tokens_per_s_per_gpu * SECONDS_PER_HOUR),
    }
    if tokens:
        out["cost_total"] = price * _train_s(tokens, tokens_per_s_per_gpu, gpus) * gpus / SECONDS_PER_HOUR
    return {"cost": out}


def interval_s(step_time_s: float, save_s: float, mtbf_s: float, req: CostRequest) -> tuple[float, str]:
    """The training time between saves, and where it came from: the steps or minutes given, else the Young/Daly
    optimum rounded to whole steps (one at least)."""
    if req.checkpoint_interval is not None:
        return req.checkpoint_interval * step_time_s, "steps given"
    if req.checkpoint_interval_minutes is not None:
        return req.checkpoint_interval_minutes * 60.0, "minutes given"
    steps = max(1, round(gp.young_daly_interval_s(save_s, mtbf_s) / step_time_s))
    return steps * step_time_s, "Young/Daly optimum"


def goodput_dict(
    *,
    step_time_s: float,
    tokens_per_s_per_gpu: float,
    gpus: int,
    checkpoint: Mapping[str, Any] | None,
    tokens: float | None,
    req: CostRequest,
) -> dict[str, Any]:
    """The ``goodput`` key (with an MTBF): the job's failures, the checkpoint interval and what both cost; with
    ``tokens``, the wall time, GPU-hours and cost to train with failures paid (None where it never finishes)."""
    if req.mtbf_gpu_hours is None:
        return {}
    assert checkpoint is not None  # CostRequest requires a bandwidth with an MTBF
    mtbf_s, save_s = gp.job_mtbf_s(req.mtbf_gpu_hours, gpus), float(checkpoint["save_s"])
    tau, source = interval_s(step_time_s, save_s, mtbf_s, req)
    g = gp.goodput(mtbf_s=mtbf_s, save_s=save_s, interval_s=tau, restart_s=req.restart_minutes * 60.0)
    out: dict[str, Any] = {
        "mtbf_gpu_hours": req.mtbf_gpu_hours,
        "job_mtbf_hours": mtbf_s / SECONDS_PER_HOUR,
        "restart_s": g.restart_s,
        "interval_s": tau,
        "interval_steps": tau / step_time_s,
        "interval_source": source,
        "optimal_interval_s": gp.young_daly_interval_s(save_s, mtbf_s),
        "waste_s_per_failure": g.waste_per_failure_s,
        "checkpoint_overhead_fraction": g.checkpoint_overhead,
        "failure_overhead_fraction": g.failure_overhead,
        "goodput_fraction": g.fraction,
    }
    if tokens:
        train_s = _train_s(tokens, tokens_per_s_per_gpu, gpus)
        wall = g.wall_s(train_s) if g.finishes else None
        out |= {
            "wall_time_days": None if wall is None else wall / SECONDS_PER_DAY,
            "gpu_hours_total": None if wall is None else wall * gpus / SECONDS_PER_HOUR,
            "failures_total": None if wall is None else g.failures(train_s),
        }
        if req.price_per_gpu_hour is not None:
            out["cost_total"] = None if wall is None else req.price_per_gpu_hour * wall * gpus / SECONDS_PER_HOUR
    return {"goodput": out}


def layout_costs(
    *,
    step_time_s: float,
    tokens_per_s_per_gpu: float,
    gpus: int,
    checkpoint: Mapping[str, Any] | None,
    tokens: float | None,
    req: CostRequest,
) -> dict[str, Any]:
    """The ``cost`` and ``goodput`` keys of one layout (each only when asked for)."""
    return cost_dict(tokens_per_s_per_gpu, gpus, tokens, req) | goodput_dict(
        step_time_s=step_time_s,
        tokens_per_s_per_gpu=tokens_per_s_per_gpu,
        gpus=gpus,
        checkpoint=checkpoint,
        tokens=tokens,
        req=req,
    )


def never_finishes_warning(report: Mapping[str, Any]) -> list[str]:
    """What a goodput of 0 means, in words (nothing otherwise)."""
    g = report.get("goodput")
    if g is None or g["goodput_fraction"] > 0:
        return []
    return [
        f"failures: the job fails every {g['job_mtbf_hours']:.3g} h but each failure wastes "
        f"{g['waste_s_per_failure'] / SECONDS_PER_HOUR:.3g} h (restart plus half the checkpoint interval): it "
        "never finishes; checkpoint more often, restart faster or use fewer GPUs"
    ]


def estimate_costs(
    model: ModelSpec,
    work: Workload,
    cluster: Cluster,
    report: Mapping[str, Any],
    *,
    tokens: float | None,
    req: CostRequest | None,
) -> dict[str, Any]:
    """``estimate``'s ``checkpoint``, ``cost`` and ``goodput`` keys for its ``report`` (nothing unless asked
    for)."""
    if req is None or not req.asked:
        return {}
    checkpoint = checkpoint_dict(model, work, cluster, req)
    costs = layout_costs(
        step_time_s=float(report["step_time_s"]),
        tokens_per_s_per_gpu=float(report["tokens_per_s_per_gpu"]),
        gpus=cluster.num_gpus,
        checkpoint=checkpoint,
        tokens=tokens,
        req=req,
    )
    return ({"checkpoint": checkpoint} if checkpoint is not None else {}) | costs


def serve_cost(report: Mapping[str, Any], price_per_gpu_hour: float | None) -> dict[str, Any]:
    """``serve``'s ``cost`` key: the fleet's GPU-hours per million output tokens at the load asked for, priced:
    price x GPUs / (output tokens/s x 3600) x 1e6."""
    if price_per_gpu_hour is None:
        return {}
    field("price_per_gpu_hour").check(price_per_gpu_hour)
    rate = float(report["tokens_per_s_total"])
    per_million = price_per_gpu_hour * report["gpus"] / (rate * SECONDS_PER_HOUR) * MILLION if rate > 0 else None
    return {"cost": {"price_per_gpu_hour": price_per_gpu_hour, "cost_per_million_output_tokens": per_million}}
