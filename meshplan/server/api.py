"""Report endpoints: each parses its query and calls one report function, as the CLI does."""

from __future__ import annotations

from functools import cache
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from meshplan import io
from meshplan.render import jsonable
from meshplan.reports import LayoutRequest, fit_report, memory_report, params_report, serving_report
from meshplan.reports.estimate import collectives_report, estimate_report
from meshplan.reports.inputs import FinetuneRequest
from meshplan.reports.recipes import list_report
from meshplan.server import parse
from meshplan.server.content import serving_terms
from meshplan.spec.layout import Recompute
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import PRECISIONS, OptimizerKind

router = APIRouter(prefix="/api")

Name = Annotated[str, Query(max_length=parse.MAX_NAME_CHARS)]
Gpus = Annotated[int, Query(ge=1, le=parse.MAX_GPUS, description="number of GPUs")]
Degree = Annotated[int, Query(ge=1, le=parse.MAX_DEGREE)]
Seq = Annotated[int, Query(ge=1, le=parse.MAX_SEQ, description="sequence length in tokens")]
MicroBatch = Annotated[int, Query(ge=1, le=parse.MAX_MICRO_BATCH, description="sequences per micro-batch")]
SERVING_DTYPES = ("bf16", "fp16", "fp8", "int8", "int4", "fp4")
KV_DTYPES = ("bf16", "fp16", "fp8")


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


def layout_arg(
    tp: Degree = 1,
    pp: Degree = 1,
    vpp: Annotated[int, Query(ge=1, le=64)] = 1,
    cp: Degree = 1,
    ep: Degree = 1,
    dp_shard: Annotated[int | None, Query(ge=1, le=parse.MAX_DEGREE)] = None,
    zero: Annotated[int, Query(ge=0, le=3)] = 0,
    sp: bool = False,
    recompute: Name = "none",
    schedule: Annotated[str | None, Query(max_length=parse.MAX_NAME_CHARS)] = None,
    cp_kind: Name = "ring",
    micro_batch: MicroBatch = 1,
) -> LayoutRequest:
    """The layout flags of ``meshplan memory`` / ``estimate``; degrees left at 1 are unused."""
    return LayoutRequest(
        tp=tp,
        pp=pp,
        vpp=vpp,
        cp=cp,
        ep=ep,
        dp_shard=dp_shard,
        zero=zero,
        sp=sp,
        recompute=recompute,
        schedule=schedule,
        cp_kind=cp_kind,
        micro_batch=micro_batch,
    )


def workload_arg(
    seq: Seq = 4096,
    global_batch: Annotated[int | None, Query(ge=1, le=parse.MAX_BATCH, description="sequences per step")] = None,
    precision: Name = "bf16",
    optimizer: Name = "adamw",
    optimizer_bytes: Annotated[float | None, Query(ge=0, le=64)] = None,
    attention: Name = "flash",
) -> dict[str, Any]:
    return {
        "seq": seq,
        "global_batch": global_batch,
        "precision": precision,
        "optimizer": optimizer,
        "optimizer_bytes": optimizer_bytes,
        "attention": attention,
    }


def finetune_arg(
    finetune: Name = "full",
    lora_rank: Annotated[int | None, Query(ge=1, le=1 << 16, description="adapter rank (default 16)")] = None,
    lora_targets: Annotated[str | None, Query(max_length=parse.MAX_NAME_CHARS, description="e.g. q,v")] = None,
    freeze: Annotated[str | None, Query(max_length=parse.MAX_NAME_CHARS, description="embeddings,layers=N")] = None,
) -> FinetuneRequest | None:
    """The fine-tuning flags (--finetune, --lora-rank, --lora-targets, --freeze); None: pre-training."""
    if finetune == "full" and not (freeze or lora_rank or lora_targets):
        return None
    return FinetuneRequest(mode=finetune, lora_rank=lora_rank, lora_targets=lora_targets or None, freeze=freeze)


LayoutArg = Annotated[LayoutRequest, Depends(layout_arg)]
WorkloadArg = Annotated[dict[str, Any], Depends(workload_arg)]
FinetuneArg = Annotated[FinetuneRequest | None, Depends(finetune_arg)]


@cache
def _catalog() -> dict[str, Any]:
    gpus = []
    for name in parse.gpu_names():
        g = io.load_gpu(name)
        gpus.append(
            {
                "name": name,
                "hbm_bytes": g.hbm_bytes,
                "scale_up_link": g.scale_up_link,
                "scale_up_domain": g.scale_up_domain,
                "scale_out_link": g.scale_out_link,
                "description": g.description,
            }
        )
    links = []
    for name in parse.link_names():
        lk = io.load_link(name)
        links.append(
            {
                "name": name,
                "kind": lk.kind.value,
                "tier": lk.tier.value,
                "bandwidth_bytes_per_s": lk.bandwidth_bytes_per_s,
                "latency_s": lk.latency_s,
                "description": lk.description,
            }
        )
    return json_dict(
        {
            "models": list(parse.model_names()),
            "gpus": gpus,
            "links": links,
            "recipes": list_report()["recipes"],
            "precisions": [{"name": p.name, "description": p.description} for p in PRECISIONS.values()],
            "optimizers": [o.value for o in OptimizerKind],
            "recompute": [r.name.lower() for r in Recompute],
            "serving_dtypes": list(SERVING_DTYPES),
            "kv_dtypes": list(KV_DTYPES),
            "objectives": ["step-time", "tokens-per-gpu", "headroom", "fewest-gpus"],
            "limits": {
                "gpus": parse.MAX_GPUS,
                "seq": parse.MAX_SEQ,
                "global_batch": parse.MAX_BATCH,
                "micro_batch": parse.MAX_MICRO_BATCH,
                "top": parse.MAX_TOP,
                "body_bytes": parse.MAX_BODY_BYTES,
            },
        }
    )


