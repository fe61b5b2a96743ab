"""The text of a training report's conditions: the stack it assumes, where that came from, and each condition
that is set (cli/tables.py renders the rest of the report)."""

from __future__ import annotations

from typing import Any

from meshplan.render import table


def shown(v: Any) -> str:
    return "-" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def conditions_lines(r: dict[str, Any]) -> str:
    """The conditions the bill assumed and where each came from (flag, stack or default)."""
    conditions = r["conditions"].items()
    rows = [(name, shown(c["value"]), c["source"]) for name, c in conditions if _stated(c)]
    rest = len(r["conditions"]) - len(rows)
    unset = f"; {rest} more unset, at their defaults: --json lists all" if rest else ""
    head = f"conditions (stack: {r['stack']}{unset})"
    return head + ("\n" + table(rows, ["condition", "value", "from"], align="lll") if rows else "")


def _stated(condition: dict[str, Any]) -> bool:
    """Whether a condition row says something: a value a flag or the stack set, or a default that is a value."""
    return condition["source"] != "default" or condition["value"] is not None


STACK_SOURCES = {"flag": "--stack", "engine": "the engine's", "default": "the default; --stack names another"}


def stack_line(r: dict[str, Any]) -> list[str]:
    """Which training stack the numbers assume, where it came from, and each condition that differs from it."""
    if "stack" not in r:
        return []
    line = f"stack: {r['stack']} ({STACK_SOURCES[r['stack_source']]})"
    differs = r.get("differs_from_stack") or []
    if differs:
        values = r.get("conditions", {})
        named = [f"{k}={shown(values[k]['value'])}" if k in values else k for k in differs]
        line += "; differs from it: " + ", ".join(named)
    return [line]
