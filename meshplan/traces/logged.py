"""Plain logged numbers of a run: its step time and the allocator's peaks, from a small JSON or CSV file.

JSON: an object, or a list of objects (one per logged step), with any of ``step_time_s``, ``max_memory_allocated``
and ``max_memory_reserved`` (bytes, as ``torch.cuda.max_memory_allocated()`` and ``max_memory_reserved()`` return
them). CSV: a header row naming those columns and a row per logged step. Over several steps the step time is the
median (warm-up steps are the slow tail, not the step) and each memory figure the most. Other keys are refused.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from pathlib import Path
from typing import Any

from meshplan.files import parse_json, read_text_file

KEYS = ("step_time_s", "max_memory_allocated", "max_memory_reserved")
MAX_ROWS = 100_000


def read_logged(path: Path | str) -> dict[str, float]:
    """The logged numbers in a file (only those it gives); ValueError (one line) otherwise."""
    label = f"logged numbers {path}"
    text = read_text_file(path, what="logged numbers")
    if str(path).lower().endswith(".csv"):
        rows: list[Any] = list(csv.DictReader(io.StringIO(text)))
        if any(None in row or None in row.values() for row in rows):
            raise ValueError(f"{label}: a row's field count differs from the header's")
        rows = [{k: _csv_number(v, label, k) for k, v in row.items() if v not in (None, "")} for row in rows]
    else:
        data = parse_json(text, label)
        rows = data if isinstance(data, list) else [data]
    if not rows or len(rows) > MAX_ROWS:
        raise ValueError(f"{label}: expected 1 to {MAX_ROWS:,} logged rows, got {len(rows):,}")
    values: dict[str, list[float]] = {k: [] for k in KEYS}
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{label}: row {i} is not an object of {', '.join(KEYS)}")
        unknown = sorted(str(k)[:40] for k in row if k not in KEYS)
        if unknown:
            raise ValueError(f"{label}: unknown keys {', '.join(unknown)} (known: {', '.join(KEYS)})")
        for key, value in row.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ValueError(f"{label}: row {i} {key} must be a positive number, got {str(value)[:40]}")
            values[key].append(float(value))
    out = {"step_time_s": statistics.median(values["step_time_s"])} if values["step_time_s"] else {}
    out |= {k: max(values[k]) for k in KEYS[1:] if values[k]}
    if not out:
        raise ValueError(f"{label} gives none of {', '.join(KEYS)}")
    return out


def _csv_number(text: str, label: str, key: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{label}: {key[:40]} must be a number, got {text[:40]!r}") from None


__all__ = ["KEYS", "read_logged"]
