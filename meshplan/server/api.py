"""Report endpoints: each parses its query and calls one report function, as the CLI does."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import cache
from typing import Annotated, Any, Literal

import annotated_types as at
from fastapi import APIRouter, Depends, Query, Request
from pydantic import BeforeValidator

from meshplan.render import jsonable
from meshplan.reports import LayoutRequest, fit_report, memory_report, params_report, serving_report
from meshplan.reports import models as m
from meshplan.reports import serve_models as sm
from meshplan.reports.cost import CostRequest, cost_request
from meshplan.reports.estimate import collectives_report, estimate_report
from meshplan.reports.inputs import FinetuneRequest
from meshplan.reports.typed import SERVE_PLAN_FIELDS
from meshplan.server import parse
from meshplan.server.catalog import catalog_dict
from meshplan.server.content import serving_bill
from meshplan.spec.model import ModelSpec
from meshplan.spec.profile import parse_profile
from meshplan.spec.requests import Field, Group, field
from meshplan.spec.requests import group as fields_of

router = APIRouter(prefix="/api")

Name = Annotated[str, Query(max_length=parse.MAX_NAME_CHARS)]

KV_DTYPES = field("kv_dtype").choices


def ok(model: type) -> dict[int | str, dict[str, Any]]:
    """The 200 response documented with a report model (meshplan.reports.models); the body is the report itself."""
    return {200: {"model": model, "description": model.__doc__ or "the report"}}


def json_dict(obj: Any) -> dict[str, Any]:
    """A report (or any dataclass/dict) as plain JSON data; non-finite floats become null."""
    out = jsonable(obj)
    assert isinstance(out, dict), type(out)
    return out


MODEL_SCHEMA = {"anyOf": [{"enum": list(parse.model_names())}, {"pattern": parse.UPLOAD_PATTERN}]}
ModelName = Annotated[
    str,
    Query(
        max_length=parse.MAX_NAME_CHARS,
        description="a catalog model, or the id POST /api/model gave an uploaded config.json",
        json_schema_extra=MODEL_SCHEMA,
    ),
]
CatalogModel = Annotated[
    str,
    Query(
        max_length=parse.MAX_NAME_CHARS,
        description="a catalog model",
        json_schema_extra={"enum": list(parse.model_names())},
    ),
]
GpuName = Annotated[
    str,
    Query(
        max_length=parse.MAX_NAME_CHARS,
        description="a catalog GPU",
        json_schema_extra={"enum": list(parse.gpu_names())},
    ),
]


def model_arg(request: Request, model: ModelName) -> ModelSpec | str:
    """A catalog model name or the id of an uploaded config.json (POST /api/model)."""
    resolved: ModelSpec | str = request.app.state.models.resolve(model)
    return resolved


def gpu_arg(gpu: GpuName) -> str:
    """A catalog GPU name (GET /api/catalog lists them)."""
    return parse.gpu(gpu)


ModelArg = Annotated[ModelSpec | str, Depends(model_arg)]
GpuArg = Annotated[str, Depends(gpu_arg)]


def _annotation(f: Field, default: Any) -> Any:
    """The parameter's type: an enum, or a number with its bounds (on the number a size suffix stands for)."""
    annotation: Any = Literal[f.choices] if f.choices else f.type  # an enum in the OpenAPI
    if f.type in (int, float) and not f.choices:
        annotation = Annotated[annotation, at.Interval(**_bounds(f))]
    if f.suffixes:  # "8k", "15T" as on the command line
        annotation = Annotated[annotation, sized(f.name)]
    return annotation | None if default is None else annotation


def _suffixed(f: Field, value: Any) -> Any:
    """A size with a k/M/G/T suffix as the number it stands for; anything else is left to the type's check."""
    if not isinstance(value, str):
        return value
    try:
        return f.parse_number(value)
    except ValueError:
        kind = "an integer" if f.type is int else "a number"
        raise ValueError(f"expected {kind}, with an optional k, M, G or T suffix") from None


