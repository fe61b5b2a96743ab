"""Step-time reports: ``meshplan estimate`` and ``meshplan collectives``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshplan import io
from meshplan.core.comm.cost import BUS_FACTOR_DOC, Collective, bus_factor, ring_time
from meshplan.core.memory.pressure import PRESSURE_BAND_P90, hbm_pressure, near_capacity
from meshplan.core.memory.terms import explain
from meshplan.core.placement import AxisPlacement
from meshplan.core.plan import Plan, evaluate
from meshplan.core.time.compute import resolved_attention
from meshplan.core.time.flops import MFU_CONVENTION
from meshplan.core.time.host import launch_of
from meshplan.render import jsonable
from meshplan.reports.conditions import workload_kwargs
from meshplan.reports.cost import CostRequest, estimate_costs, never_finishes_warning
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
from meshplan.reports.novelty import mix_of, unseen
from meshplan.reports.published_range import mfu_check
from meshplan.reports.routing_note import routing_note
from meshplan.reports.timeline import timeline_dict
from meshplan.spec.cluster import Cluster
from meshplan.spec.model import ModelSpec
from meshplan.spec.profile import fitted_band
from meshplan.units import SECONDS_PER_DAY, SECONDS_PER_HOUR

STRATEGY_EXPOSED = {
    "tp": "exposed_tp_s",
    "sp": "exposed_tp_s",
    "cp": "exposed_cp_s",
    "ep": "exposed_ep_s",
    "etp": "exposed_ep_s",
    "pp": "exposed_pp_s",
    "dp": "exposed_dp_s",
    "dp-experts": "exposed_dp_s",
}


def _collectives(plan: Plan) -> list[dict[str, Any]]:
    """Each collective of a middle stage's GPU, with its share of its strategy's exposed time."""
    step = plan.step
    totals: dict[str, float] = {}
    for c in plan.collectives:
        totals[STRATEGY_EXPOSED[c.strategy]] = totals.get(STRATEGY_EXPOSED[c.strategy], 0.0) + float(c.time_s)
    out = []
    for c in plan.collectives:
        key = STRATEGY_EXPOSED[c.strategy]
        share = float(getattr(step, key)) / totals[key] if totals[key] > 0 else 0.0
        link = plan.cluster.scale_out if bool(c.outer > 1) else plan.cluster.scale_up
        out.append(
            {
                "strategy": c.strategy,
                "op": c.op.value,
                "axis": c.axis,
                "phase": c.phase,
                "group_size": int(c.group_size),
                "size_bytes_per_call": float(c.size_bytes),
                "count_per_step": float(c.count_per_step),
                "link": link.name,
                "crosses_fabric": bool(c.outer > 1),
                "time_s_per_step": float(c.time_s),
                "exposed_s_per_step": min(float(c.time_s), float(c.time_s) * share),
            }
        )
    return out


def placement_dict(placement: dict[str, AxisPlacement], cluster: Cluster) -> dict[str, Any]:
    """Each parallel axis of a layout: its size, stride, how it sits in the scale-up domains, and its link; the
    experts' TP group (``etp``) only where it is not the TP group itself."""
    out = {}
    for axis, p in placement.items():
        if int(p.size) == 1 or (axis == "etp" and int(p.size) == int(placement["tp"].size)):
            continue
        crosses = bool(p.outer > 1)
        out[axis] = {
            "size": int(p.size),
            "stride": int(p.stride),
            "inside_domain": int(p.inner),
            "domains": int(p.outer),
            "link": (cluster.scale_out if crosses else cluster.scale_up).name,
            "crosses_fabric": crosses,
        }
    return out


