"""Memory reports: parameter counts, the training bill, the weights split, the serving bill."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

from meshplan import io
from meshplan.core.memory.bill import state_bytes_per_param
from meshplan.core.memory.pressure import hbm_pressure, pressure_warning
from meshplan.core.memory.terms import explain
from meshplan.core.params import count_params
from meshplan.core.serving.bill import (
    EngineMemory,
    ServingBill,
    WeightSplit,
    fewest_weight_split,
    kv_bytes_per_token_total,
    lightest_weight_split,
    serving_bill,
    serving_tp_ok,
    weights_bytes_total,
)
from meshplan.core.training import training_memory
from meshplan.render import jsonable
from meshplan.reports.conditions import workload_kwargs
from meshplan.reports.inputs import (
    FinetuneRequest,
    LayoutRequest,
    choice,
    finetune_fields,
    layout_dict,
    resolve_cluster,
    resolve_finetune,
    resolve_layout,
    resolve_workload,
)
from meshplan.reports.plan_fleet import SearchRules, fewest_that_fit, fits_on, tried_json, variants
from meshplan.reports.serve_setup import published_dtype
from meshplan.spec.cluster import GPU, check_gpus
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
    check_gpus(gpus)
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
        "hbm_pressure": float(hbm_pressure(mem.per_gpu.total_bytes, gpu_spec.hbm_bytes)),
        "fits": mem.fits,
        "warnings": pressure_warning(float(hbm_pressure(mem.per_gpu.total_bytes, gpu_spec.hbm_bytes)), fits=mem.fits),
        **shown,
        "stages": [jsonable(s.as_dict()) for s in mem.stages],
        "terms": explain(mem.per_gpu),
    }


def fit_report(
    model: ModelSpec | str,
    *,
    gpu: str,
    gpus: int,
    dtype: str | None = None,
    finetune: FinetuneRequest | None = None,
    seq: int = 4096,
    precision: str | None = None,
    headroom: float = 0.10,
    kernels: str | None = None,
    conditions: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``meshplan fit``: the weights-split playground, weights spread evenly over ``gpus``.

    The verdict keeps ``headroom`` of HBM free, as the planner does. ``dtype`` left out is the dtype the model is
    published in (served as stored), bf16 under fine-tuning (a base trained beside its adapters); under QLoRA the
    weights are NF4 (the base is quantized whatever ``dtype`` says). The training state and the fine-tuning bills
    are the stack's (``conditions``: ``stack`` and the conditions as given; precision and kernels left None are
    the stack's).

    With ``finetune``, also the largest micro-batch at ``seq`` and the longest sequence at micro-batch 1 that
    fit, with and without full recompute, on FSDP over every GPU (ZeRO-3 over the frozen base, the common
    way to fine-tune on a few GPUs).
    """
    spec = io.load_model(model) if isinstance(model, str) else model
    gpu_spec = io.load_gpu(gpu)
    check_gpus(gpus)
    if dtype is None:
        dtype = published_dtype(model).value if finetune is None else DType.BF16.value
    if finetune is not None and finetune.mode == "qlora":
        dtype = "nf4"
    weight_dtype = choice(DType, dtype, "dtype")
    total = weights_bytes_total(spec, weight_dtype)
    per_gpu = total / gpus
    budget = gpu_spec.hbm_bytes * (1 - headroom)
    set_by, shown = workload_kwargs(conditions, precision=precision, attention=None, kernels=kernels)
    per_param = state_bytes_per_param(spec, resolve_workload(layout=Layout(), seq=seq, **set_by))
    state = count_params(spec).total * per_param
    here = lightest_weight_split(spec, gpus, weight_dtype)
    fewest = fewest_weight_split(spec, weight_dtype, budget)
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
        "headroom_fraction": headroom,
        "seq": seq,
        "fits": here is not None and here.weights_bytes <= budget,
        "weights_split": _split_dict(here),
        "min_gpus_for_weights": fewest.gpus if fewest is not None else None,
        "min_gpus_for_weights_split": _split_dict(fewest),
        "training_state_bytes_per_param": per_param,
        "training_state_bytes_total": state,
        **_fit_training(spec, gpu, gpus=gpus, req=finetune, seq=seq, set_by=set_by, headroom=headroom),
        "precision": set_by["precision"],
        **shown,
    }
    if finetune is not None:
        out |= _fit_finetune(spec, gpu_spec, gpus=gpus, req=finetune, seq=seq, set_by=set_by, budget=budget)
        if out["max_micro_batch_with_recompute"] == 0:
            out["nothing_fits"] = {
                "fewest_gpus_that_fit": out["min_gpus_for_training"],
                "variants": [v["change"] for v in out["training_variants"]],
            }
    return out


