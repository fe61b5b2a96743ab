"""The explorer's words as data: the six strategies, the usage tiers and the serving terms (catalog/explorer)."""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources
from typing import Any

EXPLORER_GPUS = 8
STRATEGY_KEYS = ("dp", "zero", "tp", "pp", "cp", "ep")
STRATEGY_FIELDS = {
    "key",
    "name",
    "cuts",
    "holds",
    "collective",
    "how_often",
    "interconnect",
    "when",
    "example",
    "layout",
    "picture",
}
PICTURE_FIELDS = {"unit", "units", "cut", "pattern"}
TIER_FIELDS = {"key", "title", "strategies", "reason", "detail"}
TERM_FIELDS = {"name", "title", "what", "formula", "source"}
GLANCE_FIELDS = {"key", "split", "when", "sensitivity", "placement", "tier", "order"}


def _load(name: str, table: str, fields: set[str]) -> list[dict[str, Any]]:
    text = (resources.files("meshplan") / "catalog" / "explorer" / name).read_text(encoding="utf-8")
    items: list[dict[str, Any]] = tomllib.loads(text).get(table, [])
    for item in items:
        if set(item) != fields:
            missing, extra = sorted(fields - set(item)), sorted(set(item) - fields)
            raise ValueError(
                f"explorer/{name}: entry {item.get('key', item.get('name'))!r} missing {missing}, extra {extra}"
            )
    return items


@cache
def strategies() -> tuple[dict[str, Any], ...]:
    """The six strategies in explorer order."""
    items = _load("strategies.toml", "strategy", STRATEGY_FIELDS)
    keys = tuple(item["key"] for item in items)
    if keys != STRATEGY_KEYS:
        raise ValueError(f"explorer/strategies.toml: expected strategies {STRATEGY_KEYS}, got {keys}")
    for item in items:
        if set(item["picture"]) != PICTURE_FIELDS:
            raise ValueError(f"explorer/strategies.toml: picture of {item['key']} needs {sorted(PICTURE_FIELDS)}")
    return tuple(items)


@cache
def tiers() -> tuple[dict[str, Any], ...]:
    """The usage tiers, most common first; together they name every strategy once."""
    items = _load("tiers.toml", "tier", TIER_FIELDS)
    named = sorted(k for item in items for k in item["strategies"])
    if named != sorted(STRATEGY_KEYS):
        raise ValueError(f"explorer/tiers.toml: the tiers must name each strategy once, got {named}")
    return tuple(items)


@cache
def serving_terms() -> tuple[dict[str, Any], ...]:
    """What each term of the serving bar is."""
    return tuple(_load("serving_terms.toml", "term", TERM_FIELDS))


@cache
def glance() -> dict[str, dict[str, Any]]:
    """The at-a-glance words and the placement of each strategy, by key."""
    items = _load("glance.toml", "glance", GLANCE_FIELDS)
    keys = tuple(item["key"] for item in items)
    if sorted(keys) != sorted(STRATEGY_KEYS):
        raise ValueError(f"explorer/glance.toml: expected strategies {STRATEGY_KEYS}, got {keys}")
    for item in items:
        if item["tier"] not in ("scale-up", "scale-out"):
            raise ValueError(f"explorer/glance.toml: tier of {item['key']} must be scale-up or scale-out")
    return {item["key"]: item for item in items}


def pieces(picture: dict[str, Any], *, gpus: int = EXPLORER_GPUS) -> list[str]:
    """The label of each GPU's piece of the picture: 80 layers over 8 GPUs -> 'layers 1-10', ...; units that do not
    divide evenly go one more to the first GPUs (32 + 1 layers: 'layers 1-5', then 4 each), as a pipeline splits
    them; a GPU left without a unit says so."""
    units, unit = int(picture["units"]), str(picture["unit"])
    out, start = [], 0
    for i in range(gpus):
        n = units // gpus + (1 if i < units % gpus else 0)
        if n == 0:
            out.append(f"no {unit}")
        elif n == 1:
            out.append(f"{unit} {start + 1:,}")
        else:
            out.append(f"{unit}s {start + 1:,}\u2013{start + n:,}")
        start += n
    return out


def serving_bill(report: dict[str, Any], *, sequences: int) -> dict[str, Any]:
    """The serving bar: the report's terms for ``sequences`` sequences of its context, with what each is."""
    values = {
        "weights_bytes": report["weights_bytes_per_gpu"],
        "kv_cache_bytes": report["kv_bytes_per_sequence_per_gpu"] * sequences,
        "activations_bytes": report["activations_bytes_per_gpu"],
        "runtime_reserve_bytes": report["runtime_reserve_bytes_per_gpu"],
        "engine_headroom_bytes": report["engine_headroom_bytes_per_gpu"],
    }
    terms = [dict(t, value_bytes=values[t["name"]]) for t in serving_terms()]
    return {"sequences": sequences, "terms": terms, "total_bytes": sum(values.values())}