def evaluated_plan_dict(plan: Plan, *, tokens: float | None = None) -> dict[str, Any]:
    """The JSON of one evaluated layout: memory keys, step time, MFU, collectives, placement."""
    step, mem = plan.step, plan.memory
    out: dict[str, Any] = {
        "model": plan.model.name,
        "gpu": plan.cluster.gpu.name,
        "gpus": plan.cluster.num_gpus,
        "seq": plan.workload.seq_len,
        "global_batch": plan.workload.global_batch,
        "precision": plan.workload.precision.name,
        **finetune_fields(plan.model, plan.workload.finetune),
        "layout": layout_dict(plan.layout),
        "per_gpu": jsonable(mem.per_gpu.as_dict()),
        "heaviest_stage": mem.heaviest_stage,
        "hbm_bytes_per_gpu": mem.hbm_bytes,
        "free_bytes_per_gpu": mem.free_bytes,
        "hbm_pressure": float(hbm_pressure(mem.per_gpu.total_bytes, mem.hbm_bytes)),
        "fits": mem.fits,
        "stages": [jsonable(s.as_dict()) for s in mem.stages],
        "terms": explain(mem.per_gpu),
        "step_time_s": float(step.step_time_s),
        "mfu": float(step.mfu),
        "hfu": float(step.hfu),
        "mfu_fp8_peak": None if step.mfu_fp8_peak is None else float(step.mfu_fp8_peak),
        "mfu_convention": MFU_CONVENTION,
        "tokens_per_s_per_gpu": float(step.tokens_per_s_per_gpu),
        "attention_kernel": resolved_attention(plan.workload, plan.cluster.gpu.calibration),
        "breakdown": {
            "compute_s": float(step.compute_s),
            "exposed_comm_s": float(step.exposed_comm_s),
            "bubble_s": float(step.bubble_s),
            "optimizer_s": float(step.optimizer_s),
            "host_s": float(step.host_s),
            "exposed_tp_s": float(step.exposed_tp_s),
            "exposed_cp_s": float(step.exposed_cp_s),
            "exposed_ep_s": float(step.exposed_ep_s),
            "exposed_pp_s": float(step.exposed_pp_s),
            "exposed_dp_s": float(step.exposed_dp_s),
        },
        "host": host_dict(plan),
        "collectives": _collectives(plan),
        "placement": placement_dict(plan.placement, plan.cluster),
        "axis_order": list(plan.order),
        "warnings": plan.warnings(),
    }
    moe = plan.model.moe is not None
    dtype = plan.workload.precision.compute
    lay = plan.layout
    out["published_mfu"], beyond = mfu_check(out["mfu"], gpu=out["gpu"], cp=lay.cp, ep=lay.ep, moe=moe, dtype=dtype)
    out["warnings"] += beyond + routing_note(plan)
    if tokens is not None and not 1 <= tokens <= 1e16:  # also refuses NaN and infinities
        raise ValueError(f"tokens must be between 1 and 1e16, got {tokens:g}")
    if tokens:
        seconds = tokens / (float(step.tokens_per_s_per_gpu) * plan.cluster.num_gpus)
        out["time_to_train"] = {
            "tokens_total": tokens,
            "wall_time_days": seconds / SECONDS_PER_DAY,
            "gpu_hours_total": seconds * plan.cluster.num_gpus / SECONDS_PER_HOUR,
        }
    return out


def host_dict(plan: Plan) -> dict[str, Any]:
    """The host floor of the layout: how its layers' kernels are launched, the host's and the GPU's seconds for one
    layer and micro-batch (all passes), and whether the host sets the pace (core/time/host.py)."""
    step, work = plan.step, plan.workload
    return {
        "launch": launch_of(work.conditions.launch, kernels=work.kernels, framework=work.framework).value,
        "bound": bool(step.host_layer_s > step.gpu_layer_s),
        "host_s_per_layer": float(step.host_layer_s),
        "gpu_s_per_layer": float(step.gpu_layer_s),
    }