def _split_dict(split: WeightSplit | None) -> dict[str, Any] | None:
    if split is None:
        return None
    return {"tp": split.tp, "pp": split.pp, "weights_bytes_per_gpu": split.weights_bytes}


TRAINING_FLEET_LIMIT = 131_072
"""The largest fleet ``fit`` searches for the fewest GPUs that train (the API's cap on the planner's fewest-gpus
search): past it, each search would run over millions of GPUs."""


def _fit_training(
    spec: ModelSpec,
    gpu: str,
    *,
    gpus: int,
    req: FinetuneRequest | None,
    seq: int,
    set_by: Mapping[str, Any],
    headroom: float,
) -> dict[str, Any]:
    """Training on these GPUs by the planner's own search (``plan_fleet``, one source for ``plan`` and ``fit``):
    whether a layout fits, the fewest GPUs on which one does (one sequence of ``seq`` a GPU per step) with the
    sizes tried, and where nothing fits here, the variants that do (LoRA, QLoRA, no HBM kept free). ``set_by``:
    the stack's conditions, as for the rest of ``fit``."""
    ft = resolve_finetune(req, spec) if req is not None else None
    work = resolve_workload(layout=Layout(), seq=seq, global_batch=gpus, finetune=ft, **set_by)
    rules = SearchRules(headroom=headroom)
    fleet = functools.partial(resolve_cluster, gpu=gpu)
    found = fewest_that_fit(
        spec, fleet, work, rules, start=1, include_start=True, high=TRAINING_FLEET_LIMIT, batch_free=True
    )
    fits = fits_on(spec, fleet, work, rules, gpus=gpus, found=found)
    here = fleet(gpus=gpus)
    return {
        "training_fits": fits,
        "min_gpus_for_training": found.gpus,
        "min_gpus_for_training_tried": tried_json(found),
        "training_variants": [] if fits else variants(spec, here, work, rules, finetune=ft),
    }


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
    spec: ModelSpec,
    gpu: GPU,
    *,
    gpus: int,
    req: FinetuneRequest,
    seq: int,
    set_by: Mapping[str, Any],
    budget: float,
) -> dict[str, Any]:
    ft = resolve_finetune(req, spec)
    zero = 3 if gpus > 1 else 0
    out: dict[str, Any] = finetune_fields(spec, ft) | {"seq": seq, "layout": {"dp_shard": gpus, "zero": zero}}

    def fits(mb: int, s: int, recompute: str) -> bool:
        lay = resolve_layout(LayoutRequest(zero=zero, recompute=recompute, micro_batch=mb), gpus=gpus)
        work = resolve_workload(layout=lay, seq=s, global_batch=mb * lay.dp, finetune=ft, **set_by)
        return bool(training_memory(spec, lay, work, gpu=gpu).per_gpu.total_bytes <= budget)

    for recompute, suffix in (("none", ""), ("full", "_with_recompute")):
        out[f"max_micro_batch{suffix}"] = _largest(
            functools.partial(fits, s=seq, recompute=recompute), LIMIT_MICRO_BATCH
        )
        out[f"max_seq_len{suffix}"] = _largest(functools.partial(fits, 1, recompute=recompute), LIMIT_SEQ)
    return out


def check_serving_tp(spec: ModelSpec, tp: int) -> None:
    """Serving engines split attention heads over TP ranks: TP must divide the heads (vLLM and SGLang refuse).

    KV heads may be fewer than the ranks (each is then replicated) as long as one count divides the other.
    """
    heads, kv = spec.num_heads, spec.num_kv_heads
    if heads % tp:
        fine = [t for t in (1, 2, 4, 8, 16, 32, 64) if serving_tp_ok(spec, t)]
        raise ValueError(
            f"tp={tp} does not divide the {heads} attention heads of {spec.name} (give --tp, e.g. one of "
            f"{', '.join(map(str, fine))}; the other GPUs serve as replicas)"
        )
    if not serving_tp_ok(spec, tp):
        raise ValueError(f"tp={tp} and the {kv} KV heads of {spec.name}: neither divides the other")