def _bounds(f: Field) -> dict[str, Any]:
    """A number's bounds as FastAPI and annotated-types name them; a name's length."""
    if f.type is str:
        return {"max_length": parse.MAX_NAME_CHARS}
    if f.type is bool:
        return {}
    return {"le": f.hi, ("gt" if f.exclusive_lo else "ge"): f.lo}


def _query(f: Field, *, bounded: bool = True) -> Any:
    """FastAPI's Query for a field, inside ``Annotated``: its help, and its bounds unless the type has them."""
    bounds = _bounds(f) if bounded or f.type is str else {}
    return Query(description=f.describe(), **bounds)


def query_params(
    fields: Iterable[Field], *, unset: bool = False, required: tuple[str, ...] = ()
) -> list[inspect.Parameter]:
    """Query parameters for schema fields: the same names, defaults, bounds, choices and help as the CLI flags
    (``unset``: every default None, for filters that apply only when given; ``required``: no default at all)."""
    out = []
    for f in fields:
        default = None if unset or f.deprecated else f.default  # with an alias: None tells "not given"
        annotation: Any = Annotated[_annotation(f, default), _query(f, bounded=False)]  # inside: validators run
        given = inspect.Parameter.empty if f.name in required else default
        out.append(inspect.Parameter(f.key, inspect.Parameter.KEYWORD_ONLY, default=given, annotation=annotation))
        if f.deprecated:
            old: Any = Annotated[_annotation(f, None), Query(description=f"deprecated: {f.key}", deprecated=True)]
            out.append(inspect.Parameter(f.deprecated, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=old))
    return out


def _aliased(fields: Iterable[Field], values: dict[str, Any], *, unset: bool) -> dict[str, Any]:
    """``values`` with each deprecated alias folded into its field (both given and different: a 400)."""
    for f in fields:
        if f.deprecated:
            new, old = values[f.key], values.pop(f.deprecated)
            if new is not None and old is not None and new != old:
                raise ValueError(f"{f.key}={new} and its deprecated alias {f.deprecated}={old} differ: give {f.key}")
            values[f.key] = new if new is not None else old if old is not None else None if unset else f.default
    return values


def one(name: str) -> Any:
    """One schema field's Query (bounds and help) for an ``Annotated`` parameter."""
    return _query(field(name))


def sized(name: str) -> Any:
    """A validator reading one schema field's size suffixes ("8k", "15T") as the CLI does (after it, the
    field's bounds apply to the number)."""
    f = field(name)
    assert f.suffixes, name
    return BeforeValidator(functools.partial(_suffixed, f))


Gpus = Annotated[int, one("gpus")]
Degree = Annotated[int, one("tp")]
Seq = Annotated[int, at.Interval(**_bounds(field("seq"))), sized("seq"), _query(field("seq"), bounded=False)]
MicroBatch = Annotated[int, one("micro_batch")]
Tokens = Annotated[float, at.Interval(**_bounds(field("tokens"))), sized("tokens")]


def dependency(
    fields: Iterable[Field],
    build: Callable[[dict[str, Any]], Any],
    name: str,
    *,
    unset: bool = False,
    required: tuple[str, ...] = (),
) -> Callable[..., Any]:
    """A FastAPI dependency taking every one of ``fields`` as a query parameter, handing them to ``build``."""

    fields = tuple(fields)
    names = {f.key: f.name for f in fields}

    def dependency(**values: Any) -> Any:
        return build({names[key]: value for key, value in _aliased(fields, values, unset=unset).items()})

    params = sorted(query_params(fields, unset=unset, required=required), key=lambda p: p.name not in required)
    dependency.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    dependency.__name__ = name
    return dependency


def _finetune(values: dict[str, Any]) -> FinetuneRequest | None:
    """The fine-tuning flags (--finetune, --lora-rank, --lora-targets, --freeze); None: pre-training."""
    mode, rest = values.pop("finetune"), values
    if mode in (None, "full") and not any(rest.values()):
        return None
    return FinetuneRequest(mode=mode or "full", **rest)


