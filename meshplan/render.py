"""The one place units are formatted: bytes, times, counts, tables and JSON."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import textwrap
from collections.abc import Iterable, Sequence
from typing import Any


def gb(num_bytes: float) -> str:
    """Decimal gigabytes, as vendors and the seed pages quote HBM (1 GB = 1e9 bytes)."""
    if num_bytes >= 1e12:
        return f"{num_bytes / 1e12:.2f} TB"
    if abs(num_bytes) >= 1e9:
        return f"{num_bytes / 1e9:.1f} GB"
    if abs(num_bytes) >= 1e6:
        return f"{num_bytes / 1e6:.1f} MB"
    if abs(num_bytes) >= 1e3:
        return f"{num_bytes / 1e3:.1f} kB"
    return f"{num_bytes:.0f} B"


def count(n: float) -> str:
    """A parameter or token count: 8.03B, 70.6B, 41.9M."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{suffix}" if n / scale < 100 else f"{n / scale:.1f}{suffix}"
    return f"{n:.0f}"


def seconds(t: float) -> str:
    if t >= 86400:
        return f"{t / 86400:.1f} d"
    if t >= 1:
        return f"{t:.2f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} us"


def percent(x: float) -> str:
    return f"{100 * x:.1f}%"


WIDTH = 120
"""Columns a line of text output takes at most: a wider table wraps its widest left-aligned column, a longer
line of prose wraps (``fit_width``)."""
_NARROWEST = 16
"""A column is not wrapped narrower than this: the table stays wide instead."""


def table(
    rows: Iterable[Sequence[object]], headers: Sequence[str], *, align: str | None = None, width: int = WIDTH
) -> str:
    """A plain-text table; ``align`` gives 'l' or 'r' per column (default: first left, rest right). A table wider
    than ``width`` wraps the cells of its widest left-aligned column onto more lines."""
    body = [[str(c) for c in row] for row in rows]
    cols = len(headers)
    align = align or "l" + "r" * (cols - 1)
    widths = [max([len(headers[i])] + [len(r[i]) for r in body]) for i in range(cols)]
    wrapped = _column_to_wrap(widths, align, width)

    def line(cells: Sequence[str]) -> str:
        out = [c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(cells, widths, align, strict=True)]
        return "  ".join(out).rstrip()

    def lines(cells: list[str]) -> list[str]:
        if wrapped is None or len(cells[wrapped]) <= widths[wrapped]:
            return [line(cells)]
        parts = textwrap.wrap(cells[wrapped], widths[wrapped], break_on_hyphens=False) or [""]
        more = [[*([""] * wrapped), part, *([""] * (cols - wrapped - 1))] for part in parts[1:]]
        return [line([*cells[:wrapped], parts[0], *cells[wrapped + 1 :]]), *(line(m) for m in more)]

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(text for r in body for text in lines(r))])


def _column_to_wrap(widths: list[int], align: str, width: int) -> int | None:
    """The column that wraps to keep a table within ``width`` (its width reduced in place), or None."""
    over = sum(widths) + 2 * (len(widths) - 1) - width
    left = [i for i, a in enumerate(align) if a == "l"]
    if over <= 0 or not left:
        return None
    widest = max(left, key=lambda i: widths[i])
    if widths[widest] - over < _NARROWEST:
        return None
    widths[widest] -= over
    return widest


def fit_width(text: str, width: int = WIDTH) -> str:
    """``text`` with every line longer than ``width`` wrapped at spaces, its continuation indented two more
    spaces than the line (a single word longer than ``width``, a path, stays whole)."""
    out = []
    for line in text.splitlines():
        if len(line) <= width:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip()) + 2)
        out += textwrap.wrap(line, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
    return "\n".join(out)


def jsonable(obj: Any) -> Any:
    """Plain JSON data from dataclasses, enums, numpy scalars, tuples and dicts."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value if isinstance(obj.value, str) else obj.name.lower()
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):
        return jsonable(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def to_json(obj: Any) -> str:
    return json.dumps(jsonable(obj), indent=2)