def estimate_report(
    model: ModelSpec | str,
    *,
    gpu: str,
    gpus: int,
    layout: LayoutRequest,
    seq: int = 4096,
    global_batch: int | None = None,
    precision: str | None = None,
    optimizer: str = "adamw",
    optimizer_bytes: float | None = None,
    attention: str | None = None,
    kernels: str | None = None,
    node_size: int | None = None,
    scale_out: str | None = None,
    axis_order: str | None = None,
    tokens: float | None = None,
    finetune: FinetuneRequest | None = None,
    conditions: Mapping[str, Any] | None = None,
    scale_out_bandwidth: float | None = None,
    nics_per_node: int | None = None,
    oversubscription: float | None = None,
    profile: str | None = None,
    cost: CostRequest | None = None,
    timeline: bool = False,
) -> dict[str, Any]:
    """``meshplan estimate``: memory, collectives, placement and step time of one layout (``conditions``: the
    stack and condition fields as given, None where unset; see ``memory_report``; ``cost``: the price, checkpoint
    and failure fields, whose keys reports/cost.py adds; ``timeline``: adds the step drawn stage by stage,
    reports/timeline.py)."""
    spec = io.load_model(model) if isinstance(model, str) else model
    cluster = resolve_cluster(
        gpu=gpu,
        gpus=gpus,
        node_size=node_size,
        scale_out=scale_out,
        scale_out_bandwidth=scale_out_bandwidth,
        nics_per_node=nics_per_node,
        oversubscription=oversubscription,
        profile=profile,
    )
    lay = resolve_layout(layout, gpus=gpus)
    set_by, shown = workload_kwargs(conditions, precision=precision, attention=attention, kernels=kernels)
    work = resolve_workload(
        layout=lay,
        seq=seq,
        global_batch=global_batch,
        optimizer=optimizer,
        optimizer_bytes=optimizer_bytes,
        finetune=resolve_finetune(finetune, spec) if finetune else None,
        **set_by,
    )
    plan = evaluate(spec, cluster, lay, work, order=resolve_order(axis_order))
    out = evaluated_plan_dict(plan, tokens=tokens) | shown
    out |= estimate_costs(spec, work, cluster, out, tokens=tokens, req=cost)
    out["warnings"] = [*out["warnings"], *band_warning(lay.cp, lay.ep), *gpu_warning(cluster.gpu.name, profile)]
    out["warnings"] += never_finishes_warning(out)
    if timeline:
        out["timeline"] = timeline_dict(plan)
    band = uncertainty(
        float(plan.step.step_time_s),
        profile,
        cp=lay.cp,
        ep=lay.ep,
        gpu=cluster.gpu.name,
        tp=lay.tp,
        pp=lay.pp,
        stack=out.get("stack"),
    )
    return out | widen_for_pressure(band, out["hbm_pressure"])


def widen_for_pressure(band: dict[str, Any], pressure: float) -> dict[str, Any]:
    """The band of a layout past ``PRESSURE_SHARE`` of HBM, its P90 widened by ``PRESSURE_BAND_P90``: allocator
    retries near capacity slow a step by an amount the bill cannot follow (core/memory/pressure.py)."""
    if not near_capacity(pressure):
        return band
    return band | {
        "step_time_s_p90": band["step_time_s_p90"] * PRESSURE_BAND_P90,
        "uncertainty": f"{band['uncertainty']}; its P90 widened by {PRESSURE_BAND_P90 - 1:.0%} as the layout fills "
        f"{pressure:.0%} of HBM (allocator retries near capacity)",
    }


BAND_CLASSES = {"cp": "context parallelism", "ep": "expert parallelism"}
"""Layouts whose held-out runs have a bias of their own, each with its own band (catalog/held_out.toml's
``<axis>_`` keys), and how the reports name them. A published run counts in the first whose degree is above 1
(``band_class``: a run with both is one of the CP runs); a layout to predict takes the band of every class it
belongs to (``band_classes``), and one with both CP and EP the band covering both classes' bands: from the lower of
the two P10 to the higher of the two P90 (the wider of the two where one holds the other, as the EP band of
catalog/held_out.toml holds the CP band), so that neither class's runs fall outside it more often than outside
their own band."""


def band_class(*, cp: int, ep: int) -> str | None:
    """The band class a published run of these degrees counts in (``BAND_CLASSES``), or None."""
    degrees = {"cp": cp, "ep": ep}
    return next((axis for axis in BAND_CLASSES if int(degrees[axis]) > 1), None)


def band_classes(*, cp: int, ep: int) -> tuple[str, ...]:
    """Every band class a layout of these degrees belongs to and that catalog/held_out.toml has runs of."""
    degrees, band = {"cp": cp, "ep": ep}, io.held_out_band()
    return tuple(axis for axis in BAND_CLASSES if int(degrees[axis]) > 1 and f"{axis}_runs" in band)


