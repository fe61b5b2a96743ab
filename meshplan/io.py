"""Specs in and out of files: the TOML catalog, Hugging Face ``config.json``, and TOML text.

Standard library only (tomllib, json), so the CLI starts fast. Unknown keys are errors, and every
user error is a one-line ``ValueError`` that names the file and the key. Every file a user names is read by
files.py's one guarded reader (``read_text_file``, ``parse_json``, ``parse_toml``, re-exported here).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import re
import tomllib
from collections.abc import Callable, Mapping
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, TypeVar

from meshplan.files import parse_json, parse_toml, read_text_file
from meshplan.spec.cluster import GPU, GpuCalibration, Link, LinkKind, LinkTier
from meshplan.spec.conditions import Stack
from meshplan.spec.model import MLASpec, MlpKind, ModelSpec, MoESpec, NormKind
from meshplan.units import DType

_ENUMS: dict[str, type[Any]] = {"MlpKind": MlpKind, "NormKind": NormKind, "LinkKind": LinkKind, "LinkTier": LinkTier}
_TABLES: dict[str, type[Any]] = {"MoESpec | None": MoESpec, "MLASpec | None": MLASpec, "GpuCalibration": GpuCalibration}
_Spec = TypeVar("_Spec")
_SINGULAR = {"models": "model", "gpus": "gpu", "links": "link", "stacks": "stack"}


# --- the catalog -------------------------------------------------------------------------------------------------


@cache
def _catalog(kind: str) -> dict[str, Traversable]:
    folder = resources.files("meshplan") / "catalog" / kind
    return {entry.name[: -len(".toml")]: entry for entry in folder.iterdir() if entry.name.endswith(".toml")}


def list_models() -> list[str]:
    """Names of the catalog models."""
    return sorted(_catalog("models"))


def list_gpus() -> list[str]:
    """Names of the catalog GPUs."""
    return sorted(_catalog("gpus"))


def list_links() -> list[str]:
    """Names of the catalog links."""
    return sorted(_catalog("links"))


class UnknownName(ValueError):
    """A name given by the user that the catalog does not hold (a ValueError: bad input, one line)."""


MAX_ECHO_CHARS = 80
"""Longest run of a user's value an error message quotes back; past it the run is cut with an ellipsis."""
MAX_ERROR_CHARS = 2_000
"""Longest error message printed (CLI) or answered (API), whatever it quotes."""
_RUN = re.compile(rf"[^\s'\"]{{{MAX_ECHO_CHARS + 1},}}")


def bounded_message(text: str) -> str:
    """An error message fit to show: every unbroken run (a name, a number, a path) of over MAX_ECHO_CHARS
    characters cut to that many plus "...", and the whole to MAX_ERROR_CHARS. The one place the CLI and the
    API bound what a refusal echoes, so a 100 KB name is never quoted back whole."""
    text = _RUN.sub(lambda m: m.group()[:MAX_ECHO_CHARS] + "...", text)
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def list_stacks() -> list[str]:
    """Names of the catalog training stacks."""
    return sorted(_catalog("stacks"))


def _unknown_name(kind: str, name: str) -> UnknownName:
    import difflib

    names = sorted(_catalog(kind))
    close = difflib.get_close_matches(name.lower(), names, n=3, cutoff=0.5)
    hint = f"closest: {', '.join(close)}" if close else f"known: {', '.join(names)}"
    return UnknownName(f"unknown {_SINGULAR[kind]} '{name}' ({hint})")


def _looks_like_path(text: str) -> bool:
    return bool(text) and ("/" in text or "\\" in text or text.endswith((".toml", ".json")) or Path(text).exists())


def _load_table(kind: str, name_or_path: str) -> tuple[dict[str, Any], str, str]:
    """(table, label for messages, default name) of a catalog entry or a TOML file."""
    if _looks_like_path(name_or_path):
        path = Path(name_or_path)
        return parse_toml(read_text_file(path), path.name), path.name, path.stem
    entry = _catalog(kind).get(name_or_path) or _catalog(kind).get(name_or_path.lower())
    if entry is None:
        raise _unknown_name(kind, name_or_path)
    # a fresh copy each call: callers take the table apart (the [meta] table, a stack's defaults)
    return copy.deepcopy(_catalog_table(entry)), entry.name, entry.name[: -len(".toml")]


@cache
def _catalog_table(entry: Traversable) -> dict[str, Any]:
    """A catalog file, parsed once a process (the package's own files do not change under it; a validation run
    loads the same dozen entries thousands of times)."""
    return parse_toml(entry.read_text(encoding="utf-8"), entry.name)


