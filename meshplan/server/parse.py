"""Pure input parsing for the HTTP API: limits, names checked against the catalog, upload bodies.

Nothing here touches HTTP. Every function either returns a value the reports
accept or raises ValueError with a one-line message that names the input.
Names are checked against the catalog before a report sees them, because the
loaders also accept file paths and the API must never read a path it is given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from functools import cache
from typing import Any

from meshplan import files, io
from meshplan.spec.requests import (
    MAX_BATCH,
    MAX_DAYS,
    MAX_DEGREE,
    MAX_GPUS,
    MAX_MICRO_BATCH,
    MAX_SEQ,
    MAX_TOKENS,
    MAX_TOP,
)

MAX_BODY_BYTES = 256 * 1024
MAX_QUERY_CHARS = 4_096
MAX_NAME_CHARS = 200
MAX_SIZE_MB = 1e7
MIN_SIZE_MB = 1e-6
"""One byte: the smallest buffer a collective moves."""
MAX_FEWEST_GPUS = 131_072
"""The fleet where the API's fewest-gpus search stops doubling (every doubling is a whole search)."""
SEARCH_TIME_LIMIT_S = 60.0
"""A search (plan, ranked recipe) stops past this and answers 503."""

UPLOAD_PREFIX = "upload:"
UPLOAD_PATTERN = r"^upload:[0-9a-f]{12}$"
_UPLOAD_ID = re.compile(UPLOAD_PATTERN)
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


@cache
def model_names() -> tuple[str, ...]:
    return tuple(io.list_models())


@cache
def gpu_names() -> tuple[str, ...]:
    return tuple(io.list_gpus())


@cache
def link_names() -> tuple[str, ...]:
    return tuple(io.list_links())


def _one_of(value: str, known: Iterable[str], what: str) -> str:
    names = tuple(known)
    text = value.strip().lower()
    if text in names:
        return text
    import difflib

    close = difflib.get_close_matches(text, names, n=3, cutoff=0.5)
    hint = f"closest: {', '.join(close)}" if close else f"known: {', '.join(names)}"
    raise io.UnknownName(f"unknown {what} {value[:MAX_NAME_CHARS]!r} ({hint})")


def catalog_model(value: str) -> str:
    """A catalog model name, or ValueError with the closest names."""
    return _one_of(value, model_names(), "model")


def gpu(value: str) -> str:
    """A catalog GPU name."""
    return _one_of(value, gpu_names(), "gpu")


def link(value: str | None) -> str | None:
    """A catalog link name, or None for the GPU's default."""
    return None if value is None or not value.strip() else _one_of(value, link_names(), "link")


def choice(value: str, options: Iterable[str], what: str) -> str:
    """One of ``options`` (case and surrounding blanks ignored)."""
    return _one_of(value, options, what)


def is_upload_id(value: str) -> bool:
    return bool(_UPLOAD_ID.match(value.strip()))


def upload_name(value: str | None) -> str:
    """A display name for an uploaded model: letters, digits, dot, dash and underscore only."""
    text = _SAFE_NAME.sub("-", (value or "").strip())[:64].strip("-.")
    return text or "uploaded-model"


def config_body(body: bytes) -> dict[str, Any]:
    """A Hugging Face config.json body parsed into a dict, within the size limit."""
    if len(body) > MAX_BODY_BYTES:
        raise ValueError(f"config.json is {len(body)} bytes; the limit is {MAX_BODY_BYTES}")
    if not body.strip():
        raise ValueError("the request body is empty: send the contents of a config.json")
    try:
        text = body.decode(json.detect_encoding(body))  # UTF-8, or UTF-16/32 as json.loads reads bytes
    except UnicodeDecodeError as exc:
        raise ValueError(f"malformed JSON: not UTF-8/16/32 text (byte {exc.start})") from None
    data = files.parse_json(text, "config.json")
    if not isinstance(data, dict):
        raise ValueError(f"config.json must hold a JSON object, got {type(data).__name__}")
    return data


def json_body(body: bytes, what: str) -> Any:
    """A JSON request body (``what`` names it in a refusal), within the size limit."""
    if len(body) > MAX_BODY_BYTES:
        raise ValueError(f"{what} is {len(body)} bytes; the limit is {MAX_BODY_BYTES}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"malformed JSON: not UTF-8 text (byte {exc.start})") from None
    return files.parse_json(text, what, unique_keys=True)


def flag(value: str | bool | None) -> bool:
    """true/false, 1/0, yes/no, on/off."""
    if isinstance(value, bool):
        return value
    text = (value or "").strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


def validation_message(errors: Iterable[dict[str, Any]]) -> str:
    """One line from FastAPI's validation errors: which input, what was wrong, what was given."""
    parts = []
    for err in errors:
        loc = [str(x) for x in err.get("loc", ()) if x not in ("query", "path", "body")]
        name = ".".join(loc) or "input"
        msg = str(err.get("msg", "invalid value"))
        msg = msg.removeprefix("Value error, ")  # a validator's own ValueError already says what was wrong
        msg = msg[0].lower() + msg[1:] if msg else msg
        given = err.get("input")
        got = f" (got {str(given)[:80]!r})" if isinstance(given, str | int | float) else ""
        parts.append(f"{name}: {msg}{got}")
    return "; ".join(parts) or "invalid input"


__all__ = [
    "MAX_BATCH",
    "MAX_BODY_BYTES",
    "MAX_DAYS",
    "MAX_DEGREE",
    "MAX_GPUS",
    "MAX_MICRO_BATCH",
    "MAX_NAME_CHARS",
    "MAX_QUERY_CHARS",
    "MAX_SEQ",
    "MAX_SIZE_MB",
    "MAX_TOKENS",
    "MAX_TOP",
    "MIN_SIZE_MB",
    "SEARCH_TIME_LIMIT_S",
    "UPLOAD_PATTERN",
    "UPLOAD_PREFIX",
    "catalog_model",
    "choice",
    "config_body",
    "flag",
    "gpu",
    "is_upload_id",
    "link",
    "upload_name",
    "validation_message",
]