def uncertainty(
    step_time_s: float,
    profile: str | None,
    *,
    cp: int = 1,
    ep: int = 1,
    gpu: str | None = None,
    tp: int | None = None,
    pp: int | None = None,
    stack: str | None = None,
) -> dict[str, Any]:
    """The step time's P10-P90 band: a fitted profile's own (its runs each predicted with the profile fitted on
    the others), else the held-out errors of the published runs (catalog/held_out.toml), where a layout with
    context parallelism (``cp`` > 1) or expert parallelism (``ep`` > 1) takes the band of the published runs of
    its kind, and one with both the band covering the two (``BAND_CLASSES``; ``step_time_band_sources`` is then
    the fewer of their sources). A layout whose ``gpu`` kind, ``stack`` or parallelism mix (``tp``, ``pp``, ``cp``,
    ``ep``; checked when ``tp`` and ``pp`` are given) no published run used takes at least the range of every
    held-out run (reports/novelty.py; validation/band.py step 4), and says what was not seen."""
    own = fitted_band(profile)
    if own is not None:
        return {
            "step_time_s_p10": own.p10 * step_time_s,
            "step_time_s_p90": own.p90 * step_time_s,
            "step_time_band_sources": None,
            "uncertainty": f"P10-P90 of measured over predicted step time on the profile's {own.runs} runs, each "
            "predicted with the profile fitted without it",
        }
    band = io.held_out_band()
    axes: tuple[str | None, ...] = band_classes(cp=cp, ep=ep) or (None,)
    prefixes = [f"{axis}_" if axis else "" for axis in axes]
    lo = min(band[f"{prefix}time_ratio_p10"] for prefix in prefixes) * step_time_s
    hi = max(band[f"{prefix}time_ratio_p90"] for prefix in prefixes) * step_time_s
    sources = min(int(band[f"{prefix}sources"]) for prefix in prefixes)
    mix = None if tp is None or pp is None else mix_of(tp=tp, pp=pp, cp=cp, ep=ep)
    novel = unseen(gpu=gpu, stack=stack, mix=mix) if "unseen_time_ratio_p10" in band else []
    if novel:
        lo = min(lo, band["unseen_time_ratio_p10"] * step_time_s)
        hi = max(hi, band["unseen_time_ratio_p90"] * step_time_s)
        sources = int(band["sources"])
    which = " and on ".join(
        f"{int(band[f'{prefix}runs'])} published runs"
        + (f" with {BAND_CLASSES[axis]}" if axis else "")
        + (f" of {int(band[f'{prefix}sources'])} sources" if len(axes) > 1 else "")
        for axis, prefix in zip(axes, prefixes, strict=True)
    )
    return {
        "step_time_s_p10": lo,
        "step_time_s_p90": hi,
        "step_time_band_sources": sources,
        "uncertainty": (
            f"P10-P90 for a source never seen, from measured over predicted step time on {which} of "
            f"{sources} sources, each source weighing the same and predicted with constants fitted without it"
            if len(axes) == 1
            else "P10-P90 for a source never seen, covering two bands (the lower of their P10, the higher of their "
            f"P90), from measured over predicted step time on {which}, each source weighing the same and predicted "
            "with constants fitted without it"
        )
        + (
            ""
            if all(band[f"{prefix}promised"] for prefix in prefixes)
            else "; too few sources for that promise: the range of their runs"
        )
        + ("; the profile has no band of its own (meshplan calibrate writes one in its file)" if profile else "")
        + (
            f"; widened to the range of every held-out run of the {int(band['sources'])} sources "
            f"({band['unseen_time_ratio_p10']:.2f}x-{band['unseen_time_ratio_p90']:.2f}x), as no published run used "
            + " or ".join(novel)
            if novel
            else f"; none of them ran on {gpu}"
            if gpu is not None and gpu not in io.published_runs_by_gpu()
            else ""
        ),
    }


