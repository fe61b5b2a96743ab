"""The export endpoint: a plan as an engine's launch configuration, through the same code as ``meshplan export``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from meshplan import io
from meshplan.reports.export import export_serve_plan_data, export_serving, export_training, over_hbm_words
from meshplan.server import parse
from meshplan.server.api import (
    ConditionsArg,
    GpuArg,
    Gpus,
    LayoutArg,
    MemoryWorkloadArg,
    ModelArg,
    ServingArg,
    json_dict,
)
from meshplan.server.explorer import read_limited

router = APIRouter(prefix="/api")
TRAINING_ENGINES = ("torchtitan", "megatron", "deepspeed")
SERVING_ENGINES = ("vllm", "sglang")
Engine = Literal["torchtitan", "megatron", "deepspeed", "vllm", "sglang"]


@router.get(
    "/export", summary="A plan as a torchtitan / Megatron-LM / DeepSpeed / vLLM / SGLang config (meshplan export)"
)
def export(
    request: Request,
    to: Annotated[Engine, Query(description="the engine: meshplan export ENGINE")],
    model: ModelArg,
    gpu: GpuArg,
    gpus: Gpus,
    layout: LayoutArg,
    work: MemoryWorkloadArg,
    serving: ServingArg,
    conditions: ConditionsArg,
    model_path: Annotated[str | None, Query(max_length=parse.MAX_NAME_CHARS, description="--model-path")] = None,
    force: Annotated[
        bool, Query(description="export a training layout whose bill is over the GPU's HBM (refused otherwise)")
    ] = False,
) -> dict[str, Any]:
    """Training engines take the layout and workload flags; serving engines tp, pp, ep and the serving flags.
    A training layout billed over HBM is refused (400, with the bill and the HBM) unless ``force`` is set; then
    the answer carries the same warning first among its notes."""
    if to in SERVING_ENGINES:
        if not isinstance(model, str):
            raise ValueError(f"{to} exports take a catalog model; an uploaded config.json has no checkpoint to serve")
        result = export_serving(
            to,
            model,
            gpu=gpu,
            gpus=gpus,
            tp=layout.tp if {"tp", "pp"} & set(request.query_params) else None,  # absent: the whole domain
            pp=layout.pp,
            ep=layout.ep,
            model_path=model_path,
            **serving,
        )
    else:
        result = export_training(
            to,
            model,
            gpu=gpu,
            gpus=gpus,
            layout=layout,
            seq=work["seq"],
            global_batch=work["global_batch"],
            precision=work["precision"],
            model_path=model_path,
            # the stack and the run conditions the query states (left out: the engine's stack decides, as the CLI)
            conditions={k: v for k, v in conditions.items() if k in request.query_params and v is not None}
            | {k: work[k] for k in ("attention", "kernels") if work.get(k) is not None},
        )
        result = _over_hbm(result, gpu=gpu, force=force)
    return json_dict({"engine": to} | result)


def _over_hbm(result: dict[str, Any], *, gpu: str, force: bool) -> dict[str, Any]:
    """A training export whose predicted bill per GPU is over the GPU's HBM: refused unless forced (the export's
    notes then say so first, as the CLI's do)."""
    hbm = io.load_gpu(gpu).hbm_bytes
    need = result["predicted"]["memory_bytes_per_gpu"]
    if need > hbm and not force:
        raise ValueError(f"{over_hbm_words(need, hbm, gpu)}; change the layout, or export it anyway with force=true")
    return result


@router.post(
    "/export-plan",
    summary="A serve-plan answer's best plan as vLLM / SGLang / TensorRT-LLM flags (meshplan export --from-plan)",
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}},
)
async def export_plan(
    request: Request,
    to: Annotated[Literal["vllm", "sglang", "trtllm"], Query(description="the engine: meshplan export ENGINE")],
    model_path: Annotated[str | None, Query(max_length=parse.MAX_NAME_CHARS, description="--model-path")] = None,
) -> dict[str, Any]:
    """The body is the answer of /api/serve-plan (what ``serve-plan --save`` writes): checked field by field and
    recomputed as ``meshplan export ENGINE --from-plan`` checks a saved file, so the replicas, TP and batch cap
    exported are the plan's."""
    body = await read_limited(request)
    data = parse.json_body(body, "the serving plan")
    result = await run_in_threadpool(export_serve_plan_data, to, data, model_path=model_path)
    return json_dict({"engine": to} | result)
