"""Every input a user can state, declared once: its type, default, bounds, unit and help.

The table is declared in spec/schema/ (the fields of a run, of its conditions and of serving) and joined here.
Each edge makes its own spelling from it: the CLI's flags (cli/parser.py), the HTTP API's query parameters
(server/parse.py), the ``key=value`` layouts of ``plan --compare`` (reports/plan_explain.py), the words of a
calibration run (spec/argv.py) and the keys of the catalog's run and recipe files (``parse_values`` below), so a
field means the same thing wherever it is given. Resolving values into specs (degrees, enums) happens in
``reports.inputs``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from meshplan.spec.schema.conditions import CONDITION_FIELDS, STACKS
from meshplan.spec.schema.cost import COST_FIELDS
from meshplan.spec.schema.field import (
    MAX_BATCH,
    MAX_CONTEXT,
    MAX_DAYS,
    MAX_DEGREE,
    MAX_GPUS,
    MAX_MICRO_BATCH,
    MAX_SEQ,
    MAX_TOKENS,
    MAX_TOP,
    Field,
    Group,
)
from meshplan.spec.schema.measured import MEASURED_FIELDS
from meshplan.spec.schema.run import OBJECTIVES, PRECISION_CHOICES, RUN_FIELDS, SCHEDULES, SEARCH_FIELDS
from meshplan.spec.schema.serving import MAX_LOAD, SERVE_FIELDS, SERVING_FIELDS

__all__ = [
    "BY_NAME",
    "FIELDS",
    "MAX_BATCH",
    "MAX_CONTEXT",
    "MAX_DAYS",
    "MAX_DEGREE",
    "MAX_GPUS",
    "MAX_LOAD",
    "MAX_MICRO_BATCH",
    "MAX_SEQ",
    "MAX_TOKENS",
    "MAX_TOP",
    "OBJECTIVES",
    "PRECISION_CHOICES",
    "SCHEDULES",
    "STACKS",
    "Field",
    "Group",
    "field",
    "group",
    "parse_values",
]

FIELDS: tuple[Field, ...] = RUN_FIELDS + CONDITION_FIELDS + SEARCH_FIELDS + COST_FIELDS + SERVING_FIELDS + SERVE_FIELDS
FIELDS += MEASURED_FIELDS
"""The one table, in the order the CLI's help, the API's parameters and the reports list the fields."""
BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}


def group(g: Group) -> tuple[Field, ...]:
    return tuple(f for f in FIELDS if f.group is g)


def field(name: str) -> Field:
    return BY_NAME[name]


def parse_values(
    values: Mapping[str, Any], *, allowed: Iterable[Field], what: str, aliases: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Parse a mapping of field names to raw values (a run file's table, a compare string's items).

    Unknown keys are refused with the known ones listed, never dropped; ``aliases`` maps short keys to names.
    """
    aliases = aliases or {}
    known = {f.name: f for f in allowed}
    out: dict[str, Any] = {}
    for key, raw in values.items():
        name = aliases.get(key, key)
        if name not in known:
            names = ", ".join(sorted(known))
            raise ValueError(f"unknown {what} key {key!r} (known: {names})")
        out[name] = known[name].parse(raw)
    return out