def gpu_warning(gpu: str, profile: str | None = None) -> list[str]:
    """What the published runs say of a GPU kind none of them ran on (nothing when a cluster profile is given:
    its scales are the user's own cluster's)."""
    ran_on = io.published_runs_by_gpu()
    if gpu in ran_on or profile:
        return []
    return [
        f"{gpu}: none of the {sum(ran_on.values())} published training runs meshplan is checked against ran on "
        f"this GPU kind (they ran on {', '.join(ran_on)}): its constants come from its datasheet, kernel "
        "benchmarks and the kinds it shares a die with (its catalog file's sources), unchecked on its own runs, "
        "and the step-time band is those kinds' errors, widened to the range of every held-out run; "
        "`meshplan calibrate` fits a profile "
        "from runs measured on it"
    ]


def band_warning(cp: int, ep: int = 1) -> list[str]:
    """What the held-out runs say of a layout with context (or expert) parallelism, for each class it belongs to:
    whether the model has run fast (median ratio above 1) or slow on them."""
    band, axes = io.held_out_band(), band_classes(cp=cp, ep=ep)
    whose = "theirs" if len(axes) == 1 else "the one covering the CP and the EP runs' bands"
    return [
        f"{BAND_CLASSES[axis]}: held out, the {int(band[f'{axis}_runs'])} published runs with "
        f"{axis.upper()} ({int(band[f'{axis}_sources'])} sources) took a median "
        f"{band[f'{axis}_time_ratio_p50']:.2f}x their predicted step time (band "
        f"{band[f'{axis}_time_ratio_p10']:.2f}x-{band[f'{axis}_time_ratio_p90']:.2f}x"
        + ("" if band[f"{axis}_promised"] else ", every held-out run's range: too few sources for their own")
        + f"): this step time is likely "
        f"{'optimistic' if band[f'{axis}_time_ratio_p50'] > 1 else 'pessimistic'}, and its band is "
        + (whose if band[f"{axis}_promised"] or len(axes) > 1 else "that range")
        for axis in axes
    ]


WALL_LINKS = ("nvlink5", "nvlink4", "ib-ndr", "eth-100g")


def collectives_report(
    *,
    model: str | None = None,
    size_bytes: float | None = None,
    group: int = 8,
    seq: int = 8192,
    micro_batch: int = 1,
    links: tuple[str, ...] = WALL_LINKS,
) -> dict[str, Any]:
    """The bandwidth wall: one ring all-reduce over each link, as times and as ratios to the fastest.

    Without ``size_bytes`` the buffer is one TP all-reduce of ``model``'s activations (s b h, 16-bit).
    """
    if group < 2:
        raise ValueError(f"group must be >= 2 ranks, got {group}")
    spec = io.load_model(model or "llama-3.1-70b")
    size = size_bytes if size_bytes is not None else seq * micro_batch * spec.hidden * 2.0
    if not 1 <= size <= 1e13:  # one byte to 10 TB; also refuses NaN and infinities
        raise ValueError(f"size must be between 1 byte and 1e13 bytes, got {size:g}")
    rows = []
    for name in links:
        link = io.load_link(name)
        wire = bus_factor(Collective.ALL_REDUCE, group) * size / link.bandwidth_bytes_per_s
        modeled = ring_time(
            Collective.ALL_REDUCE,
            size_bytes=size,
            n=group,
            bandwidth_bytes_per_s=link.effective_bytes_per_s,
            latency_s=link.latency_s,
        )
        rows.append(
            {
                "link": name,
                "tier": link.tier.value,
                "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
                "bandwidth_only_s": wire,
                "modeled_s": float(modeled),
            }
        )
    fastest = min(r["bandwidth_only_s"] for r in rows)
    fastest_modeled = min(r["modeled_s"] for r in rows)
    for r in rows:
        r["ratio_bandwidth_only"] = r["bandwidth_only_s"] / fastest
        r["ratio_modeled"] = r["modeled_s"] / fastest_modeled
    per_layer = 2
    return {
        "model": spec.name,
        "op": Collective.ALL_REDUCE.value,
        "bus_factor": BUS_FACTOR_DOC[Collective.ALL_REDUCE],
        "group_size": group,
        "size_bytes": size,
        "links": rows,
        "tp_collectives_per_forward": per_layer * spec.num_layers,
        "tp_collectives_per_step_per_micro_batch": 2 * per_layer * spec.num_layers,
        "note": "bandwidth_only: bus bytes over nominal per-direction bandwidth; modeled: with link efficiency and "
        "per-step latency (alpha-beta ring).",
    }
