"""Memory reports: parameter counts, the training bill, the weights split, the serving bill."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from meshplan import io
from meshplan.core.memory import state_bytes_per_param
from meshplan.core.params import count_params
from meshplan.core.serving import kv_bytes_per_token_total, min_gpus, serving_bill, weights_bytes_total
from meshplan.core.terms import explain
from meshplan.core.training import training_memory
from meshplan.render import jsonable
from meshplan.reports.conditions import workload_kwargs
from meshplan.reports.inputs import (
    FinetuneRequest,
    LayoutRequest,
    choice,
    finetune_fields,
    layout_dict,
    resolve_finetune,
    resolve_layout,
    resolve_workload,
)
from meshplan.spec.cluster import GPU
from meshplan.spec.layout import Layout
from meshplan.spec.model import ModelSpec
from meshplan.units import DType


def memory_report(
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
    finetune: FinetuneRequest | None = None,
    conditions: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``meshplan memory``: the per-GPU training bill of every pipeline stage.

    ``conditions`` holds the conditions group's raw values (``stack`` and each condition; None: unset);
    precision, attention and kernels left None come from the stack, else from the schema's defaults."""
    spec = io.load_model(model) if isinstance(model, str) else model
    gpu_spec = io.load_gpu(gpu)
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
    mem = training_memory(spec, lay, work, gpu=gpu_spec)
    return {
        "model": spec.name,
        "gpu": gpu_spec.name,
        "gpus": gpus,
        "seq": work.seq_len,
        "global_batch": work.global_batch,
        "precision": work.precision.name,
        **finetune_fields(spec, work.finetune),
        "layout": layout_dict(lay),
        "per_gpu": jsonable(mem.per_gpu.as_dict()),
        "heaviest_stage": mem.heaviest_stage,
        "hbm_bytes_per_gpu": gpu_spec.hbm_bytes,
        "free_bytes_per_gpu": mem.free_bytes,
        "fits": mem.fits,
        **shown,
        "stages": [jsonable(s.as_dict()) for s in mem.stages],
        "terms": explain(mem.per_gpu),
    }


def fit_report(
    model: ModelSpec | str,
    *,
    gpu: str,
    gpus: int,
    dtype: str = "bf16",
    finetune: FinetuneRequest | None = None,
    seq: int = 4096,
    precision: str = "bf16",
) -> dict[str, Any]:
    """``meshplan fit``: the weights-split playground, weights spread evenly over ``gpus``.

    With ``finetune``, also the largest micro-batch at ``seq`` and the longest sequence at micro-batch 1 that
    fit, with and without full recompute, on FSDP over every GPU (ZeRO-3 over the frozen base, the common
    way to fine-tune on a few GPUs).
    """
    spec = io.load_model(model) if isinstance(model, str) else model
    gpu_spec = io.load_gpu(gpu)
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    total = weights_bytes_total(spec, choice(DType, dtype, "dtype"))
    per_gpu = total / gpus
    per_param = state_bytes_per_param(spec, resolve_workload(layout=Layout(), seq=seq, precision=precision))
    state = count_params(spec).total * per_param
    out: dict[str, Any] = {
        "model": spec.name,
        "gpu": gpu_spec.name,
        "gpus": gpus,
        "dtype": dtype,
        "weights_bytes_total": total,
        "weights_bytes_per_gpu_even_split": per_gpu,
        "hbm_bytes_per_gpu": gpu_spec.hbm_bytes,
        "hbm_fraction_per_gpu": per_gpu / gpu_spec.hbm_bytes,
        "free_bytes_per_gpu": gpu_spec.hbm_bytes - per_gpu,
        "free_bytes_total": gpus * (gpu_spec.hbm_bytes - per_gpu),
        "fits": per_gpu <= gpu_spec.hbm_bytes,
        "min_gpus_for_weights": min_gpus(total, gpu_spec.hbm_bytes),
        "training_state_bytes_per_param": per_param,
        "training_state_bytes_total": state,
        "min_gpus_for_training": min_gpus(state, gpu_spec.hbm_bytes),
    }
    if finetune is not None:
        out |= _fit_finetune(spec, gpu_spec, gpus=gpus, req=finetune, seq=seq, precision=precision)
    return out


LIMIT_MICRO_BATCH = 4096
LIMIT_SEQ = 1 << 22


def _largest(fits: Callable[[int], bool], limit: int) -> int:
    """The largest n in [1, limit] with fits(n), for fits monotone (0 when even 1 does not fit)."""
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _fit_finetune(
    spec: ModelSpec, gpu: GPU, *, gpus: int, req: FinetuneRequest, seq: int, precision: str
) -> dict[str, Any]:
    ft = resolve_finetune(req, spec)
    zero = 3 if gpus > 1 else 0
    out: dict[str, Any] = finetune_fields(spec, ft) | {"seq": seq, "layout": {"dp_shard": gpus, "zero": zero}}

    def fits(mb: int, s: int, recompute: str) -> bool:
        lay = resolve_layout(LayoutRequest(zero=zero, recompute=recompute, micro_batch=mb), gpus=gpus)
        work = resolve_workload(layout=lay, seq=s, global_batch=mb * lay.dp, precision=precision, finetune=ft)
        return training_memory(spec, lay, work, gpu=gpu).fits

    for recompute, suffix in (("none", ""), ("full", "_with_recompute")):
        out[f"max_micro_batch{suffix}"] = _largest(
            functools.partial(fits, s=seq, recompute=recompute), LIMIT_MICRO_BATCH
        )
        out[f"max_seq_len{suffix}"] = _largest(functools.partial(fits, 1, recompute=recompute), LIMIT_SEQ)
    return out


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
        weight_dtype=choice(DType, dtype, "dtype"),
        kv_dtype=choice(DType, kv_dtype, "kv dtype"),
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
        "kv_bytes_per_token_per_gpu": bill.kv_bytes_per_token,
        "kv_bytes_per_token_total": kv_bytes_per_token_total(spec, kv_dtype=choice(DType, kv_dtype, "kv dtype")),
        "kv_bytes_per_sequence_per_gpu": bill.kv_bytes_per_sequence,
        "activations_bytes_per_gpu": bill.activations_bytes,
        "framework_bytes_per_gpu": bill.framework_bytes,
        "usable_bytes_per_gpu": bill.usable_bytes,
        "kv_budget_bytes_per_gpu": bill.kv_budget_bytes,
        "kv_capacity_tokens_per_replica": bill.kv_capacity_tokens,
        "max_concurrent_sequences_total": bill.max_concurrent_sequences * replicas,
        "max_concurrent_sequences_per_replica": bill.max_concurrent_sequences,
        "fits": bill.fits,
    }
