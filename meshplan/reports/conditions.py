"""Conditions as a user states them (flags, query parameters, run files) resolved against a training stack.

Each condition's value comes from its flag when given, else from the stack's defaults, else from the
schema's default; every report names which (``conditions`` in docs/json.md).
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
    Fp8Recipe,
    LossKind,
    Selective,
    StageSplit,
    Zero3GradReduce,
    Zero3Unit,
)
from meshplan.spec.workload import PRECISIONS, Overlap, PrecisionPolicy
from meshplan.units import DType

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


def resolve(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(resolved values by field name, the report's ``conditions`` block) from raw values (None: unset)."""
    name = values.get("stack")
    stack = io.load_stack(name) if name else None
    resolved: dict[str, Any] = {}
    shown: dict[str, Any] = {}
    for key in condition_names():
        given = values.get(key)
        if given is not None:
            value, source = given, "flag"
        elif stack is not None and key in stack.defaults:
            value, source = stack.defaults[key], "stack"
        else:
            value, source = requests.field(key).default, "default"
        resolved[key] = value
        shown[key] = {"value": value, "source": source}
    block = {
        "stack": stack.name if stack else None,
        "reports": stack.reports if stack else None,
        "values": shown,
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
    return Conditions(
        microbatch_group=resolved.get("microbatch_group"),
        grad_sync=_on(resolved.get("grad_sync"), True),
        reshard_after_forward=_on(resolved.get("reshard_after_forward"), True),
        runtime_reserve_bytes=float(resolved.get("runtime_reserve") or 0.0),
        loss=LossKind(resolved.get("loss") or "framework"),
        selective=Selective(resolved.get("selective") or "core-attention"),
        recompute_layers=resolved.get("recompute_layers"),
        recompute_modules=_modules(resolved.get("recompute_modules")),
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
        repeat_kv=_on(resolved.get("repeat_kv"), False),
        recompute_early_stop=_on(resolved.get("recompute_early_stop"), False),
        cp_rotate=CpRotate(resolved.get("cp_rotate") or "alltoall"),
        fsdp_copies=_on(resolved.get("fsdp_copies"), False),
        pp_host_sync=_on(resolved.get("pp_host_sync"), True),
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
    conditions: Mapping[str, Any] | None, *, precision: str | None, attention: str | None, kernels: str | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(keyword arguments of ``resolve_workload`` the conditions decide, the report's ``stack`` and
    ``conditions``): precision, attention and kernels left None come from the stack, else the defaults."""
    given = dict(conditions or {}) | {"precision": precision, "attention": attention, "kernels": kernels}
    resolved, block = resolve(given)
    kwargs = {
        "precision": resolved["precision"],
        "attention": resolved["attention"],
        "kernels": resolved["kernels"],
        "framework": resolved["framework"] or "megatron",
        "conditions": conditions_of(resolved),
        "overlap": overlap_of(resolved),
        "policy": precision_of(resolved["precision"], resolved),
    }
    return kwargs, {"stack": block["stack"], "conditions": block["values"]}
