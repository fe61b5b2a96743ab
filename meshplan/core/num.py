"""Numbers that are either Python scalars or numpy arrays of layouts.

Every formula in the core is written once with arithmetic and numpy
functions that broadcast, so ``evaluate()`` of one layout and the planner's
vectorized search over a million layouts run the very same code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt  # annotations only: the core does not load numpy.typing at run time

Num: TypeAlias = Any
"""A float, an int, a bool, or an ndarray of them (one entry per layout)."""


def where(condition: Num, if_true: Num, if_false: Num) -> Num:
    """``np.where`` that hands back a Python scalar for scalar inputs (and skips the copy for a scalar condition)."""
    if np.ndim(condition) == 0:
        return if_true if condition else if_false
    # typed as ArrayLike so that the stubs pick the three-argument overload (Any also matches the x=None one)
    x: npt.ArrayLike = if_true
    y: npt.ArrayLike = if_false
    out = np.where(condition, x, y)
    return out.item() if out.ndim == 0 else out


def minimum(a: Num, b: Num) -> Num:
    out = np.minimum(a, b)
    return out.item() if np.ndim(out) == 0 else out


def maximum(a: Num, b: Num) -> Num:
    out = np.maximum(a, b)
    return out.item() if np.ndim(out) == 0 else out


def ceil_div(a: Num, b: Num) -> Num:
    """Integer ceiling of a / b for ints or integer arrays."""
    return -(-a // b)


def gcd(a: Num, b: Num) -> Num:
    out = np.gcd(a, b)
    return out.item() if np.ndim(out) == 0 else out


def to_float(x: Num) -> Num:
    """A Python float for scalars; a float64 array otherwise."""
    if np.ndim(x) == 0:
        return float(x)
    return np.asarray(x, dtype=np.float64)


def like(x: Num, value: float) -> Num:
    """``value`` as a Python float for a scalar ``x``, or a float64 array of ``x``'s shape (one per layout)."""
    if np.ndim(x) == 0:
        return float(value)
    return np.full(np.shape(x), value, dtype=np.float64)