def _fleet_shape(values: dict[str, Any]) -> dict[str, Any]:
    profile = values["profile"] or None
    if profile is not None:
        parse_profile(profile, files=False)  # the API takes inline scales only, never a path on the server
    return values | {
        "scale_out": parse.link(values["scale_out"]),
        "axis_order": values["axis_order"] or None,
        "profile": profile,
    }


layout_arg = dependency(fields_of(Group.LAYOUT), lambda values: LayoutRequest(**values), "layout_arg")
workload_arg = dependency(fields_of(Group.WORKLOAD), dict, "workload_arg")
finetune_arg = dependency(fields_of(Group.FINETUNE), _finetune, "finetune_arg")
fleet_shape_arg = dependency(fields_of(Group.FLEET_SHAPE), _fleet_shape, "fleet_shape_arg")
conditions_arg = dependency(fields_of(Group.CONDITIONS), dict, "conditions_arg")
ConditionsArg = Annotated[dict[str, Any], Depends(conditions_arg)]
_STACK_SET = ("precision", "attention", "kernels")  # unset: the stack's, else the schema's default (as the CLI)
memory_workload_arg = dependency(
    [dataclasses.replace(f, default=None) if f.name in _STACK_SET else f for f in fields_of(Group.WORKLOAD)],
    dict,
    "memory_workload_arg",
)
MemoryWorkloadArg = Annotated[dict[str, Any], Depends(memory_workload_arg)]
LayoutArg = Annotated[LayoutRequest, Depends(layout_arg)]
WorkloadArg = Annotated[dict[str, Any], Depends(workload_arg)]
FinetuneArg = Annotated[FinetuneRequest | None, Depends(finetune_arg)]
FleetShapeArg = Annotated[dict[str, Any], Depends(fleet_shape_arg)]
ServingArg = Annotated[
    dict[str, Any],
    Depends(
        dependency(
            [replace(f, default=None) if f.name == "weights_dtype" else f for f in fields_of(Group.SERVING)],
            lambda v: _renamed(v, weights_dtype="dtype"),
            "serving_arg",
        )
    ),
]
"""The serving fields as the serving reports' keywords (their weights' dtype is ``dtype``; left out, the dtype the
model is published in, as on the command line)."""
CostArg = Annotated[CostRequest, Depends(dependency(fields_of(Group.COST), cost_request, "cost_arg"))]
WeightsArg = Annotated[
    str | None,  # left out: the dtype the model is published in (bf16 under fine-tuning), as on the CLI
    Depends(dependency([replace(field("weights_dtype"), default=None)], lambda v: v["weights_dtype"], "weights_arg")),
]


def _renamed(values: dict[str, Any], **names: str) -> dict[str, Any]:
    return {names.get(k, k): v for k, v in values.items()}


@cache
def _catalog() -> dict[str, Any]:
    return json_dict(catalog_dict())


@router.get("/catalog", summary="Models, GPUs, links, recipes and the choices every form offers")
def catalog() -> dict[str, Any]:
    return _catalog()


@router.get(
    "/params",
    summary="Exact parameter counts by component (meshplan params)",
    responses=ok(m.ParamsReport),
    response_model=None,
)
def params(model: CatalogModel, finetune: FinetuneArg) -> dict[str, Any]:
    return json_dict(params_report(parse.catalog_model(model), finetune=finetune))


@router.get(
    "/memory",
    summary="Per-GPU training memory, term by term (meshplan memory)",
    responses=ok(m.MemoryReport),
    response_model=None,
)
def memory(
    model: ModelArg,
    gpu: GpuArg,
    gpus: Gpus,
    layout: LayoutArg,
    work: MemoryWorkloadArg,
    finetune: FinetuneArg,
    conditions: ConditionsArg,
) -> dict[str, Any]:
    report = memory_report(model, gpu=gpu, gpus=gpus, layout=layout, finetune=finetune, conditions=conditions, **work)
    return json_dict(report)


