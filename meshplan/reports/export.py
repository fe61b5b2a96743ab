"""``meshplan export``: a plan (given by flags or a saved plan file) as an engine's launch configuration."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshplan import files, io
from meshplan.core.plan import evaluate
from meshplan.exports import (
    DISAGGREGATED_EXPORTERS,
    SERVING_EXPORTERS,
    TRAINING_EXPORTERS,
    DisaggregatedPlan,
    Engine,
    Export,
    ServingPlan,
    UnsupportedByEngine,
    check_model_path,
)
from meshplan.reports.bills import serving_report
from meshplan.reports.conditions import WORKLOAD_SET_BY_STACK, condition_names, workload_kwargs
from meshplan.reports.export_advice import serve_with_advice, served_checkpoint, training_refusal, with_admission_note
from meshplan.reports.inputs import LayoutRequest, choice, resolve_cluster, resolve_layout, resolve_workload
from meshplan.reports.serve_plan_file import SavedServingPlan, load_serving_plan, serving_plan_of
from meshplan.reports.serve_setup import published_dtype
from meshplan.spec import requests
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


def _field(table: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``table[key]`` of type ``kind``, or a one-line ValueError naming the key and what it holds."""
    if not isinstance(table, dict):
        raise ValueError(f"{where} must be a JSON object, got {type(table).__name__}")
    if key not in table:
        raise ValueError(f"{where} has no '{key}'")
    value = table[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        words = {int: "an integer", str: "a string", list: "a list", dict: "an object", bool: "true or false"}
        names = " or ".join(words.get(k, "null") for k in kinds)
        shown = repr(value) if len(repr(value)) <= 40 else f"a {type(value).__name__}"
        raise ValueError(f"'{key}' in {where} must be {names}, got {shown}")
    return value


def load_saved_plan(path: str) -> dict[str, Any]:
    """The first plan of a file written by ``meshplan plan --save``; ValueError naming what is wrong otherwise."""
    label = f"plan file {path}"
    data = files.parse_json(files.read_text_file(path, what="plan file"), label, unique_keys=True)
    if not isinstance(data, dict):
        raise ValueError(f"{label} must hold a JSON object, got {type(data).__name__}")
    if "plans" not in data and "best" in data:
        raise ValueError(
            f"{label} is a serving plan (serve-plan --save): export it to vllm, sglang or trtllm, or write a "
            "training plan with meshplan plan ... --save FILE"
        )
    plans = _field(data, "plans", list, label)
    if not plans:
        raise ValueError(f"{label} holds no plans (write one with meshplan plan --save FILE)")
    lay = _field(plans[0], "layout", dict, f"the first plan of {label}")
    try:
        request = LayoutRequest.parse(lay)  # the schema's names, types and bounds
    except ValueError as exc:
        raise ValueError(f"the layout of {label}: {exc}") from None
    return {
        "model": _field(data, "model", str, label),
        "gpu": _field(data, "gpu", str, label),
        "gpus": _field(data, "gpus", int, label),
        "seq": _field(data, "seq", int, label),
        "global_batch": _field(data, "global_batch", int, label),
        "layout": request,
        "conditions": saved_conditions(data, label),
    }


def saved_conditions(data: dict[str, Any], label: str) -> dict[str, Any]:
    """What a saved plan states of its run, by schema field name: its stack when a flag named it (a stack taken
    from the default or from ``--engine`` is left to the exporting engine) and each condition a flag set (precision,
    attention and kernels among them), parsed by the schema."""
    raw: dict[str, Any] = {}
    if data.get("stack") is not None and data.get("stack_source", "flag") == "flag":
        raw["stack"] = data["stack"]
    shown = data.get("conditions") or {}
    if not isinstance(shown, dict):
        raise ValueError(f"'conditions' in {label} must be a JSON object, got {type(shown).__name__}")
    for name, entry in shown.items():
        if isinstance(entry, dict) and entry.get("source") == "flag" and entry.get("value") is not None:
            raw[name] = entry["value"]
    allowed = [requests.field(name) for name in ("stack", *condition_names())]
    try:
        return requests.parse_values(raw, allowed=allowed, what="condition")
    except ValueError as exc:
        raise ValueError(f"the conditions of {label}: {exc}") from None


def export_training(
    engine: str,
    model: ModelSpec | str,
    *,
    gpu: str,
    gpus: int,
    layout: LayoutRequest,
    seq: int,
    global_batch: int | None,
    precision: str | None = None,
    model_path: str | None = None,
    conditions: Mapping[str, Any] | None = None,
    plan_file: str | None = None,
) -> dict[str, Any]:
    """A training plan as ``engine``'s configuration, with meshplan's predictions as comments; ``conditions``:
    the stack and run conditions as given (the stated first/last stage layers, a saved plan's flags). The run
    takes the engine's stack unless ``conditions`` names one; precision, attention and kernels left unset (None)
    come from the stack. ``plan_file``: the saved plan the layout came from (a refusal then says to plan again
    for the engine)."""
    eng = _engine(engine)
    if model_path is not None:
        check_model_path(model_path, what="--model-path")
    if eng not in TRAINING_EXPORTERS:
        raise ValueError(
            f"{eng.value} serves models; give serving flags (--context, --weights-dtype) instead of a training layout"
        )
    spec = io.load_model(model) if isinstance(model, str) else model
    cluster = resolve_cluster(gpu=gpu, gpus=gpus)
    lay = resolve_layout(layout, gpus=gpus)
    given = dict(conditions or {})
    stated = {k: given.pop(k, None) for k in WORKLOAD_SET_BY_STACK}
    kwargs, shown = workload_kwargs(
        given,
        precision=precision or stated["precision"],
        attention=stated["attention"],
        kernels=stated["kernels"],
        engine=eng.value,
    )
    work = resolve_workload(layout=lay, seq=seq, global_batch=global_batch, **kwargs)
    plan = evaluate(spec, cluster, lay, work)
    predicted = {
        "step_time_s": float(plan.step.step_time_s),
        "mfu": float(plan.step.mfu),
        "tokens_per_s_per_gpu": float(plan.step.tokens_per_s_per_gpu),
        "memory_bytes_per_gpu": float(plan.memory.per_gpu.total_bytes),
    }
    try:
        export = TRAINING_EXPORTERS[eng](
            spec, lay, work, model_path=model_path, predicted=predicted, gpus_per_node=cluster.gpu.gpus_per_node
        )
    except UnsupportedByEngine as exc:
        word = model if isinstance(model, str) else spec.name
        where = (word, gpu, gpus, precision or stated["precision"])
        raise training_refusal(exc, eng, spec, lay, work, where=where, plan_file=plan_file) from None
    out = _export_dict(export) | {"predicted": predicted} | {k: v for k, v in shown.items() if k != "conditions"}
    if not plan.memory.fits:  # first among the notes: the launcher of a layout that would not start
        warning = f"warning: {over_hbm_words(plan.memory.per_gpu.total_bytes, plan.memory.hbm_bytes, gpu)}"
        out["notes"] = [warning, *out["notes"]]
    return out


def over_hbm_words(need_bytes: float, hbm_bytes: float, gpu: str) -> str:
    """What a training export over HBM says (the CLI's note, the API's refusal)."""
    return (
        f"this layout needs {need_bytes / 1e9:,.1f} GB per GPU, over the {hbm_bytes / 1e9:,.1f} GB of one {gpu} "
        f"by {(need_bytes - hbm_bytes) / 1e9:,.1f} GB: it would not start"
    )


def export_serving(
    engine: str,
    model: str,
    *,
    gpu: str,
    gpus: int,
    tp: int | None,
    pp: int,
    ep: int,
    dtype: str | None,
    kv_dtype: str,
    context: int | None,
    gpu_memory_utilization: float,
    model_path: str | None = None,
) -> dict[str, Any]:
    """A serving plan as ``engine``'s server flags; max_num_seqs comes from the KV capacity."""
    eng = _engine(engine)
    if eng not in SERVING_EXPORTERS:
        raise ValueError(f"{eng.value} trains models; give a training layout (--tp, --pp, --zero, ...) instead")
    served, source = served_checkpoint(model, model_path)
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
    quant = engine_quantization(model, bill["dtype"])  # left out: the dtype the model is published in
    kv = choice(DType, kv_dtype, "kv dtype")
    predicted = {
        "kv_capacity_tokens_per_replica": float(bill["kv_capacity_tokens_per_replica"]),
        "weights_bytes_per_gpu": float(bill["weights_bytes_per_gpu"]),
    }
    plan = ServingPlan(
        model_path=served,
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
    export = serve_with_advice(eng, plan, predicted, plan_file=None)
    out = _export_dict(export) | {"predicted": predicted}
    out["notes"] = [*out["notes"], *([source] if source else []), *(f"warning: {w}" for w in bill["warnings"])]
    return out


SERVE_PLAN_QUANTIZATION = {"fp8": "fp8", "int4": "awq", "int8": "compressed-tensors", "fp4": "modelopt_fp4"}
"""The plan's weight dtype -> the quantization method the serving engines load it with."""


def engine_quantization(model: str, dtype: str) -> str | None:
    """The quantization method an engine is told to load ``model``'s weights in ``dtype`` with: none where that is
    the dtype the model is published in (its checkpoint carries its own quantization config, which the engines read
    and refuse to see contradicted: gpt-oss's MXFP4 is no ModelOpt FP4), else ``SERVE_PLAN_QUANTIZATION``'s."""
    if dtype == published_dtype(model).value:
        return None
    return SERVE_PLAN_QUANTIZATION.get(dtype)


def export_serve_plan(engine: str, path: str, *, model_path: str | None = None) -> dict[str, Any]:
    """The best plan of a ``meshplan serve-plan --save`` file as ``engine``'s server flags; a plan with split
    prefill and decode pools becomes one launcher per pool where the engine can express it.

    The file is checked field by field and its plan computed again (reports.serve_plan_file): the export takes
    the recomputed batch cap and predictions, never the file's."""
    eng = _engine(engine)
    if eng not in SERVING_EXPORTERS:
        raise ValueError(f"{eng.value} trains models; a serving plan exports to vllm, sglang or trtllm")
    if model_path is not None:
        check_model_path(model_path, what="--model-path")
    return _export_saved(eng, load_serving_plan(path), plan_file=path, model_path=model_path)


def export_serve_plan_data(engine: str, data: Any, *, model_path: str | None = None) -> dict[str, Any]:
    """``export_serve_plan`` of a serve-plan answer already in memory (the explorer's, as /api/serve-plan gave it):
    the same checks, the same recomputation, the same flags as the CLI's ``--from-plan`` of that answer saved."""
    eng = _engine(engine)
    if eng not in SERVING_EXPORTERS:
        raise ValueError(f"{eng.value} trains models; a serving plan exports to vllm, sglang or trtllm")
    if model_path is not None:
        check_model_path(model_path, what="--model-path")
    return _export_saved(eng, serving_plan_of(data, "the serving plan"), plan_file=None, model_path=model_path)


def _export_saved(
    eng: Engine, saved: SavedServingPlan, *, plan_file: str | None, model_path: str | None
) -> dict[str, Any]:
    path = f"plan file {plan_file}" if plan_file else "the serving plan"
    if saved.launch == "compile":
        raise ValueError(
            f"{path} was timed launching its kernels from torch.compile's wrapper without CUDA graphs "
            "(--launch compile), which no engine's flags select: plan it with CUDA graphs or --launch eager"
        )
    model_path, source = served_checkpoint(saved.model, model_path)
    predicted = dict(saved.predicted)
    if not saved.prefill_replicas:
        export = serve_with_advice(eng, _pool_plan(saved, saved.replicas, model_path), predicted, plan_file=plan_file)
        return _with_note(_export_dict(export) | {"predicted": predicted}, source)
    if eng not in DISAGGREGATED_EXPORTERS:
        raise ValueError(
            f"{path} splits prefill and decode pools; the {eng.value} export launches colocated replicas "
            f"only (its disaggregated server's context/generation YAML is not written): export vllm or sglang"
        )
    pools = DisaggregatedPlan(
        prefill=_pool_plan(saved, saved.prefill_replicas, model_path),
        decode=_pool_plan(saved, saved.replicas - saved.prefill_replicas, model_path),
    )
    export = with_admission_note(
        eng, saved.capacity_scheduler, DISAGGREGATED_EXPORTERS[eng](pools, predicted=predicted)
    )
    return _with_note(_export_dict(export) | {"predicted": predicted}, source)


def _with_note(out: dict[str, Any], note: str | None) -> dict[str, Any]:
    return out | {"notes": [*out["notes"], note]} if note else out


def _pool_plan(saved: SavedServingPlan, replicas: int, model_path: str) -> ServingPlan:
    """``replicas`` replicas of the saved plan's layout, dtypes and batch cap (per attention-DP rank)."""
    lay = saved.layout
    return ServingPlan(
        model_path=model_path,
        tp=lay.tp,
        pp=lay.pp,
        ep=lay.ep,
        dp=replicas,
        dp_attention=lay.dp_attention,
        max_model_len=saved.max_model_len,
        gpu_memory_utilization=0.9,
        max_num_seqs=saved.batch_cap_per_replica // (lay.tp if lay.dp_attention else 1) or 1,
        kv_cache_dtype=None if lay.kv_dtype is DType.BF16 else lay.kv_dtype,
        quantization=engine_quantization(saved.model, lay.weights_dtype.value),
        enforce_eager=saved.launch == "eager",
        capacity_scheduler=saved.capacity_scheduler,
    )
