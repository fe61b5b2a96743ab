"""``meshplan export``: a plan (given by flags or a saved plan file) as an engine's launch configuration."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

from meshplan import io
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
from meshplan.reports.conditions import workload_kwargs
from meshplan.reports.inputs import LayoutRequest, choice, resolve_cluster, resolve_layout, resolve_workload
from meshplan.reports.serve_plan_file import SavedServingPlan, load_serving_plan
from meshplan.spec.layout import Layout
from meshplan.spec.model import ModelSpec
from meshplan.spec.requests import BY_NAME
from meshplan.spec.workload import Workload
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
    data = io.parse_json(io.read_text_file(path, what="plan file"), label)
    if not isinstance(data, dict):
        raise ValueError(f"{label} must hold a JSON object, got {type(data).__name__}")
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
    conditions: Mapping[str, Any] | None = None,
    plan_file: str | None = None,
) -> dict[str, Any]:
    """A training plan as ``engine``'s configuration, with meshplan's predictions as comments; ``conditions``:
    the run conditions the export carries (the stated first/last stage layers); ``plan_file``: the saved plan
    the layout came from (a refusal then says to plan again for the engine)."""
    eng = _engine(engine)
    if model_path is not None:
        check_model_path(model_path, what="--model-path")
    if eng not in TRAINING_EXPORTERS:
        raise ValueError(
            f"{eng.value} serves models; give serving flags (--context, --dtype) instead of a training layout"
        )
    spec = io.load_model(model) if isinstance(model, str) else model
    cluster = resolve_cluster(gpu=gpu, gpus=gpus)
    lay = resolve_layout(layout, gpus=gpus)
    kwargs, _ = workload_kwargs(conditions, precision=precision, attention=None, kernels=None)
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
        where = (word, gpu, gpus, precision)
        raise _training_refusal(exc, eng, spec, lay, work, where=where, plan_file=plan_file) from None
    return _export_dict(export) | {"predicted": predicted}


def replan_command(
    engine: str,
    model: str,
    *,
    gpu: str,
    gpus: int,
    seq: int,
    global_batch_tokens: int,
    precision: str | None = None,
    pins: tuple[str, ...] = (),
) -> str:
    """The ``meshplan plan ... --engine ENGINE --save`` command (``pins``: more plan flags) and the export of
    its file: what a refusal tells a user to run to get a layout ``engine`` accepts."""
    out = f"{engine}-plan.json"
    words = ["meshplan", "plan", model, "--gpu", gpu, "--gpus", str(gpus), "--seq", str(seq)]
    words += ["--global-batch-tokens", str(global_batch_tokens)]
    words += ["--precision", precision] if precision and precision != "bf16" else []
    words += [*pins, "--engine", engine, "--save", out]
    return f"`{shlex.join(words)}`, then `meshplan export {engine} --from-plan {out}`"


_ASSIGNMENT = re.compile(r"\b([a-z_]+)=([\w.-]+)")


def as_flags(text: str) -> str:
    """An exporter's ``closest`` (``zero=2``, ``sp=False``, ``kv_cache_dtype fp8``) in the flags that ask for it."""
    for word, flag in (("kv_cache_dtype ", "--kv-dtype "), ("quantization=None", "--weights-dtype bf16")):
        text = text.replace(word, flag)
    text = re.sub(r"^precision ", "--precision ", text)

    def flag(m: re.Match[str]) -> str:
        name, value = m.groups()
        f = BY_NAME.get(name)
        if f is None:
            return m.group()
        if f.type is bool:
            return f.flag if value.lower() in ("true", "1", "on") else f"no {f.flag}"
        return f"{f.flag} {value}"

    return _ASSIGNMENT.sub(flag, text)


def _runs(engine: Engine, spec: ModelSpec, lay: Layout, work: Workload) -> bool:
    try:
        TRAINING_EXPORTERS[engine](spec, lay, work)
    except ValueError:
        return False
    return True


