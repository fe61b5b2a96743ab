"""Conditions as a user states them (flags, query parameters, run files) resolved against a training stack.

Every run has a stack: the one given (``--stack``), else the stack of the engine the run is planned for
(``--engine``), else ``DEFAULT_STACK``. Each condition's value comes from its flag when given, else from the
stack's defaults, else from the schema's default; every report names the stack, where it came from, where each
value came from, and which values differ from the stack's own (``stack``, ``stack_source``, ``conditions`` and
``differs_from_stack`` in docs/json.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from meshplan import io
from meshplan.spec import requests
from meshplan.spec.conditions import (
    Conditions,
    CpRotate,
    EpDispatch,
    Fp8Recipe,
    LossKind,
    Selective,
    StageSplit,
    Zero3GradReduce,
    Zero3Unit,
    ZeroGradReduce,
)
from meshplan.spec.workload import PRECISIONS, Overlap, PrecisionPolicy
from meshplan.units import DType

DEFAULT_STACK = "megatron-core"
"""The stack of a run that names none: Megatron-Core as NVIDIA ships it (distributed optimizer, fp32 main gradients,
Transformer Engine kernels, overlapped data-parallel traffic), each condition at Megatron-LM's own default
(arguments.py). Of the real stacks it is the nearest to what a stackless run assumed before (Megatron's tensors,
fused kernels, the framework's loss), so only what matched no framework moved (README, "The default stack")."""
ENGINE_STACKS = {"megatron": "megatron-core", "torchtitan": "torchtitan", "deepspeed": "deepspeed"}
"""The stack a training engine runs (``plan --engine E`` and ``export E`` take it unless a stack is given)."""
WORKLOAD_SET_BY_STACK = ("precision", "kernels", "attention")
"""Workload fields a stack fixes besides its conditions."""
OVERLAP_AXES = {
    "dp": ("dp",),
    "param_gather": ("param_gather", "fsdp_prefetch"),
    "tp": ("tp",),
    "tp_backward": ("tp_backward",),
    "ep": ("ep",),
    "pp": ("pp",),
    "cp": ("cp",),
}
"""Each overlap flag and the Overlap fields it sets (the parameter gather: ZeRO-1/2's after the step and
ZeRO-3's prefetch of the next layer alike)."""


def condition_names() -> tuple[str, ...]:
    """Every field a stack may set, workload fields first, ``stack`` itself left out."""
    own = tuple(f.name for f in requests.group(requests.Group.CONDITIONS) if f.name != "stack")
    return WORKLOAD_SET_BY_STACK + own


def stack_of(stack: str | None, engine: str | None = None) -> tuple[str, str]:
    """(the run's stack, where it came from): the one given ("flag"), else the engine's ("engine"), else the
    default ("default")."""
    if stack:
        return stack, "flag"
    if engine:
        if engine not in ENGINE_STACKS:
            raise ValueError(f"unknown training engine {engine!r} (engines: {', '.join(ENGINE_STACKS)})")
        return ENGINE_STACKS[engine], "engine"
    return DEFAULT_STACK, "default"


def resolve(values: Mapping[str, Any], *, engine: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(resolved values by field name, the report's ``conditions`` block) from raw values (None: unset);
    ``engine``: the training engine whose stack the run takes when ``values`` names none."""
    name, stack_source = stack_of(values.get("stack"), engine)
    stack = io.load_stack(name)
    resolved: dict[str, Any] = {}
    shown: dict[str, Any] = {}
    differs: list[str] = []
    for key in condition_names():
        own = stack.defaults.get(key, requests.field(key).default)
        given = values.get(key)
        if given is not None:
            value, source = given, "flag"
            if given != own:
                differs.append(key)
        elif key in stack.defaults:
            value, source = own, "stack"
        else:
            value, source = own, "default"
        resolved[key] = value
        shown[key] = {"value": value, "source": source}
    block = {
        "stack": stack.name,
        "stack_source": stack_source,
        "reports": stack.reports,
        "values": shown,
        "differs_from_stack": differs,
    }
    return resolved, block


def _modules(text: str | None) -> tuple[str, ...]:
    if not text:
        return ("core_attn",)
    return tuple(m.strip().lower().replace("-", "_") for m in text.split(",") if m.strip())


def _on(value: str | None, default: bool) -> bool:
    return default if value is None else value == "on"


def conditions_of(resolved: Mapping[str, Any]) -> Conditions:
    """The core's Conditions from resolved values."""
    loss_parallel = resolved.get("loss_parallel")
    keep = tuple(
        dict.fromkeys(t.strip().lower() for t in (resolved.get("recompute_keep") or "").split(",") if t.strip())
    )
    return Conditions(
        microbatch_group=resolved.get("microbatch_group"),
        grad_sync=_on(resolved.get("grad_sync"), True),
        reshard_after_forward=_on(resolved.get("reshard_after_forward"), True),
        runtime_reserve_bytes=float(resolved.get("runtime_reserve") or 0.0),
        loss=LossKind(resolved.get("loss") or "framework"),
        selective=Selective.KEEP if keep else Selective(resolved.get("selective") or "core-attention"),
        recompute_layers=resolved.get("recompute_layers"),
        recompute_modules=_modules(resolved.get("recompute_modules")),
        recompute_keep=keep,
        routing_imbalance=float(resolved.get("routing_imbalance") or 1.0),
        loss_parallel=None if loss_parallel is None else loss_parallel == "on",
        stage_split=StageSplit(first=resolved.get("first_stage_layers"), last=resolved.get("last_stage_layers")),
        offload_layers=resolved.get("offload_layers"),
        doc_tokens=resolved.get("doc_tokens"),
        fp8_recipe=Fp8Recipe(resolved["fp8_recipe"]) if resolved.get("fp8_recipe") else None,
        fp8_all_gather=_on(resolved.get("fp8_all_gather"), False),
        fp8_dispatch=_on(resolved.get("fp8_dispatch"), False),
        zero3_unit=Zero3Unit(resolved.get("zero3_unit") or "layer"),
        zero3_grad_reduce=Zero3GradReduce(resolved.get("zero3_grad_reduce") or "reduce-scatter"),
        zero_grad_reduce=ZeroGradReduce(resolved.get("zero_grad_reduce") or "reduce-scatter"),
        repeat_kv=_on(resolved.get("repeat_kv"), False),
        recompute_early_stop=_on(resolved.get("recompute_early_stop"), False),
        cp_rotate=CpRotate(resolved.get("cp_rotate") or "alltoall"),
        ep_dispatch=EpDispatch(resolved.get("ep_dispatch") or "alltoall"),
        fsdp_copies=_on(resolved.get("fsdp_copies"), False),
        pp_host_sync=_on(resolved.get("pp_host_sync"), True),
        launch=resolved.get("launch"),
        loss_fusion=_on(resolved.get("loss_fusion"), True),
        grad_accum_fusion=_on(resolved.get("grad_accum_fusion"), True),
        pp_scatter_gather=None if resolved.get("pp_scatter_gather") is None else resolved["pp_scatter_gather"] == "on",
    )


def overlap_of(resolved: Mapping[str, Any]) -> dict[str, bool]:
    """Overlap settings given by a flag or the stack (the rest keep Overlap's defaults)."""
    out: dict[str, bool] = {}
    for axis, attrs in OVERLAP_AXES.items():
        value = resolved.get(f"overlap_{axis}")
        if value is not None:
            out |= {attr: value == "on" for attr in attrs}
    known = {f.name for f in dataclasses.fields(Overlap)}
    assert set(out) <= known
    return out


def precision_of(name: str, resolved: Mapping[str, Any]) -> PrecisionPolicy:
    """The named policy with the gradient, master and moment dtypes the conditions override."""
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r} (choose from {', '.join(PRECISIONS)})")
    policy = PRECISIONS[name]
    changes: dict[str, Any] = {}
    if resolved.get("grad_dtype"):
        changes["grads"] = DType(resolved["grad_dtype"])
    if resolved.get("master_dtype"):
        changes["master"] = None if resolved["master_dtype"] == "none" else DType(resolved["master_dtype"])
    if resolved.get("moment_dtype"):
        changes["moments"] = DType(resolved["moment_dtype"])
    return dataclasses.replace(policy, **changes) if changes else policy


def workload_kwargs(
    conditions: Mapping[str, Any] | None,
    *,
    precision: str | None,
    attention: str | None,
    kernels: str | None,
    engine: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(keyword arguments of ``resolve_workload`` the conditions decide, the report's ``stack``,
    ``stack_source``, ``conditions`` and ``differs_from_stack``): precision, attention and kernels left None come
    from the stack, else the defaults; ``engine``: the training engine whose stack the run takes if none is given."""
    given = dict(conditions or {}) | {"precision": precision, "attention": attention, "kernels": kernels}
    resolved, block = resolve(given, engine=engine)
    kwargs = {
        "precision": resolved["precision"],
        "attention": resolved["attention"],
        "kernels": resolved["kernels"],
        "framework": resolved["framework"] or "megatron",
        "conditions": conditions_of(resolved),
        "overlap": overlap_of(resolved),
        "policy": precision_of(resolved["precision"], resolved),
    }
    return kwargs, report_fields(block)


def report_fields(block: Mapping[str, Any]) -> dict[str, Any]:
    """What every training report says of its stack and conditions (from ``resolve``'s block)."""
    return {
        "stack": block["stack"],
        "stack_source": block["stack_source"],
        "conditions": block["values"],
        "differs_from_stack": block["differs_from_stack"],
    }
