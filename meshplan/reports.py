"""Reports: the JSON-shaped answers the CLI prints and the HTTP API returns.

One function per question. Both edges call these and nothing else, so a
number on a web page and the same number on the command line come from one
place. Inputs are names and plain values (as a user gives them); outputs are
plain dicts of JSON data whose keys are part of the command-line contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshplan import io
from meshplan.core.params import count_params
from meshplan.core.serving import min_gpus, serving_bill, weights_bytes_total
from meshplan.core.terms import explain
from meshplan.core.training import training_memory
from meshplan.render import jsonable
from meshplan.spec.layout import ContextParallel, Layout, Recompute, Schedule, ZeroStage
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import PRECISIONS, Attention, Optimizer, OptimizerKind, Workload
from meshplan.units import DType


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutRequest:
    """A layout as a user states it: unset data-parallel degrees are resolved from the GPU count."""

    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1
    dp_shard: int | None = None
    zero: int = 0
    sp: bool = False
    recompute: str = "none"
    schedule: str | None = None
    cp_kind: str = "ring"
    micro_batch: int = 1


def _choice(enum_type: Any, value: str, what: str) -> Any:
    key = value.strip().lower().replace("-", "_")
    aliases = {"1f1b": "one_f_one_b", "zb": "zero_bubble", "allgather": "all_gather"}
    key = aliases.get(key, key)
    for member in enum_type:
        if member.name.lower() == key:
            return member
    names = ", ".join(m.name.lower().replace("one_f_one_b", "1f1b") for m in enum_type)
    raise ValueError(f"unknown {what} {value!r} (choose from {names})")


def resolve_layout(req: LayoutRequest, *, gpus: int) -> Layout:
    """Turn a user's layout into resolved degrees; dp_replicate takes what is left of the GPUs."""
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    for name in ("tp", "pp", "cp", "vpp", "ep", "micro_batch"):
        if getattr(req, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(req, name)}")
    model_ranks = req.tp * req.pp * req.cp
    if gpus % model_ranks:
        raise ValueError(f"tp*pp*cp = {req.tp}*{req.pp}*{req.cp} = {model_ranks} does not divide gpus = {gpus}")
    data = gpus // model_ranks
    if req.zero not in (0, 1, 2, 3):
        raise ValueError(f"zero must be 0, 1, 2 or 3, got {req.zero}")
    dp_shard = req.dp_shard if req.dp_shard is not None else (data if req.zero else 1)
    if dp_shard < 1 or data % dp_shard:
        raise ValueError(f"dp_shard={dp_shard} must divide the data-parallel ranks gpus/(tp*pp*cp) = {data}")
    schedule = req.schedule or ("interleaved" if req.vpp > 1 else "1f1b")
    return Layout(
        tp=req.tp,
        pp=req.pp,
        vpp=req.vpp,
        cp=req.cp,
        ep=req.ep,
        dp_shard=dp_shard,
        dp_replicate=data // dp_shard,
        sp=req.sp,
        zero=ZeroStage(req.zero),
        recompute=_choice(Recompute, req.recompute, "recompute"),
        schedule=_choice(Schedule, schedule, "schedule"),
        cp_kind=_choice(ContextParallel, req.cp_kind, "cp kind"),
        micro_batch=req.micro_batch,
    )


