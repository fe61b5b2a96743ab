"""The tensor-parallel MLP split, computed: W1 by columns, W2 by rows, one sum at the end.

Megatron-LM (Shoeybi et al. 2019, Sec. 3) splits the first MLP matrix by
columns so each rank applies the elementwise activation to its own slice
without talking to the others, and the second by rows so each rank's product
is a full-size partial sum. Adding the partials (the all-reduce) gives the
unsplit result. This module does it on small seeded random matrices and
reports every step's shapes and how far the split result is from the unsplit
one. float32, as a GPU would compute it, so the difference is rounding only.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import numpy as np

MAX_DIM = 64
MAX_RANKS = 16


class Activation(StrEnum):
    """The elementwise function between the two matrices."""

    GELU = "gelu"
    """GELU, tanh approximation (Hendrycks and Gimpel 2016), as GPT-2 and Megatron use it."""
    SILU = "silu"
    """SiLU / swish, x * sigmoid(x) (the activation of gated Llama MLPs)."""


def _activate(x: np.ndarray, activation: Activation) -> np.ndarray:
    if activation is Activation.GELU:
        c = np.float32(np.sqrt(2.0 / np.pi))
        gelu: np.ndarray = np.float32(0.5) * x * (np.float32(1.0) + np.tanh(c * (x + np.float32(0.044715) * x**3)))
        return gelu
    out: np.ndarray = x / (np.float32(1.0) + np.exp(-x))
    return out


def _check(*, tokens: int, hidden: int, ffn: int, ranks: int, seed: int) -> None:
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed must be in [0, 2**32), got {seed}")
    for name, value, top in (("tokens", tokens, MAX_DIM), ("hidden", hidden, MAX_DIM), ("ffn", ffn, MAX_DIM)):
        if not 1 <= value <= top:
            raise ValueError(f"{name} must be in [1, {top}], got {value}")
    if not 1 <= ranks <= MAX_RANKS:
        raise ValueError(f"ranks must be in [1, {MAX_RANKS}], got {ranks}")
    if ffn % ranks:
        raise ValueError(f"ranks = {ranks} must divide ffn = {ffn} (each rank takes ffn/ranks columns of W1)")


def _rounded(a: np.ndarray) -> list[list[float]]:
    return [[round(float(v), 4) for v in row] for row in np.atleast_2d(a)]


def tp_mlp_split(
    *,
    tokens: int = 4,
    hidden: int = 8,
    ffn: int = 16,
    ranks: int = 4,
    activation: str = "gelu",
    seed: int = 0,
) -> dict[str, Any]:
    """Y = act(X W1) W2 computed whole and split over ``ranks``; shapes per step and the largest difference.

    Shapes: X [tokens, hidden], W1 [hidden, ffn], W2 [ffn, hidden]; rank r holds W1[:, cols_r] and
    W2[cols_r, :] with cols_r = r*ffn/ranks ... (r+1)*ffn/ranks.
    """
    _check(tokens=tokens, hidden=hidden, ffn=ffn, ranks=ranks, seed=seed)
    try:
        act = Activation(activation.strip().lower())
    except ValueError:
        raise ValueError(f"unknown activation {activation!r} (choose from gelu, silu)") from None
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, hidden), dtype=np.float32)
    w1 = rng.standard_normal((hidden, ffn), dtype=np.float32) / np.float32(np.sqrt(hidden))
    w2 = rng.standard_normal((ffn, hidden), dtype=np.float32) / np.float32(np.sqrt(ffn))
    y_full = _activate(x @ w1, act) @ w2

    width = ffn // ranks
    per_rank = []
    partial_sum = np.zeros_like(y_full)
    for r in range(ranks):
        cols = slice(r * width, (r + 1) * width)
        h_r = _activate(x @ w1[:, cols], act)  # [tokens, ffn/ranks]: needs no other rank's columns
        y_r = h_r @ w2[cols, :]  # [tokens, hidden]: a full-size partial sum
        partial_sum = partial_sum + y_r
        per_rank.append(
            {
                "rank": r,
                "w1_columns": [r * width, (r + 1) * width],
                "w2_rows": [r * width, (r + 1) * width],
                "hidden_slice": _rounded(h_r),
                "partial": _rounded(y_r),
            }
        )
    diff = float(np.max(np.abs(partial_sum - y_full)))
    scale = float(np.max(np.abs(y_full)))
    tolerance = 1e-5 * max(scale, 1.0)
    return {
        "tokens": tokens,
        "hidden": hidden,
        "ffn": ffn,
        "ranks": ranks,
        "activation": act.value,
        "seed": seed,
        "dtype": "float32",
        "steps": [
            {"step": "input", "what": "every rank holds the same X", "shapes": {"X": [tokens, hidden]}},
            {
                "step": "column split",
                "what": "rank r multiplies X by its columns of W1 and applies the activation locally",
                "shapes": {"W1_r": [hidden, width], "H_r": [tokens, width]},
            },
            {
                "step": "row split",
                "what": "rank r multiplies H_r by its rows of W2: a full-size partial result",
                "shapes": {"W2_r": [width, hidden], "Y_r": [tokens, hidden]},
            },
            {
                "step": "all-reduce",
                "what": "the partials are summed across ranks: the only communication of the block",
                "shapes": {"Y": [tokens, hidden]},
            },
        ],
        "ranks_detail": per_rank,
        "unsplit": _rounded(y_full),
        "split_sum": _rounded(partial_sum),
        "max_abs_difference": diff,
        "tolerance": tolerance,
        "matches": diff <= tolerance,
    }


__all__ = ["MAX_DIM", "MAX_RANKS", "Activation", "tp_mlp_split"]
