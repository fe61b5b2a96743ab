"""Numbers that are either Python scalars or numpy arrays of layouts.

Every formula in the core is written once with arithmetic and numpy
functions that broadcast, so ``evaluate()`` of one layout and the planner's
vectorized search over a million layouts run the very same code.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt  # annotations only: the core does not load numpy.typing at run time

Num: TypeAlias = Any
"""A float, an int, a bool, or an ndarray of them (one entry per layout)."""


_SCALARS = frozenset({bool, int, float, np.bool_, np.int64, np.float64})
"""Types that are certainly 0-d: tested by identity first, since ``np.ndim`` costs a dispatch per call and the
scalar path (one layout: estimate, validate) calls these millions of times."""


def _is_scalar(x: Num) -> bool:
    return type(x) in _SCALARS or np.ndim(x) == 0


def where(condition: Num, if_true: Num, if_false: Num) -> Num:
    """``np.where`` that hands back a Python scalar for scalar inputs (and skips the copy for a scalar condition)."""
    if _is_scalar(condition):
        return if_true if condition else if_false
    # typed as ArrayLike so that the stubs pick the three-argument overload (Any also matches the x=None one)
    x: npt.ArrayLike = if_true
    y: npt.ArrayLike = if_false
    out = np.where(condition, x, y)
    return out.item() if out.ndim == 0 else out


def _plain_pick(a: Any, b: Any, smaller: bool) -> Any:
    """np.minimum / np.maximum of two Python ints or floats, as the numpy call's ``.item()`` gives it: an int when
    both are ints, else a float, NaN when either is NaN. None when the inputs are anything else."""
    ta, tb = type(a), type(b)
    if ta is int and tb is int:
        return (a if a <= b else b) if smaller else (a if a >= b else b)
    if ta in (int, float) and tb in (int, float):
        fa, fb = float(a), float(b)
        if fa != fa or fb != fb:
            return math.nan
        return (fa if fa <= fb else fb) if smaller else (fa if fa >= fb else fb)
    return None


def minimum(a: Num, b: Num) -> Num:
    plain = _plain_pick(a, b, smaller=True)
    if plain is not None:
        return plain
    out = np.minimum(a, b)
    return out.item() if np.ndim(out) == 0 else out


def maximum(a: Num, b: Num) -> Num:
    plain = _plain_pick(a, b, smaller=False)
    if plain is not None:
        return plain
    out = np.maximum(a, b)
    return out.item() if np.ndim(out) == 0 else out


def ceil_div(a: Num, b: Num) -> Num:
    """Integer ceiling of a / b for ints or integer arrays."""
    return -(-a // b)


def gcd(a: Num, b: Num) -> Num:
    if type(a) is int and type(b) is int:
        return math.gcd(a, b)
    out = np.gcd(a, b)
    return out.item() if np.ndim(out) == 0 else out


def to_float(x: Num) -> Num:
    """A Python float for scalars; a float64 array otherwise."""
    if _is_scalar(x):
        return float(x)
    return np.asarray(x, dtype=np.float64)


def like(x: Num, value: float) -> Num:
    """``value`` as a Python float for a scalar ``x``, or a float64 array of ``x``'s shape (one per layout)."""
    if np.ndim(x) == 0:
        return float(value)
    return np.full(np.shape(x), value, dtype=np.float64)
