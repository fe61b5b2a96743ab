"""What reading an engine's configuration gives: schema values with the key each came from, the keys not read
with what each would change, and the model the file names.

Each engine's reader (one module per engine in this package) fills a :class:`Reading` key by key: ``take``
parses a value through the schema field it maps to (the same parsing as the field's flag, so a file and a flag
mean the same thing), ``skip`` lists a key meshplan does not read with what it would change. A key two places of
the file state differently is refused, never settled silently.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from meshplan.spec.requests import field as schema_field

MAX_UNREAD = 400
"""Keys a file may hold that meshplan does not read; beyond, the file is refused (a file of junk, not a config)."""
NO_EFFECT = "nothing meshplan bills (logging, data, checkpoints, learning rate and the like)"
UNKNOWN = "not known to meshplan: whatever it changes is not in the estimate"


SERVING_KINDS = ("vllm", "sglang", "trtllm")
"""The kinds that launch a serving engine (``serve`` and ``serve-plan`` read them; the rest are training configs)."""
COMMANDS = {
    "vllm": r"\bvllm\s+serve\b|vllm\.entrypoints",
    "sglang": r"sglang\.launch_server|\bsglang\s+serve\b",
    "trtllm": r"\btrtllm-(serve|bench)\b",
}
"""What a line that starts each engine's server holds."""


def launches(text: str, kind: str) -> bool:
    """Whether a line of ``text`` (not a comment) starts ``kind``'s server: a vLLM file without one is a ``vllm serve
    --config`` YAML, a TensorRT-LLM one the LLM-API options YAML."""
    return re.search(rf"^[^#\n]*({COMMANDS[kind]})", text, re.MULTILINE) is not None


@dataclass(frozen=True, slots=True)
class Unread:
    """A key of the file meshplan does not read, its value as written, and what it would change."""

    key: str
    value: str
    effect: str

    def as_dict(self) -> dict[str, str]:
        return {"key": self.key, "value": self.value, "would_change": self.effect}


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigRead:
    """An engine's configuration as meshplan reads it."""

    kind: str
    """Which reader: torchtitan, megatron, nemo, deepspeed, accelerate, vllm or sglang."""
    label: str
    """The file, as errors and the report name it."""
    values: Mapping[str, Any]
    """Schema field name -> value, parsed through the field."""
    sources: Mapping[str, str]
    """Schema field name -> the key (or keys) of the file it came from."""
    model: str | None = None
    """A catalog model name the file identifies, or None (then the command's MODEL names it)."""
    model_source: str = ""
    model_shape: Mapping[str, int] = field(default_factory=dict)
    """Model dimensions the file states (num_layers, hidden, ...), checked against the model used."""
    unread: tuple[Unread, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def training(self) -> bool:
        return self.kind not in SERVING_KINDS


def integer(value: Any, key: str, label: str, *, low: int = -1, high: int = 1 << 20) -> int:
    """A file's value that must be a whole number in [low, high]; ValueError naming the file and the key."""
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).strip().lstrip("-").isdigit():
        raise ValueError(f"{label}: {key} = {short(value)} is not a whole number")
    number = int(value)
    if not low <= number <= high:
        raise ValueError(f"{label}: {key} = {number} is outside [{low}, {high}]")
    return number


