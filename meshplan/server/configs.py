"""``POST /api/config``: an engine's config uploaded, read as ``--from FILE`` reads it.

The body is JSON, ``{"text": FILE'S TEXT, "kind": ENGINE (optional)}`` (JSON, as every body the server takes:
the guard refuses other bodies from other sites), the text being a torchtitan TOML or config module, Megatron-LM
flags, a NeMo / Megatron-Bridge or accelerate YAML, a DeepSpeed JSON, or a vLLM / SGLang / TensorRT-LLM launch
command. The answer holds the request values it gives (each with the key it came from), the model it names, and
every key not read with what it would change; ``query`` is those values as the query parameters of ``/api/estimate``,
``/api/memory`` or ``/api/serve``, to which the client adds what the file lacks (the GPU) and its own overrides.
Nothing is kept on the server.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from meshplan import files
from meshplan.configs import KINDS, ConfigRead, read_config_text
from meshplan.server import parse
from meshplan.server.explorer import read_limited
from meshplan.spec.requests import field

router = APIRouter(prefix="/api")
BODY_SCHEMA = {
    "type": "object",
    "required": ["text"],
    "additionalProperties": False,
    "properties": {
        "text": {"type": "string", "description": "the config file's contents"},
        "kind": {"type": "string", "enum": list(KINDS), "description": "the engine, when it cannot be told"},
    },
}


def _text(body: bytes) -> tuple[str, str | None]:
    """(the config's text, its kind or None) from the JSON body."""
    if not body.strip():
        raise ValueError('the request body is empty: send {"text": the contents of an engine\'s config}')
    try:
        raw = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"the request body is not UTF-8 text (byte {exc.start})") from None
    data = files.parse_json(raw, "the request body")
    if not isinstance(data, dict) or not isinstance(data.get("text"), str) or set(data) - {"text", "kind"}:
        raise ValueError('the request body must be {"text": "...", "kind": "..." (optional)}')
    kind = data.get("kind")
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind {str(kind)[:40]!r} is not one of {', '.join(KINDS)}")
    return data["text"], kind


def config_answer(read: ConfigRead) -> dict[str, Any]:
    """The JSON answer of one config read."""
    values = dict(read.values)
    query = {field(name).key: value for name, value in values.items()}
    if read.model is not None:
        query["model"] = read.model
    return {
        "kind": read.kind,
        "training": read.training,
        "model": {"value": read.model, "from": read.model_source or None},
        "values": [{"field": k, "value": v, "from": read.sources[k]} for k, v in values.items()],
        "query": query,
        "not_read": [u.as_dict() for u in read.unread],
        "notes": list(read.notes),
    }


def _read(body: bytes) -> dict[str, Any]:
    if len(body) > parse.MAX_BODY_BYTES:
        raise ValueError(f"the config is {len(body)} bytes; the limit is {parse.MAX_BODY_BYTES}")
    text, kind = _text(body)
    return config_answer(read_config_text(text, "the uploaded config", kind))


@router.post(
    "/config",
    summary="Upload an engine's config (torchtitan, Megatron-LM, NeMo, DeepSpeed, accelerate, vLLM, SGLang): the "
    "request values it gives, where each came from, and the keys not read",
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": BODY_SCHEMA}}}},
)
async def upload_config(request: Request) -> dict[str, Any]:
    body = await read_limited(request)
    return await run_in_threadpool(_read, body)