def serving_report(
    model: ModelSpec | str,
    *,
    gpu: str,
    gpus: int,
    tp: int | None = None,
    pp: int = 1,
    ep: int = 1,
    dtype: str | None = None,
    kv_dtype: str = "bf16",
    context: int | None = None,
    gpu_memory_utilization: float = 0.9,
    node_size: int | None = None,
) -> dict[str, Any]:
    """``meshplan serving``: weights, KV cache per token, and how many tokens and sequences fit; ``dtype`` left out
    is the dtype the model is published in (reports/serve_setup.py ``published_dtype``).

    Without ``tp``, each replica's TP group fills one scale-up domain at most (replicas take the rest of the
    GPUs): TP across the fabric pays its per-layer all-reduces on the slow link. ``node_size`` replaces the GPU
    kind's scale-up domain (a PCIe box, an NVL72 rack).
    """
    check_gpus(gpus)
    dtype = published_dtype(model).value if dtype is None else dtype
    spec = io.load_model(model) if isinstance(model, str) else model
    gpu_spec = io.load_gpu(gpu)
    if node_size is not None:
        gpu_spec = dataclasses.replace(gpu_spec, scale_up_domain=node_size)
    tp = _serving_tp(spec, gpus=gpus, tp=tp, pp=pp, domain=gpu_spec.scale_up_domain)
    bill = serving_bill(
        spec,
        gpu=gpu_spec,
        tp=tp,
        pp=pp,
        ep=ep,
        weight_dtype=choice(DType, dtype, "dtype"),
        kv_dtype=choice(DType, kv_dtype, "kv dtype"),
        context=context,
        memory=_vllm_memory(gpu_spec.name, gpu_memory_utilization),
    )
    replicas = gpus // (tp * pp)
    warnings = _serving_warnings(spec, gpu_spec, tp=tp, pp=pp, context=bill.context)
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
        "engine": "vllm",
        "memory_fraction": gpu_memory_utilization,
        "memory_fraction_of": "hbm",
        "kv_bytes_per_token_total": kv_bytes_per_token_total(spec, kv_dtype=choice(DType, kv_dtype, "kv dtype")),
        **_bill_dict(bill, replicas=replicas),
        "warnings": warnings,
    }


def _bill_dict(bill: ServingBill, *, replicas: int) -> dict[str, Any]:
    """One GPU's serving bill by term (they sum to its HBM), and what fits."""
    return {
        "weights_bytes_per_gpu": bill.weights_bytes,
        "kv_bytes_per_token_per_gpu": bill.kv_bytes_per_token,
        "kv_bytes_per_sequence_per_gpu": bill.kv_bytes_per_sequence,
        "activations_bytes_per_gpu": bill.activations_bytes,
        "runtime_reserve_bytes_per_gpu": bill.runtime_reserve_bytes,
        "engine_headroom_bytes_per_gpu": bill.headroom_bytes,
        "usable_bytes_per_gpu": bill.usable_bytes,
        "kv_budget_bytes_per_gpu": bill.kv_budget_bytes,
        "kv_capacity_tokens_per_replica": bill.kv_capacity_tokens,
        "max_concurrent_sequences_total": bill.max_concurrent_sequences * replicas,
        "max_concurrent_sequences_per_replica": bill.max_concurrent_sequences,
        "fits": bill.fits,
    }


def _serving_tp(spec: ModelSpec, *, gpus: int, tp: int | None, pp: int, domain: int) -> int:
    """TP as given, or the largest divisor of gpus / pp within one scale-up domain; checked against the heads."""
    if pp < 1 or gpus % pp:
        raise ValueError(f"pp={pp} must divide gpus = {gpus}")
    if tp is None:
        tp = max(d for d in range(1, min(gpus // pp, domain) + 1) if (gpus // pp) % d == 0)
    if tp < 1 or gpus % (tp * pp):
        raise ValueError(f"tp*pp = {tp}*{pp} must divide gpus = {gpus}")
    check_serving_tp(spec, tp)
    return tp


def _vllm_memory(gpu: str, fraction: float) -> EngineMemory:
    """``meshplan serving`` sizes the KV pool as vLLM does: ``fraction`` of HBM holds weights, activations, the
    runtime reserve (engines.toml, vllm) and the KV cache."""
    from meshplan.reports.serve import calibration

    return dataclasses.replace(calibration("vllm", gpu).memory(), fraction=fraction)


def _serving_warnings(spec: ModelSpec, gpu: GPU, *, tp: int, pp: int, context: int) -> list[str]:
    """What a serving layout does that users rarely mean: TP over the fabric, a context past the model's."""
    out = []
    domain = gpu.scale_up_domain
    if tp > domain:
        out.append(
            f"tp={tp} spans {-(-tp // domain)} NVLink domains of {domain} GPUs: every layer's all-reduce crosses "
            f"the fabric; engines run TP inside a node (e.g. --tp {domain} --pp {pp * tp // domain})"
        )
    if spec.max_seq_len and context > spec.max_seq_len:
        out.append(f"context {context:,} is longer than the {spec.max_seq_len:,} tokens {spec.name} was trained for")
    return out