@router.get(
    "/fit",
    summary="Weights split evenly over N GPUs; with fine-tuning, the largest batch and context",
    responses=ok(m.FitReport),
    response_model=None,
)
def fit(
    model: ModelArg,
    gpu: GpuArg,
    gpus: Gpus,
    finetune: FinetuneArg,
    weights_dtype: WeightsArg,
    seq: Seq = 4096,
    precision: Annotated[
        Literal[field("precision").choices] | None, one("precision")  # type: ignore[valid-type]
    ] = None,
    headroom: Annotated[float, one("headroom")] = 0.10,
    kernels: Annotated[Literal[field("kernels").choices] | None, one("kernels")] = None,  # type: ignore[valid-type]
    stack: Annotated[Literal[field("stack").choices] | None, one("stack")] = None,  # type: ignore[valid-type]
) -> dict[str, Any]:
    report = fit_report(
        model,
        gpu=gpu,
        gpus=gpus,
        dtype=weights_dtype,
        finetune=finetune,
        seq=seq,
        precision=precision,
        headroom=headroom,
        kernels=kernels,
        conditions={"stack": stack},
    )
    return json_dict(report)


@router.get(
    "/serving",
    summary="Serving memory: weights, KV cache, what fits (meshplan serving)",
    responses=ok(sm.ServingBarReport),
    response_model=None,
)
def serving(
    model: ModelArg,
    gpu: GpuArg,
    gpus: Gpus,
    serving: ServingArg,
    tp: Annotated[int | None, one("tp")] = None,
    pp: Degree = 1,
    ep: Degree = 1,
    sequences: Annotated[int, Query(ge=1, le=parse.MAX_BATCH, description="sequences in the bill")] = 1,
    node_size: Annotated[int | None, one("node_size")] = None,
) -> dict[str, Any]:
    report = serving_report(model, gpu=gpu, gpus=gpus, tp=tp, pp=pp, ep=ep, node_size=node_size, **serving)
    return json_dict(report | {"bill": serving_bill(report, sequences=sequences)})


@router.get(
    "/estimate",
    summary="Step time, MFU and every collective of one layout (meshplan estimate)",
    responses=ok(m.EstimateReport),
    response_model=None,
)
def estimate(
    model: ModelArg,
    gpu: GpuArg,
    gpus: Gpus,
    layout: LayoutArg,
    work: MemoryWorkloadArg,
    finetune: FinetuneArg,
    shape: FleetShapeArg,
    conditions: ConditionsArg,
    cost: CostArg,
    tokens: Annotated[Tokens | None, _query(field("tokens"), bounded=False)] = None,
    timeline: Annotated[
        bool, Query(description="add the step drawn stage by stage, the memory over it and the placement")
    ] = False,
) -> dict[str, Any]:
    report = estimate_report(
        model,
        timeline=timeline,
        gpu=gpu,
        gpus=gpus,
        layout=layout,
        tokens=tokens,
        cost=cost,
        finetune=finetune,
        conditions=conditions,
        **shape,
        **work,
    )
    return json_dict(report)


@router.get(
    "/compare",
    summary="A layout's plan against its run's logged step time and memory peaks (meshplan compare)",
    response_model=None,
)
def compare(
    model: ModelArg,
    gpu: GpuArg,
    gpus: Gpus,
    layout: LayoutArg,
    work: MemoryWorkloadArg,
    finetune: FinetuneArg,
    shape: FleetShapeArg,
    conditions: ConditionsArg,
    cost: CostArg,
    step_time_s: Annotated[float | None, one("step_time_s")] = None,
    max_memory_allocated: Annotated[float | None, one("max_memory_allocated")] = None,
    max_memory_reserved: Annotated[float | None, one("max_memory_reserved")] = None,
) -> dict[str, Any]:
    from meshplan.reports.compare import compare_with_plan

    numbers = {"step_time_s": step_time_s, "max_memory_allocated": max_memory_allocated}
    numbers["max_memory_reserved"] = max_memory_reserved
    if all(v is None for v in numbers.values()):
        raise ValueError("nothing measured to compare: give step_time_s, max_memory_allocated or max_memory_reserved")
    plan = estimate_report(
        model, gpu=gpu, gpus=gpus, layout=layout, cost=cost, finetune=finetune, conditions=conditions, **shape, **work
    )
    return json_dict(compare_with_plan(plan, numbers))