def _training_refusal(
    exc: UnsupportedByEngine,
    eng: Engine,
    spec: ModelSpec,
    lay: Layout,
    work: Workload,
    *,
    where: tuple[str, str, int, str],
    plan_file: str | None,
) -> UnsupportedByEngine:
    """The refusal with advice that works: where a layout of the engine's would run (the engine takes the plain
    single-GPU layout with this workload), the planner's command for one (``--engine``); other engines that run
    the plan as it is."""
    others = [e.value for e in TRAINING_EXPORTERS if e is not eng and _runs(e, spec, lay, work)]
    elsewhere = f"; {' and '.join(others)} {'runs' if len(others) == 1 else 'run'} it as it is" if others else ""
    if plan_file is not None and others:
        elsewhere += f": `meshplan export {others[0]} --from-plan {shlex.quote(plan_file)}`"
    if not _runs(eng, spec, Layout(), work):  # the workload or the model, not the layout: no layout helps
        return exc.with_advice(f"closest: {as_flags(exc.closest)}{elsewhere}")
    model, gpu, gpus, precision = where
    replan = replan_command(
        eng.value, model, gpu=gpu, gpus=gpus, seq=work.seq_len, global_batch_tokens=work.tokens_per_step,
        precision=precision,
    )  # fmt: skip
    if plan_file is not None:
        return exc.with_advice(f"the plan in {plan_file} asks for it; re-plan for {eng.value}: {replan}{elsewhere}")
    return exc.with_advice(f"closest: {as_flags(exc.closest)}; or let the planner pick a layout: {replan}{elsewhere}")


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
    served = check_model_path(model_path, what="--model-path") if model_path is not None else model
    check_model_path(served, what="the served model (MODEL, or give --model-path)")
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
    export = _serve(eng, plan, predicted, plan_file=None)
    out = _export_dict(export) | {"predicted": predicted}
    out["notes"] = [*out["notes"], *(f"warning: {w}" for w in bill["warnings"])]
    return out


SERVE_PLAN_QUANTIZATION = {"fp8": "fp8", "int4": "awq", "int8": "compressed-tensors", "fp4": "modelopt_fp4"}
"""The plan's weight dtype -> the quantization method the serving engines load it with."""


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
    saved = load_serving_plan(path)
    predicted = dict(saved.predicted)
    if not saved.prefill_replicas:
        export = _serve(eng, _pool_plan(saved, saved.replicas, model_path), predicted, plan_file=path)
        return _export_dict(export) | {"predicted": predicted}
    if eng not in DISAGGREGATED_EXPORTERS:
        raise ValueError(
            f"plan file {path} splits prefill and decode pools; the {eng.value} export launches colocated replicas "
            f"only (its disaggregated server's context/generation YAML is not written): export vllm or sglang"
        )
    pools = DisaggregatedPlan(
        prefill=_pool_plan(saved, saved.prefill_replicas, model_path),
        decode=_pool_plan(saved, saved.replicas - saved.prefill_replicas, model_path),
    )
    export = DISAGGREGATED_EXPORTERS[eng](pools, predicted=predicted)
    return _export_dict(export) | {"predicted": predicted}


def _serve(eng: Engine, plan: ServingPlan, predicted: Mapping[str, float], *, plan_file: str | None) -> Export:
    """``eng``'s launcher for ``plan``; a refusal names the flags of the closest plan the engine runs and the
    serving engines that run this one as it is."""
    try:
        return SERVING_EXPORTERS[eng](plan, predicted=predicted)
    except UnsupportedByEngine as exc:
        others = [e.value for e, export in SERVING_EXPORTERS.items() if e is not eng and _serves(export, plan)]
        verb = "runs" if len(others) == 1 else "run"
        if plan_file is not None:
            how = f": `meshplan export {others[0]} --from-plan {shlex.quote(plan_file)}`" if others else ""
            elsewhere = f"; {' and '.join(others)} {verb} this plan as it is{how}" if others else ""
            raise exc.with_advice(f"closest: {exc.closest}{elsewhere}") from None
        elsewhere = f"; {' and '.join(others)} {verb} it with the same flags" if others else ""
        raise exc.with_advice(f"closest: {as_flags(exc.closest)}{elsewhere}") from None


def _serves(export: Any, plan: ServingPlan) -> bool:
    try:
        export(plan)
    except ValueError:
        return False
    return True


def _pool_plan(saved: SavedServingPlan, replicas: int, model_path: str | None) -> ServingPlan:
    """``replicas`` replicas of the saved plan's layout, dtypes and batch cap (per attention-DP rank)."""
    lay = saved.layout
    return ServingPlan(
        model_path=model_path or saved.model,
        tp=lay.tp,
        pp=lay.pp,
        ep=lay.ep,
        dp=replicas,
        dp_attention=lay.dp_attention,
        max_model_len=saved.max_model_len,
        gpu_memory_utilization=0.9,
        max_num_seqs=saved.batch_cap_per_replica // (lay.tp if lay.dp_attention else 1) or 1,
        kv_cache_dtype=None if lay.kv_dtype is DType.BF16 else lay.kv_dtype,
        quantization=SERVE_PLAN_QUANTIZATION.get(lay.weights_dtype.value),
    )
