"""``meshplan export``: a plan (given by flags or a saved plan file) as an engine's launch configuration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from meshplan import io
from meshplan.core.plan import evaluate
from meshplan.exports import SERVING_EXPORTERS, TRAINING_EXPORTERS, Engine, Export, ServingPlan
from meshplan.reports.bills import serving_report
from meshplan.reports.inputs import LayoutRequest, choice, resolve_cluster, resolve_layout, resolve_workload
from meshplan.spec.model import ModelSpec
from meshplan.units import DType


def _engine(name: str) -> Engine:
    try:
        return Engine(name.lower())
    except ValueError:
        raise ValueError(f"unknown engine {name!r} (engines: {', '.join(e.value for e in Engine)})") from None


def _export_dict(export: Export) -> dict[str, Any]:
    return {
        "engine": export.engine.value,
        "engine_version": export.engine_version,
        "files": dict(export.files),
        "command": export.command,
        "notes": list(export.notes),
    }


def load_saved_plan(path: str) -> dict[str, Any]:
    """The first plan of a file written by ``meshplan plan --save``."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read plan file {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"plan file {path} is not JSON: {exc}") from None
    if not isinstance(data, dict) or not data.get("plans"):
        raise ValueError(f"plan file {path} holds no plans (write one with meshplan plan --save FILE)")
    lay = dict(data["plans"][0]["layout"])
    request = LayoutRequest(
        tp=lay["tp"],
        pp=lay["pp"],
        vpp=lay["vpp"],
        cp=lay["cp"],
        ep=lay["ep"],
        dp_shard=lay["dp_shard"],
        zero=lay["zero"],
        sp=lay["sp"],
        recompute=lay["recompute"],
        schedule=lay["schedule"],
        cp_kind=lay["cp_kind"].replace("_", "-"),
        micro_batch=lay["micro_batch"],
    )
    return {
        "model": data["model"],
        "gpu": data["gpu"],
        "gpus": data["gpus"],
        "seq": data["seq"],
        "global_batch": data["global_batch"],
        "layout": request,
    }


def export_training(
    engine: str,
    model: ModelSpec | str,
    *,
    gpu: str,
    gpus: int,
    layout: LayoutRequest,
    seq: int,
    global_batch: int | None,
    precision: str = "bf16",
    model_path: str | None = None,
) -> dict[str, Any]:
    """A training plan as ``engine``'s configuration, with meshplan's predictions as comments."""
    eng = _engine(engine)
    if eng not in TRAINING_EXPORTERS:
        raise ValueError(
            f"{eng.value} serves models; give serving flags (--context, --dtype) instead of a training layout"
        )
    spec = io.load_model(model) if isinstance(model, str) else model
    cluster = resolve_cluster(gpu=gpu, gpus=gpus)
    lay = resolve_layout(layout, gpus=gpus)
    work = resolve_workload(layout=lay, seq=seq, global_batch=global_batch, precision=precision)
    plan = evaluate(spec, cluster, lay, work)
    predicted = {
        "step_time_s": float(plan.step.step_time_s),
        "mfu": float(plan.step.mfu),
        "tokens_per_s_per_gpu": float(plan.step.tokens_per_s_per_gpu),
        "memory_bytes_per_gpu": float(plan.memory.per_gpu.total_bytes),
    }
    export = TRAINING_EXPORTERS[eng](
        spec, lay, work, model_path=model_path, predicted=predicted, gpus_per_node=cluster.gpu.gpus_per_node
    )
    return _export_dict(export) | {"predicted": predicted}


def export_serving(
    engine: str,
    model: str,
    *,
    gpu: str,
    gpus: int,
    tp: int | None,
    pp: int,
    ep: int,
    dtype: str,
    kv_dtype: str,
    context: int | None,
    gpu_memory_utilization: float,
    model_path: str | None = None,
) -> dict[str, Any]:
    """A serving plan as ``engine``'s server flags; max_num_seqs comes from the KV capacity."""
    eng = _engine(engine)
    if eng not in SERVING_EXPORTERS:
        raise ValueError(f"{eng.value} trains models; give a training layout (--tp, --pp, --zero, ...) instead")
    bill = serving_report(
        model,
        gpu=gpu,
        gpus=gpus,
        tp=tp,
        pp=pp,
        ep=ep,
        dtype=dtype,
        kv_dtype=kv_dtype,
        context=context,
        gpu_memory_utilization=gpu_memory_utilization,
    )
    seqs = bill["max_concurrent_sequences_per_replica"]
    if seqs < 1:
        raise ValueError(
            f"no {bill['context']}-token sequence fits beside the weights on {gpus} x {gpu}; "
            "add GPUs, quantize, or shorten the context"
        )
    quant = {"fp8": "fp8", "int4": "awq", "int8": "compressed-tensors", "fp4": "modelopt_fp4"}.get(dtype)
    kv = choice(DType, kv_dtype, "kv dtype")
    predicted = {
        "kv_capacity_tokens_per_replica": float(bill["kv_capacity_tokens_per_replica"]),
        "weights_bytes_per_gpu": float(bill["weights_bytes_per_gpu"]),
    }
    plan = ServingPlan(
        model_path=model_path or model,
        tp=bill["tp"],
        pp=bill["pp"],
        ep=ep,
        dp=bill["replicas"],
        max_model_len=bill["context"],
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_seqs=seqs,
        kv_cache_dtype=None if kv is DType.BF16 else kv,
        quantization=quant,
    )
    export = SERVING_EXPORTERS[eng](plan, predicted=predicted)
    return _export_dict(export) | {"predicted": predicted}


SERVE_PLAN_QUANTIZATION = {"fp8": "fp8", "int4": "awq", "int8": "compressed-tensors", "fp4": "modelopt_fp4"}
"""The plan's weight dtype -> the quantization method the serving engines load it with."""


def export_serve_plan(engine: str, path: str, *, model_path: str | None = None) -> dict[str, Any]:
    """The best plan of a ``meshplan serve-plan --save`` file as ``engine``'s server flags."""
    eng = _engine(engine)
    if eng not in SERVING_EXPORTERS:
        raise ValueError(f"{eng.value} trains models; a serving plan exports to vllm, sglang or trtllm")
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read plan file {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"plan file {path} is not JSON: {exc}") from None
    best = data.get("best") if isinstance(data, dict) else None
    if not best:
        raise ValueError(f"plan file {path} holds no serving plan (write one with meshplan serve-plan --save FILE)")
    if best.get("prefill_replicas"):
        raise ValueError(
            f"plan file {path} splits prefill and decode pools; the exports launch colocated replicas only"
        )
    lay = best["layout"]
    kv = choice(DType, lay["kv_dtype"], "kv dtype")
    plan = ServingPlan(
        model_path=model_path or data["model"],
        tp=lay["tp"],
        pp=lay["pp"],
        ep=lay["ep"],
        dp=best["replicas"],
        dp_attention=lay["dp_attention"],
        max_model_len=data["input_len"] + data["output_len"],
        gpu_memory_utilization=0.9,
        max_num_seqs=best["batch_cap_per_replica"] // (lay["tp"] if lay["dp_attention"] else 1) or 1,
        kv_cache_dtype=None if kv is DType.BF16 else kv,
        quantization=SERVE_PLAN_QUANTIZATION.get(lay["weights_dtype"]),
    )
    predicted = {k: float(best[k]) for k in ("ttft_s_p99", "tpot_s", "tokens_per_s_per_gpu", "tokens_per_s_per_user")}
    export = SERVING_EXPORTERS[eng](plan, predicted=predicted)
    return _export_dict(export) | {"predicted": predicted}