def short(value: Any) -> str:
    """A value as the report shows it: at most 80 characters."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class Reading:
    """A :class:`ConfigRead` being built, key by key."""

    def __init__(self, kind: str, label: str) -> None:
        self.kind, self.label = kind, label
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}
        self.unread: list[Unread] = []
        self.notes: list[str] = []
        self.model: str | None = None
        self.model_source = ""
        self.model_shape: dict[str, int] = {}
        self.read_keys: set[str] = set()
        """The file's keys read into the values (the readers list the rest as not read)."""

    def take(self, name: str, raw: Any, key: str) -> None:
        """Set schema field ``name`` from the file's ``key``; ValueError (naming the key) for a value the field
        refuses or one that another key already set differently."""
        f = schema_field(name)
        if not isinstance(raw, str | int | float | bool):
            raise ValueError(f"{self.label}: {key} = {short(raw)} is not a single value")
        try:
            value = f.parse(raw)
        except ValueError as exc:
            raise ValueError(f"{self.label}: {key} = {short(raw)}: {str(exc).removeprefix(f.flag + ': ')}") from None
        if name in self.values and self.values[name] != value:
            raise ValueError(
                f"{self.label}: {key} = {short(raw)} disagrees with {self.sources[name]} "
                f"({f.flag} {short(self.values[name])})"
            )
        if name not in self.values:
            self.sources[name] = key
        self.values[name] = value

    def drop(self, name: str, effect: str) -> None:
        """Take back a value the engine itself ignores, listing its key as not read (Megatron drops sequence
        parallelism when TP is 1)."""
        if name in self.values:
            self.skip(self.sources.pop(name), self.values.pop(name), effect)

    def skip(self, key: str, value: Any, effect: str = NO_EFFECT) -> None:
        """List ``key`` as not read, with what it would change."""
        self.unread.append(Unread(key, short(value), effect))
        if len(self.unread) > MAX_UNREAD:
            raise ValueError(
                f"{self.label} holds over {MAX_UNREAD} keys meshplan does not read: is it a {self.kind} config?"
            )

    def account(self, keys: dict[str, Any], effect: str) -> None:
        """List, with ``effect``, each of ``keys`` that no value's source names and no row lists: a key the reader
        took in but that set nothing (a flag the others make moot) is shown, never dropped silently."""
        named = " ".join([*self.sources.values(), self.model_source, *(u.key for u in self.unread), *self.read_keys])
        for key, value in keys.items():
            if key not in named:
                self.skip(key, value, effect)

    def shape(self, name: str, raw: Any, key: str) -> None:
        """A model dimension the file states (to identify the model, or to check the one named)."""
        try:
            value = int(raw)
        except (TypeError, ValueError):
            raise ValueError(f"{self.label}: {key} = {short(raw)} is not an integer") from None
        self.model_shape[name] = value

    def name_model(self, name: str, source: str) -> None:
        self.model, self.model_source = name, source

    def done(self) -> ConfigRead:
        if self.values.get("sp") and self.values.get("tp", 1) == 1:
            self.drop("sp", "sequence parallelism with TP 1: the engine turns it off")
        if self.model is None and self.model_shape:
            keys = ", ".join(f"{k}={v}" for k, v in self.model_shape.items())
            found = catalog_matches(self.model_shape)
            if len({tuple(_catalog_shapes()[n].values()) for n in found}) == 1:
                also = f"; also {', '.join(found[1:])}" if found[1:] else ""
                self.name_model(found[0], f"the catalog model of the file's shape ({keys}{also})")
            elif found:
                self.notes.append(f"the file's shape ({keys}) fits {', '.join(found)}: name the model")
        return ConfigRead(
            kind=self.kind,
            label=self.label,
            values=dict(self.values),
            sources=dict(self.sources),
            model=self.model,
            model_source=self.model_source,
            model_shape=dict(self.model_shape),
            unread=tuple(self.unread),
            notes=tuple(self.notes),
        )


SHAPE_KEYS = ("num_layers", "hidden", "ffn_hidden", "num_heads", "num_kv_heads", "vocab_size")


@cache
def _catalog_shapes() -> dict[str, dict[str, int]]:
    from meshplan.io import list_models, load_model

    out = {}
    for name in list_models():
        spec = load_model(name)
        out[name] = {k: int(getattr(spec, k)) for k in SHAPE_KEYS}
    return out


def catalog_matches(shape: Mapping[str, int]) -> list[str]:
    """The catalog models whose dimensions agree with every one ``shape`` states, sorted (none when the shape
    names no depth and width). A reading names the model only when they all share every dimension (Llama 3.1
    and 3.3 70B); where they differ in one the file leaves out (Llama 2 7B and Llama 3.1 8B, told apart by their
    FFN and vocabulary), the user names it."""
    if "num_layers" not in shape or "hidden" not in shape:
        return []
    return sorted(
        name
        for name, dims in _catalog_shapes().items()
        if all(dims[k] == v for k, v in shape.items() if k in dims and not (k == "num_kv_heads" and v == 0))
    )


def catalog_match(shape: Mapping[str, int]) -> str | None:
    """The one catalog model of that shape (the first of several that share every dimension), else None."""
    found = catalog_matches(shape)
    return found[0] if found and len({tuple(_catalog_shapes()[n].values()) for n in found}) == 1 else None


def check_shape(model: Any, shape: Mapping[str, int], label: str) -> None:
    """ValueError when the model used disagrees with a dimension the file states."""
    for key, value in shape.items():
        have = getattr(model, key, None)
        if have is not None and int(have) != value:
            raise ValueError(f"{label} states {key} = {value}, but model {model.name} has {have}: name the model")


@cache
def hf_repos() -> dict[str, str]:
    """Hugging Face repository (lower case) -> catalog model name, from the catalog's meta tables."""
    from meshplan.io import list_models, model_meta

    out = {}
    for name in list_models():
        repo = model_meta(name).get("hf_repo")
        if isinstance(repo, str):
            out[repo.lower()] = name
    return out
