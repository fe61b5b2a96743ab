"""One input of the request schema: its type, default, bounds, unit and help, and how text becomes its value.

Values are parsed here with one-line errors that name the field's flag; the limits every field's bounds use
(fleets, degrees, sequences, batches) are named here once.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

MAX_GPUS = 10_000_000
"""The largest fleet meshplan plans for, everywhere: about 100 times the largest cluster built (2026)."""
MAX_DEGREE = 131_072
MAX_SEQ = 1 << 20
"""Longest training sequence (1M tokens, the longest published context-parallel runs)."""
MAX_CONTEXT = 1 << 24
"""Longest served context (16M tokens; Llama 4 Scout serves 10M)."""
MAX_BATCH = 1 << 24
MAX_MICRO_BATCH = 4096
MAX_TOKENS = 1e16
MAX_DAYS = 3650.0
MAX_TOP = 50

_DEFAULT_IN_HELP = re.compile(r" \(default: [^()]*\)|; default: [^;()]*(?=\))")
"""A default the help text states itself, removed where the caller states it (``describe(default_text=...)``)."""
_BINARY = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DECIMAL = {"k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9, "t": 1e12}


class Group(StrEnum):
    """Where a field belongs: what it describes."""

    FLEET = "fleet"
    """Which GPUs and how many."""
    FLEET_SHAPE = "fleet shape"
    """How the fleet is wired: scale-up domain, scale-out link, mesh axis order."""
    LAYOUT = "layout"
    """How the model is split and scheduled."""
    WORKLOAD = "workload"
    """What one step computes: sequence, batch, precision, optimizer, kernels."""
    FINETUNE = "fine-tuning"
    """What trains."""
    CONDITIONS = "conditions"
    """How the run was set up: its training stack and the conditions the stack sets (each overridable)."""
    SEARCH = "search"
    """What the planner searches for and how it ranks."""
    COST = "cost and goodput"
    """What a GPU-hour costs, how checkpoints are written and how often GPUs fail: time to train in dollars and
    with failures paid."""
    SERVING = "serving"
    """How a served model is stored and how much of HBM the engine may take."""
    SERVE = "serving load"
    """Requests, load, engine and latency targets of ``serve`` and ``serve-plan``."""
    MEASURED = "measured"
    """What a run measured, as a training loop logs it: ``compare``'s plain numbers."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Field:
    """One input: its name is the Python keyword, the JSON key, the query parameter and (dashed) the flag."""

    name: str
    type: type
    """int, float, bool or str."""
    default: Any
    help: str
    group: Group
    unit: str = ""
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    suffixes: bool = False
    """Accept k/M/G/T multipliers: binary (8k = 8192) for integers, decimal (15T = 15e12) for floats."""
    exclusive_lo: bool = False
    """The lower bound itself is refused (a share above 0, a positive float)."""
    alias: str = ""
    """The flag and query name where the field's own would collide: serving's objective is ``--objective``."""
    deprecated: str = ""
    """An older name the field still answers to, as a flag and a query parameter (``--dtype`` for
    ``--weights-dtype``); help says it is deprecated."""

    @property
    def key(self) -> str:
        """The name users type: the query parameter, and (dashed) the flag."""
        return self.alias or self.name

    @property
    def bare_help(self) -> str:
        """The help without the default it may state (where a command states its own)."""
        return _DEFAULT_IN_HELP.sub("", self.help)

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    def describe(self, default: Any = None, *, unset: bool = False, default_text: str | None = None) -> str:
        """The help line with its unit, range and default, as the CLI and the OpenAPI show it (``unset``: a command
        where leaving the field out means something else than its default, said in its help); ``default_text``
        says in words what happens when the field is not given (it replaces any default the help names)."""
        default = None if unset else self.default if default is None else default
        parts = [self.bare_help if default_text else self.help]
        if self.unit:
            parts.append(f"[{self.unit}]")
        if self.suffixes:
            parts.append("(8k = 8192, 1M = 1048576)" if self.type is int else "(15T = 15e12, 2.5M = 2.5e6)")
        if default_text:
            parts.append(f"(default: {default_text})")
        elif default is not None and self.type is not bool:
            parts.append(f"(default: {default})")
        if self.deprecated:
            parts.append(f"(--{self.deprecated.replace('_', '-')}: a deprecated alias)")
        return " ".join(parts)

    def parse(self, text: str | int | float | bool) -> Any:
        """A value from text (a flag, a query string, a compare item) or from a TOML/JSON value."""
        if self.type is bool:
            return _boolean(self, text)
        if self.type is str:
            return self._choice(str(text))
        number = _number(self, text)
        self.check(number)
        return number

    def parse_number(self, text: str) -> int | float:
        """A number from text, size suffixes included, before its bounds are checked."""
        return _number(self, text)

    def check(self, value: Any) -> None:
        """Raise ValueError naming the field when ``value`` is outside its bounds or choices."""
        if value is None:
            return
        if self.choices and value not in self.choices:
            raise ValueError(f"{self.flag}: {value!r} is not one of {', '.join(self.choices)}")
        if self.type in (int, float):
            if not math.isfinite(value):
                raise ValueError(f"{self.flag}: expected a finite number, got {value}")
            low_bad = self.lo is not None and (value <= self.lo if self.exclusive_lo else value < self.lo)
            if low_bad or (self.hi is not None and value > self.hi):
                raise ValueError(f"{self.flag}: {value:g} is outside {self.range_text()}")

    def range_text(self) -> str:
        left = "(" if self.exclusive_lo else "["
        return f"{left}{self.lo:g}, {self.hi:g}]"

    def _choice(self, text: str) -> str:
        value = text.strip().lower()
        if not self.choices or value in self.choices:
            return value if self.choices else text.strip()
        import difflib

        close = difflib.get_close_matches(value, self.choices, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ValueError(f"{self.flag}: {text.strip()[:80]!r} is not one of {', '.join(self.choices)}{hint}")


def _boolean(f: Field, text: str | int | float | bool) -> bool:
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{f.flag}: expected true or false, got {str(text)[:80]!r}")


def _number(f: Field, text: str | int | float | bool) -> int | float:
    if isinstance(text, bool):
        raise ValueError(f"{f.flag}: expected a number, got {text}")
    raw = text if isinstance(text, int | float) else _number_text(f, text)
    if f.type is int:
        if isinstance(raw, float) and not raw.is_integer():
            raise ValueError(f"{f.flag}: expected an integer, got {text}")
        return int(raw)
    return float(raw)


def _number_text(f: Field, text: str) -> int | float:
    """A number as the CLI and the API both spell it: ASCII digits, sign, '.', 'e', '_' and the field's suffixes
    (Python's int() and float() also read other scripts' digits, '٨' as 8: the API's own parsing does not)."""
    value = text.strip().lower().replace("_", "")
    if not value.isascii():
        raise ValueError(
            f"{f.flag}: expected {'an integer' if f.type is int else 'a number'} in ASCII digits, "
            f"got {text.strip()[:80]!r}"
        )
    scale: float = 1
    table = _BINARY if f.type is int else _DECIMAL
    if f.suffixes and value and value[-1] in table:
        value, scale = value[:-1], table[value[-1]]
    what = "an integer" if f.type is int else "a number"
    try:
        number = int(value) if f.type is int and scale == 1 else float(value)
    except ValueError:
        raise ValueError(f"{f.flag}: expected {what}, got {text.strip()[:80]!r}") from None
    if isinstance(number, float) and not math.isfinite(number):
        raise ValueError(f"{f.flag}: expected a finite number, got {text.strip()[:80]!r}")
    return number * scale if scale != 1 else number