# --- tables -> dataclasses ---------------------------------------------------------------------------------------


def _convert(type_name: str, value: Any, key: str, where: str) -> Any:
    what = f"'{key}' in {where}"
    if type_name == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{what} must be true or false, got {value!r}")
        return value
    if type_name == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{what} must be an integer, got {value!r}")
        return value
    if type_name == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{what} must be a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise ValueError(f"{what} must be a finite number, got {value!r}")
        return number
    if type_name in ("str", "str | None"):  # TOML has no null: an optional string is a string or left out
        if not isinstance(value, str):
            raise ValueError(f"{what} must be a string, got {value!r}")
        return value
    if type_name in _ENUMS:
        enum = _ENUMS[type_name]
        try:
            return enum(value)
        except ValueError:
            raise ValueError(f"{what} must be one of {', '.join(m.value for m in enum)}, got {value!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a table, got {value!r}")
    if type_name in _TABLES:
        return _build(_TABLES[type_name], value, f"[{key}] of {where}")
    if type_name == "Mapping[DType, float]":
        return _peak_flops(value, f"[{key}] of {where}")
    raise AssertionError(f"no converter for field type {type_name}")


def _peak_flops(table: Mapping[str, Any], where: str) -> dict[DType, float]:
    known = [d.value for d in DType]
    flops = {}
    for key, value in table.items():
        if key not in known:
            raise ValueError(f"unknown dtype '{key}' in {where} (known: {', '.join(known)})")
        flops[DType(key)] = _convert("float", value, key, where)
    return flops


