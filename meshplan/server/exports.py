"""The export endpoint: a plan as an engine's launch configuration, through the same code as ``meshplan export``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request

from meshplan.reports.export import export_serving, export_training
from meshplan.server import parse
from meshplan.server.api import GpuArg, Gpus, LayoutArg, ModelArg, ServingArg, WorkloadArg, json_dict

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
    work: WorkloadArg,
    serving: ServingArg,
    model_path: Annotated[str | None, Query(max_length=parse.MAX_NAME_CHARS, description="--model-path")] = None,
) -> dict[str, Any]:
    """Training engines take the layout and workload flags; serving engines tp, pp, ep and the serving flags."""
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
        )
    return json_dict({"engine": to} | result)
