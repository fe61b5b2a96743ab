"""The export endpoint: a plan as an engine's launch configuration, through the same code as ``meshplan export``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from meshplan.reports.export import export_serving, export_training
from meshplan.server import parse
from meshplan.server.api import KV_DTYPES, SERVING_DTYPES, GpuArg, Gpus, LayoutArg, ModelArg, Name, json_dict

router = APIRouter(prefix="/api")
TRAINING_ENGINES = ("torchtitan", "megatron", "deepspeed")
SERVING_ENGINES = ("vllm", "sglang")


@router.get(
    "/export", summary="A plan as a torchtitan / Megatron-LM / DeepSpeed / vLLM / SGLang config (meshplan export)"
)
def export(
    engine: Name,
    model: ModelArg,
    gpu: GpuArg,
    gpus: Gpus,
    layout: LayoutArg,
    seq: Annotated[int, Query(ge=1, le=parse.MAX_SEQ)] = 4096,
    global_batch: Annotated[int | None, Query(ge=1, le=parse.MAX_BATCH)] = None,
    precision: Name = "bf16",
    dtype: Name = "bf16",
    kv_dtype: Name = "bf16",
    context: Annotated[int | None, Query(ge=1, le=parse.MAX_SEQ)] = None,
    gpu_memory_utilization: Annotated[float, Query(gt=0, le=1)] = 0.9,
    model_path: Annotated[str | None, Query(max_length=parse.MAX_NAME_CHARS)] = None,
) -> dict[str, Any]:
    """Training engines take the layout flags; serving engines take tp, pp, ep and the serving flags, as the CLI."""
    name = parse.choice(engine, TRAINING_ENGINES + SERVING_ENGINES, "engine")
    if name in SERVING_ENGINES:
        if not isinstance(model, str):
            raise ValueError(f"{name} exports take a catalog model; an uploaded config.json has no checkpoint to serve")
        result = export_serving(
            name,
            model,
            gpu=gpu,
            gpus=gpus,
            tp=None if layout.tp == 1 and layout.pp == 1 else layout.tp,
            pp=layout.pp,
            ep=layout.ep,
            dtype=parse.choice(dtype, SERVING_DTYPES, "dtype"),
            kv_dtype=parse.choice(kv_dtype, KV_DTYPES, "kv dtype"),
            context=context,
            gpu_memory_utilization=gpu_memory_utilization,
            model_path=model_path,
        )
    else:
        result = export_training(
            name,
            model,
            gpu=gpu,
            gpus=gpus,
            layout=layout,
            seq=seq,
            global_batch=global_batch,
            precision=precision,
            model_path=model_path,
        )
    return json_dict({"engine": name} | result)
