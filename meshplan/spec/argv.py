"""Schema values as the words of a command line, and back, without argparse.

``flag_args`` writes the flags that set given values (how ``validate`` prints what a user would type);
``parse_words`` reads such words back through the same fields (how ``calibrate`` reads RUNS.json's ``args``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from meshplan.spec.requests import Field, field


def flag_args(values: Mapping[str, Any]) -> list[str]:
    """Schema values (by field name) as the command-line arguments that set them: a true switch as its flag, a
    false one and an unset value left out, a float written so that it parses back to itself."""
    args: list[str] = []
    for key, value in values.items():
        flag = field(key).flag
        if isinstance(value, bool):
            args += [flag] if value else []
        elif value is not None:
            args += [flag, repr(value) if isinstance(value, float) else str(value)]
    return args


def parse_words(
    words: Sequence[str], *, fields: Iterable[Field], defaults: Mapping[str, Any], positional: str = "model"
) -> dict[str, Any]:
    """``MODEL --flag value --switch --flag=value`` into every field's value (the given ones parsed through the
    schema, the rest at ``defaults``); ValueError with one line for an unknown flag, a missing value, a second
    positional word or a missing one."""
    by_flag = {f.flag: f for f in fields}
    values: dict[str, Any] = dict(defaults)
    given_positional = None
    i = 0
    while i < len(words):
        word = str(words[i])
        i += 1
        if not word.startswith("--"):
            if given_positional is not None:
                raise ValueError(f"unexpected word {word[:80]!r} after {positional} {given_positional[:80]!r}")
            given_positional = word
            continue
        flag, has_value, text = word.partition("=")
        f = by_flag.get(flag)
        if f is None:
            raise ValueError(f"unknown flag {flag[:80]!r}")
        if f.type is bool and not has_value:
            values[f.name] = True
            continue
        if not has_value:
            if i == len(words):
                raise ValueError(f"{flag} needs a value")
            text = str(words[i])
            i += 1
        values[f.name] = f.parse(text)
    if given_positional is None:
        raise ValueError(f"no {positional} given")
    values[positional] = given_positional
    return values