@router.get(
    "/collectives",
    summary="One all-reduce over NVLink 5, NVLink 4, IB NDR and 100G Ethernet",
    responses=ok(m.CollectivesReport),
    response_model=None,
)
def collectives(
    model: CatalogModel = "llama-3.1-70b",
    size_mb: Annotated[
        float | None, Query(ge=parse.MIN_SIZE_MB, le=parse.MAX_SIZE_MB, description="buffer in MB (1e6 B)")
    ] = None,
    group: Annotated[int, Query(ge=2, le=parse.MAX_GPUS, description="ranks in the ring")] = 8,
    seq: Seq = 8192,
    micro_batch: MicroBatch = 1,
) -> dict[str, Any]:
    size = None if size_mb is None else size_mb * 1e6
    report = collectives_report(
        model=parse.catalog_model(model), size_bytes=size, group=group, seq=seq, micro_batch=micro_batch
    )
    return json_dict(report)


SERVE: tuple[str, ...] = ("input_len", "output_len", "concurrency", "rate", "dp_attention", "replicas")
SERVE += ("weights_dtype", "kv_dtype", "quant", "engine", "max_batch", "max_num_tokens", "num_requests")
SERVE += ("cuda_graph_padding", "disaggregate", "batch", "int4_group_size", "launch", "capacity_scheduler")
SERVE += ("speculative", "spec_acceptance", "draft_model", "prefix_hit_rate", "node_size")
SERVE_PLAN = SERVE_PLAN_FIELDS
_ENGINE_SET = ("weights_dtype", "kv_dtype")  # unset: the dtype the model is published in, the engine's KV (as the CLI)
LENGTHS = ("input_len", "output_len")
"""Required on the API as on the CLI: a request without its lengths has nothing to time."""
ServeArg = Annotated[
    dict[str, Any],
    Depends(
        dependency(
            [dataclasses.replace(field(n), default=None) if n in _ENGINE_SET else field(n) for n in SERVE],
            dict,
            "serve_arg",
            required=LENGTHS,
        )
    ),
]
ServePlanArg = Annotated[
    dict[str, Any], Depends(dependency([field(n) for n in SERVE_PLAN], dict, "serve_plan_arg", required=LENGTHS))
]


@router.get(
    "/serve",
    summary="Serving speed under load: TTFT, TPOT, tokens/s per GPU and per user (meshplan serve)",
    responses=ok(sm.ServeReport),
    response_model=None,
)
def serve(
    model: ModelArg,
    gpu: GpuArg,
    gpus: Gpus,
    load: ServeArg,
    tp: Annotated[int | None, one("tp")] = None,
    pp: Degree = 1,
    ep: Degree = 1,
    gpu_memory_utilization: Annotated[float | None, one("gpu_memory_utilization")] = None,
    price_per_gpu_hour: Annotated[float | None, one("price_per_gpu_hour")] = None,
) -> dict[str, Any]:
    from meshplan.reports.serve import serve_report

    if load.get("draft_model") is not None:  # a catalog model: the API reads no file a request names
        load = load | {"draft_model": parse.catalog_model(load["draft_model"])}
    report = serve_report(
        model,
        gpu=gpu,
        gpus=gpus,
        tp=tp,
        pp=pp,
        ep=ep,
        gpu_memory_utilization=gpu_memory_utilization,
        price_per_gpu_hour=price_per_gpu_hour,
        **load,
    )
    return json_dict(report)