@router.get("/catalog", summary="Models, GPUs, links, recipes and the choices every form offers")
def catalog() -> dict[str, Any]:
    return _catalog()


@router.get("/params", summary="Exact parameter counts by component (meshplan params)")
def params(model: CatalogModel, finetune: FinetuneArg) -> dict[str, Any]:
    return json_dict(params_report(parse.catalog_model(model), finetune=finetune))


@router.get("/memory", summary="Per-GPU training memory, term by term (meshplan memory)")
def memory(
    model: ModelArg, gpu: GpuArg, gpus: Gpus, layout: LayoutArg, work: WorkloadArg, finetune: FinetuneArg
) -> dict[str, Any]:
    return json_dict(memory_report(model, gpu=gpu, gpus=gpus, layout=layout, finetune=finetune, **work))


@router.get("/fit", summary="Weights split evenly over N GPUs; with fine-tuning, the largest batch and context")
def fit(
    model: ModelArg, gpu: GpuArg, gpus: Gpus, finetune: FinetuneArg, dtype: Name = "bf16", seq: Seq = 4096
) -> dict[str, Any]:
    dtype = parse.choice(dtype, SERVING_DTYPES, "dtype")
    return json_dict(fit_report(model, gpu=gpu, gpus=gpus, dtype=dtype, finetune=finetune, seq=seq))


def serving_bill(report: dict[str, Any], *, sequences: int) -> dict[str, Any]:
    """The serving bar: the report's terms for ``sequences`` sequences of its context, with what each is."""
    values = {
        "weights_bytes": report["weights_bytes_per_gpu"],
        "kv_cache_bytes": report["kv_bytes_per_sequence"] * sequences,
        "activations_bytes": report["activations_bytes"],
        "framework_bytes": report["framework_bytes"],
    }
    terms = [dict(t, value_bytes=values[t["name"]]) for t in serving_terms()]
    return {"sequences": sequences, "terms": terms, "total_bytes": sum(values.values())}


@router.get("/serving", summary="Serving memory: weights, KV cache, what fits (meshplan serving)")
def serving(
    model: ModelArg,
    gpu: GpuArg,
    gpus: Gpus,
    tp: Annotated[int | None, Query(ge=1, le=parse.MAX_DEGREE)] = None,
    pp: Degree = 1,
    ep: Degree = 1,
    dtype: Name = "bf16",
    kv_dtype: Name = "bf16",
    context: Annotated[int | None, Query(ge=1, le=parse.MAX_SEQ)] = None,
    gpu_memory_utilization: Annotated[float, Query(gt=0, le=1)] = 0.9,
    sequences: Annotated[int, Query(ge=1, le=parse.MAX_BATCH, description="sequences in the bill")] = 1,
) -> dict[str, Any]:
    report = serving_report(
        model,
        gpu=gpu,
        gpus=gpus,
        tp=tp,
        pp=pp,
        ep=ep,
        dtype=parse.choice(dtype, SERVING_DTYPES, "dtype"),
        kv_dtype=parse.choice(kv_dtype, KV_DTYPES, "kv dtype"),
        context=context,
        gpu_memory_utilization=gpu_memory_utilization,
    )
    return json_dict(report | {"bill": serving_bill(report, sequences=sequences)})


@router.get("/estimate", summary="Step time, MFU and every collective of one layout (meshplan estimate)")
def estimate(
    model: ModelArg,
    gpu: GpuArg,
    gpus: Gpus,
    layout: LayoutArg,
    work: WorkloadArg,
    finetune: FinetuneArg,
    kernels: Name = "fused",
    node_size: Annotated[int | None, Query(ge=1, le=parse.MAX_GPUS)] = None,
    scale_out: Annotated[str | None, Query(max_length=parse.MAX_NAME_CHARS)] = None,
    axis_order: Annotated[str | None, Query(max_length=parse.MAX_NAME_CHARS)] = None,
    tokens: Annotated[float | None, Query(gt=0, le=parse.MAX_TOKENS)] = None,
) -> dict[str, Any]:
    report = estimate_report(
        model,
        gpu=gpu,
        gpus=gpus,
        layout=layout,
        kernels=kernels,
        node_size=node_size,
        scale_out=parse.link(scale_out),
        axis_order=axis_order,
        tokens=tokens,
        finetune=finetune,
        **work,
    )
    return json_dict(report)


@router.get("/collectives", summary="One all-reduce over NVLink 5, NVLink 4, IB NDR and 100G Ethernet")
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
