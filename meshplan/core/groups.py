"""Evaluate a per-layout formula once per group of layouts that agree on everything it reads.

The planner's candidates repeat most of their values: the layouts of one mesh differ in their ZeRO stage
and in how the data-parallel ranks split into shards and replicas, and nothing but the data-parallel traffic
reads those. A formula that does not read them runs on one representative per group (``group_rows``) and
its per-layout results are copied back to every member (``spread``). Every formula of the core is elementwise
over layouts, so the copies are the very numbers each layout would have got on its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]

_HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
"""Odd 64-bit multiplier (2^64 / golden ratio) of the polynomial key; a collision is detected and resolved."""


@dataclass(frozen=True, slots=True)
class Groups:
    """Rows of a batch grouped by equal key columns."""

    first: IntArray
    """One row of each group (its representative)."""
    inverse: IntArray
    """The group of every row."""

    def __len__(self) -> int:
        return len(self.first)


def group_rows(columns: Sequence[npt.ArrayLike]) -> Groups:
    """Rows grouped by equal values in every column (integer or boolean arrays of one length, or scalars).

    One sort of a 64-bit polynomial key of the columns; a key shared by rows that differ (a hash collision)
    is found by comparing every column with its representative, and then the rows are grouped exactly.
    """
    arrays = [np.asarray(c) for c in columns]
    n = max((a.shape[0] for a in arrays if a.ndim), default=1)
    arrays = [np.broadcast_to(a, (n,)) for a in arrays]
    key = np.zeros(n, dtype=np.uint64)
    for a in arrays:
        key = key * _HASH_MULTIPLIER + a.astype(np.uint64)  # wraps modulo 2^64 by design
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    rep = first[inverse]
    if all(np.array_equal(a[rep], a) for a in arrays):
        return Groups(first=first.astype(np.int64), inverse=inverse.astype(np.int64))
    _, first, inverse = np.unique(np.column_stack(arrays), axis=0, return_index=True, return_inverse=True)
    return Groups(first=first.astype(np.int64), inverse=inverse.ravel().astype(np.int64))


DATA_PARALLEL_SPLIT = ("zero", "dp_shard", "dp_replicate")
"""Layout fields that only the data-parallel traffic, the optimizer and the model state read."""
GROUP_MIN_LAYOUTS = 512
"""Batches from this size up are worth grouping."""


def model_parallel_groups(lay: Any, extra: Sequence[npt.ArrayLike] = ()) -> Groups | None:
    """A batch of layouts grouped by every field but ``DATA_PARALLEL_SPLIT`` (with the data-parallel degree
    itself) and the ``extra`` columns; None for one layout, a small batch, or too few repeats to gain."""
    if np.ndim(lay.tp) == 0 or np.size(lay.tp) < GROUP_MIN_LAYOUTS:
        return None
    columns = [getattr(lay, f.name) for f in dataclasses.fields(lay) if f.name not in DATA_PARALLEL_SPLIT]
    groups = group_rows([*columns, lay.dp_replicate * lay.dp_shard, *extra])
    return groups if len(groups) <= np.size(lay.tp) // 2 else None


def take_rows(value: Any, rows: IntArray, size: int) -> Any:
    """``value`` restricted to ``rows``: per-layout arrays (of ``size`` entries) indexed, and the same inside
    dataclasses, lists, tuples and dicts; scalars and anything else kept."""
    if isinstance(value, np.ndarray):
        return value[rows] if value.ndim == 1 and value.shape[0] == size else value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: take_rows(getattr(value, f.name), rows, size) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **changes)
    if isinstance(value, list | tuple):
        return type(value)(take_rows(v, rows, size) for v in value)
    if isinstance(value, dict):
        return {k: take_rows(v, rows, size) for k, v in value.items()}
    return value


def spread(value: Any, groups: Groups) -> Any:
    """Per-group results back per row: each array of one entry per group becomes one entry per row."""
    return take_rows(value, groups.inverse, len(groups))
