"""Explorer endpoints: the six strategies on 8 GPUs, the usage tiers, the TP MLP split, config.json uploads."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from meshplan import io
from meshplan.reports import LayoutRequest, memory_report
from meshplan.server import parse
from meshplan.server.api import GpuArg, MicroBatch, ModelArg, Seq, json_dict
from meshplan.server.content import EXPLORER_GPUS, glance, pieces, serving_terms, strategies, tiers
from meshplan.server.tp_split import MAX_DIM, MAX_RANKS, tp_mlp_split
from meshplan.spec.model import ModelSpec

router = APIRouter(prefix="/api")
Dim = Annotated[int, Query(ge=1, le=MAX_DIM)]


def _strategy(item: dict[str, Any], model: ModelSpec | str, *, gpu: str, seq: int, micro_batch: int) -> dict[str, Any]:
    """One strategy card: its words, each GPU's piece, and its memory bill on 8 GPUs (or why it does not apply).

    The pictures count the chosen model's own units: its layers, the sequence asked for, its experts (none for a
    dense model).
    """
    spec = model if isinstance(model, ModelSpec) else io.load_model(model)
    own = {"layer": spec.num_layers, "token": seq, "expert": spec.moe.num_experts if spec.moe is not None else 0}
    unit = item["picture"]["unit"]
    if unit in own:
        item = item | {"picture": item["picture"] | {"units": own[unit]}}
    labels = pieces(item["picture"])
    words = {k: v for k, v in glance()[item["key"]].items() if k != "key"}
    out = {k: item[k] for k in item if k != "layout"} | {"layout_request": item["layout"], "glance": words}
    try:
        layout = LayoutRequest.parse(item["layout"] | {"micro_batch": micro_batch})
        report = memory_report(model, gpu=gpu, gpus=EXPLORER_GPUS, layout=layout, seq=seq)
    except ValueError as exc:
        return out | {
            "applies": False,
            "reason": str(exc),
            "gpus": [{"gpu": i, "piece": p} for i, p in enumerate(labels)],
        }
    # Stage totals per GPU when the layout pipelines (GPU i runs stage i), else every GPU carries the same bill.
    pp = report["layout"]["pp"]
    totals = [s["total_bytes"] for s in report["stages"]]
    per_gpu = [totals[i * pp // EXPLORER_GPUS] for i in range(EXPLORER_GPUS)]
    return out | {
        "applies": True,
        "memory": report,
        "gpus": [{"gpu": i, "piece": labels[i], "total_bytes": per_gpu[i]} for i in range(EXPLORER_GPUS)],
    }


@router.get("/strategies", summary="The six strategies on 8 GPUs, each with its memory bill for one model")
def strategy_cards(
    model: ModelArg,
    gpu: GpuArg,
    seq: Seq = 4096,
    micro_batch: MicroBatch = 1,
) -> dict[str, Any]:
    cards = [_strategy(item, model, gpu=gpu, seq=seq, micro_batch=micro_batch) for item in strategies()]
    name = model.name if isinstance(model, ModelSpec) else model
    return json_dict({"model": name, "gpu": gpu, "gpus": EXPLORER_GPUS, "seq": seq, "strategies": cards})


@router.get("/tiers", summary="How common each strategy is, in three tiers, with the reasons")
def usage_tiers() -> dict[str, Any]:
    names = {s["key"]: s["name"] for s in strategies()}
    return {"tiers": [t | {"names": [names[k] for k in t["strategies"]]} for t in tiers()]}


@router.get("/serving-terms", summary="What each term of the serving bill is")
def serving_term_list() -> dict[str, Any]:
    return {"terms": list(serving_terms())}


@router.get("/tp-split", summary="The tensor-parallel MLP split on small random matrices, checked numerically")
def tp_split(
    ranks: Annotated[int, Query(ge=1, le=MAX_RANKS)] = 4,
    rows: Annotated[int, Query(ge=1, le=MAX_DIM, description="token rows of the activation matrix")] = 4,
    hidden: Dim = 8,
    ffn: Dim = 16,
    activation: Annotated[str, Query(max_length=16)] = "gelu",
    seed: Annotated[int, Query(ge=0, lt=2**32)] = 0,
) -> dict[str, Any]:
    return tp_mlp_split(tokens=rows, hidden=hidden, ffn=ffn, ranks=ranks, activation=activation, seed=seed)


@router.post(
    "/model",
    summary="Upload a Hugging Face config.json; the answer's id works as model in the other endpoints",
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}},
)
async def upload_model(
    request: Request, name: Annotated[str | None, Query(max_length=parse.MAX_NAME_CHARS)] = None
) -> dict[str, Any]:
    body = await read_limited(request)
    # parsing and checking a config is CPU work: off the event loop, so other requests keep being served
    model_id, spec = await run_in_threadpool(request.app.state.models.add, body, name=name)
    return json_dict({"id": model_id, "name": spec.name, "spec": spec})


async def read_limited(request: Request) -> bytes:
    """The request body, refused past MAX_BODY_BYTES even when no Content-Length was sent."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > parse.MAX_BODY_BYTES:
            raise BodyTooLarge(size)
        chunks.append(chunk)
    return b"".join(chunks)


class BodyTooLarge(Exception):
    """A request body over the limit (answered with 413)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"request body over {parse.MAX_BODY_BYTES} bytes (read {size} so far)")