def resolve_workload(
    *,
    layout: Layout,
    seq: int,
    global_batch: int | None = None,
    precision: str = "bf16",
    optimizer: str = "adamw",
    optimizer_bytes: float | None = None,
    attention: str = "flash",
) -> Workload:
    """A workload; the global batch defaults to pp micro-batches per data-parallel rank (a full 1F1B pipeline)."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r} (choose from {', '.join(PRECISIONS)})")
    batch = global_batch if global_batch is not None else layout.micro_batch * layout.dp * layout.pp
    return Workload(
        seq_len=seq,
        global_batch=batch,
        precision=PRECISIONS[precision],
        optimizer=Optimizer(kind=_choice(OptimizerKind, optimizer, "optimizer"), state_bytes_per_param=optimizer_bytes),
        attention=_choice(Attention, attention, "attention"),
    )


def layout_dict(layout: Layout) -> dict[str, Any]:
    """The layout as the JSON contract names it."""
    return {
        "tp": layout.tp,
        "pp": layout.pp,
        "vpp": layout.vpp,
        "cp": layout.cp,
        "ep": layout.ep,
        "dp_shard": layout.dp_shard,
        "dp_replicate": layout.dp_replicate,
        "zero": int(layout.zero),
        "sp": layout.sp,
        "recompute": layout.recompute.name.lower(),
        "schedule": layout.schedule.name.lower().replace("one_f_one_b", "1f1b"),
        "cp_kind": layout.cp_kind.name.lower(),
        "micro_batch": layout.micro_batch,
    }


def params_report(model_name: str) -> dict[str, Any]:
    """``meshplan params``: exact counts by component."""
    model = io.load_model(model_name)
    p = count_params(model)
    return {
        "model": model.name,
        "total_params": p.total,
        "active_params_per_token": p.active_per_token,
        "by_component": p.by_component(),
        "mtp_params": p.mtp,
    }


def memory_report(
    model: ModelSpec | str,
    *,
    gpu: str,
    gpus: int,
    layout: LayoutRequest,
    seq: int = 4096,
    global_batch: int | None = None,
    precision: str = "bf16",
    optimizer: str = "adamw",
    optimizer_bytes: float | None = None,
    attention: str = "flash",
) -> dict[str, Any]:
    """``meshplan memory``: the per-GPU training bill of every pipeline stage."""
    spec = io.load_model(model) if isinstance(model, str) else model
    gpu_spec = io.load_gpu(gpu)
    lay = resolve_layout(layout, gpus=gpus)
    work = resolve_workload(
        layout=lay,
        seq=seq,
        global_batch=global_batch,
        precision=precision,
        optimizer=optimizer,
        optimizer_bytes=optimizer_bytes,
        attention=attention,
    )
    mem = training_memory(spec, lay, work, gpu=gpu_spec)
    return {
        "model": spec.name,
        "gpu": gpu_spec.name,
        "gpus": gpus,
        "seq": work.seq_len,
        "global_batch": work.global_batch,
        "precision": work.precision.name,
        "layout": layout_dict(lay),
        "per_gpu": jsonable(mem.per_gpu.as_dict()),
        "heaviest_stage": mem.heaviest_stage,
        "hbm_bytes": gpu_spec.hbm_bytes,
        "free_bytes": mem.free_bytes,
        "fits": mem.fits,
        "stages": [jsonable(s.as_dict()) for s in mem.stages],
        "terms": explain(mem.per_gpu),
    }


def fit_report(model: ModelSpec | str, *, gpu: str, gpus: int, dtype: str = "bf16") -> dict[str, Any]:
    """``meshplan fit``: the weights-split playground, weights spread evenly over ``gpus``."""
    spec = io.load_model(model) if isinstance(model, str) else model
    gpu_spec = io.load_gpu(gpu)
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    total = weights_bytes_total(spec, _choice(DType, dtype, "dtype"))
    per_gpu = total / gpus
    state = count_params(spec).total * 16.0  # bf16 weights and grads, fp32 master and Adam moments
    return {
        "model": spec.name,
        "gpu": gpu_spec.name,
        "gpus": gpus,
        "dtype": dtype,
        "weights_bytes_total": total,
        "weights_bytes_per_gpu": per_gpu,
        "hbm_bytes_per_gpu": gpu_spec.hbm_bytes,
        "hbm_fraction_per_gpu": per_gpu / gpu_spec.hbm_bytes,
        "free_bytes_per_gpu": gpu_spec.hbm_bytes - per_gpu,
        "free_bytes_total": gpus * (gpu_spec.hbm_bytes - per_gpu),
        "fits": per_gpu <= gpu_spec.hbm_bytes,
        "min_gpus_for_weights": min_gpus(total, gpu_spec.hbm_bytes),
        "training_state_bytes": state,
        "min_gpus_for_training": min_gpus(state, gpu_spec.hbm_bytes),
    }


def serving_report(
    model: ModelSpec | str,
    *,
    gpu: str,
    gpus: int,
    tp: int | None = None,
    pp: int = 1,
    ep: int = 1,
    dtype: str = "bf16",
    kv_dtype: str = "bf16",
    context: int | None = None,
    gpu_memory_utilization: float = 0.9,
) -> dict[str, Any]:
    """``meshplan serving``: weights, KV cache per token, and how many tokens and sequences fit."""
    spec = io.load_model(model) if isinstance(model, str) else model
    gpu_spec = io.load_gpu(gpu)
    tp = tp if tp is not None else gpus // pp
    if tp < 1 or pp < 1 or gpus % (tp * pp):
        raise ValueError(f"tp*pp = {tp}*{pp} must divide gpus = {gpus}")
    bill = serving_bill(
        spec,
        gpu=gpu_spec,
        tp=tp,
        pp=pp,
        ep=ep,
        weight_dtype=_choice(DType, dtype, "dtype"),
        kv_dtype=_choice(DType, kv_dtype, "kv dtype"),
        context=context,
        gpu_memory_utilization=gpu_memory_utilization,
    )
    replicas = gpus // (tp * pp)
    return {
        "model": spec.name,
        "gpu": gpu_spec.name,
        "gpus": gpus,
        "tp": tp,
        "pp": pp,
        "ep": ep,
        "replicas": replicas,
        "dtype": dtype,
        "kv_dtype": kv_dtype,
        "context": bill.context,
        "weights_bytes_per_gpu": bill.weights_bytes,
        "kv_bytes_per_token": bill.kv_bytes_per_token,
        "kv_bytes_per_sequence": bill.kv_bytes_per_sequence,
        "activations_bytes": bill.activations_bytes,
        "framework_bytes": bill.framework_bytes,
        "usable_bytes": bill.usable_bytes,
        "kv_budget_bytes": bill.kv_budget_bytes,
        "kv_capacity_tokens": bill.kv_capacity_tokens,
        "max_concurrent_sequences": bill.max_concurrent_sequences * replicas,
        "max_concurrent_sequences_per_replica": bill.max_concurrent_sequences,
        "fits": bill.fits,
    }