def _build(cls: type[Any], table: Mapping[str, Any], where: str, **given: Any) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in table:
        if key not in fields:
            raise ValueError(f"unknown key '{key}' in {where} (known: {', '.join(fields)})")
    kwargs = dict(given)
    for name, f in fields.items():
        if name in table:
            kwargs[name] = _convert(str(f.type), table[name], name, where)
        elif name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"missing key '{name}' in {where}")
    try:
        return cls(**kwargs)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _without_meta(table: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    body = dict(table)
    meta = body.pop("meta", {})
    if not isinstance(meta, dict):
        raise ValueError(f"'meta' in {where} must be a table")
    return body, meta


def _model_from_table(table: dict[str, Any], where: str, default_name: str) -> ModelSpec:
    body, _ = _without_meta(table, where)
    name = {} if "name" in body else {"name": default_name}
    spec: ModelSpec = _build(ModelSpec, body, where, **name)
    return spec


# --- public loaders ----------------------------------------------------------------------------------------------


def _catalog_cached(load: Callable[[str], _Spec]) -> Callable[[str], _Spec]:
    """``load`` built once a process per catalog name (its specs are frozen, so one object serves every caller);
    a path is read afresh on every call, as the file may change between calls."""
    by_name = cache(load)

    @functools.wraps(load)
    def loaded(name_or_path: str) -> _Spec:
        if isinstance(name_or_path, str) and not _looks_like_path(name_or_path):
            return by_name(name_or_path)
        return load(name_or_path)

    return loaded


@_catalog_cached
def load_model(name_or_path: str) -> ModelSpec:
    """A catalog model by name, a model TOML file, or a Hugging Face ``config.json`` (or a folder holding one)."""
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" or path.name == "config.json":
        config = parse_json(read_text_file(path), path.name)
        if not isinstance(config, dict):
            raise ValueError(f"{path.name} must hold a JSON object, got {type(config).__name__}")
        name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
        from meshplan.hf import model_from_hf_config

        return model_from_hf_config(config, name=name)
    return _model_from_table(*_load_table("models", name_or_path))


def model_meta(name: str) -> dict[str, Any]:
    """The ``[meta]`` table of a catalog model: source, published totals, notes."""
    table, where, _ = _load_table("models", name)
    return dict(_without_meta(table, where)[1])


def gpu_meta(name: str) -> dict[str, Any]:
    """The ``[meta]`` table of a catalog GPU: its display name (as people say it: "H100 SXM 80 GB"), sources."""
    table, where, _ = _load_table("gpus", name)
    return dict(_without_meta(table, where)[1])


@cache
def held_out_band() -> dict[str, float]:
    """catalog/held_out.toml: the P10-P90 of measured over predicted step time on held-out published runs."""
    return _numbers("held_out.toml")


@cache
def serving_held_out_band() -> dict[str, float]:
    """catalog/serving/held_out.toml: per metric class of the published serving measurements, the P10, median
    and P90 of measured over predicted time, each held out of the correction (``meshplan serve``'s band)."""
    return _numbers("serving/held_out.toml")


def _numbers(path: str) -> dict[str, float]:
    """A catalog TOML file of numbers only, as floats."""
    text = (resources.files("meshplan") / "catalog" / path).read_text(encoding="utf-8")
    return {k: float(v) for k, v in tomllib.loads(text).items()}


def catalog_tables(folder: str) -> dict[str, dict[str, Any]]:
    """Every TOML file of catalog/<folder> by name (the file's stem), as it reads, in name order."""
    out = {}
    for entry in (resources.files("meshplan") / "catalog" / folder).iterdir():
        if entry.name.endswith(".toml"):
            out[entry.name.removesuffix(".toml")] = tomllib.loads(entry.read_text(encoding="utf-8"))
    return dict(sorted(out.items()))


@cache
def run_sources() -> dict[str, dict[str, Any]]:
    """catalog/runs: every published source of training throughput by name, as its TOML file reads."""
    return catalog_tables("runs")


@cache
def published_runs_by_gpu() -> dict[str, int]:
    """The published training runs of catalog/runs (those ``meshplan validate`` predicts, and whose held-out
    errors make the step-time band) on each GPU kind."""
    counts: dict[str, int] = {}
    for data in run_sources().values():
        for case in data["case"]:
            gpu = str(case.get("gpu", data.get("defaults", {}).get("gpu")))
            counts[gpu] = counts.get(gpu, 0) + 1
    return dict(sorted(counts.items()))


@_catalog_cached
def load_gpu(name_or_path: str) -> GPU:
    """A catalog GPU by name, or a GPU TOML file."""
    table, where, stem = _load_table("gpus", name_or_path)
    body, _ = _without_meta(table, where)
    gpu: GPU = _build(GPU, body, where, **({} if "name" in body else {"name": stem}))
    return gpu


@_catalog_cached
def load_stack(name_or_path: str) -> Stack:
    """A catalog training stack by name, or a stack TOML file; its defaults are checked against the schema."""
    from meshplan.spec import requests

    table, where, stem = _load_table("stacks", name_or_path)
    body, _ = _without_meta(table, where)
    raw = body.pop("defaults", {})
    if not isinstance(raw, dict):
        raise ValueError(f"'defaults' in {where} must be a table")
    allowed = [*requests.group(requests.Group.WORKLOAD), *requests.group(requests.Group.CONDITIONS)]
    try:
        defaults = requests.parse_values(raw, allowed=[f for f in allowed if f.name != "stack"], what="stack default")
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    stack: Stack = _build(Stack, body, where, defaults=defaults, **({} if "name" in body else {"name": stem}))
    return stack


@_catalog_cached
def load_link(name_or_path: str) -> Link:
    """A catalog link by name, or a link TOML file."""
    table, where, stem = _load_table("links", name_or_path)
    body, _ = _without_meta(table, where)
    link: Link = _build(Link, body, where, **({} if "name" in body else {"name": stem}))
    return link


# --- dataclasses -> TOML -----------------------------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):  # enums are str subclasses; JSON escapes are valid TOML basic-string escapes
        return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")  # TOML also forbids raw DEL
    raise TypeError(f"cannot write {type(value).__name__} as a TOML value")


def _toml_lines(obj: Any) -> list[str]:
    """Scalar fields only; nested specs are written as their own tables."""
    values = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return [f"{k} = {_toml_value(v)}" for k, v in values.items() if v is not None and not dataclasses.is_dataclass(v)]


def model_to_toml(spec: ModelSpec, *, meta: Mapping[str, Any] | None = None) -> str:
    """The model as TOML text that ``load_model`` reads back to an equal spec."""
    lines = _toml_lines(spec)
    for title, table in (("moe", spec.moe), ("mla", spec.mla)):
        if table is not None:
            lines += ["", f"[{title}]", *_toml_lines(table)]
    if meta:
        lines += ["", "[meta]", *(f"{key} = {_toml_value(value)}" for key, value in meta.items())]
    return "\n".join(lines) + "\n"


__all__ = [
    "MAX_ECHO_CHARS",
    "MAX_ERROR_CHARS",
    "UnknownName",
    "bounded_message",
    "list_gpus",
    "list_links",
    "list_models",
    "load_gpu",
    "load_link",
    "load_model",
    "model_meta",
    "model_to_toml",
]
