"""The tensor-parallel MLP split the explorer shows: the sum of the ranks' partials is the unsplit product."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.server.tp_split import MAX_DIM, tp_mlp_split


@given(
    ranks=st.sampled_from([1, 2, 4, 8, 16]),
    tokens=st.integers(1, 12),
    hidden=st.integers(1, 24),
    width=st.integers(1, 4),
    activation=st.sampled_from(["gelu", "silu"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_partials_sum_to_the_unsplit_result(
    ranks: int, tokens: int, hidden: int, width: int, activation: str, seed: int
) -> None:
    r = tp_mlp_split(tokens=tokens, hidden=hidden, ffn=ranks * width, ranks=ranks, activation=activation, seed=seed)
    assert r["matches"] and r["max_abs_difference"] <= r["tolerance"]
    assert len(r["ranks_detail"]) == ranks
    total = np.sum([np.array(p["partial"]) for p in r["ranks_detail"]], axis=0)
    np.testing.assert_allclose(total, np.array(r["unsplit"]), atol=ranks * 1e-4 + 1e-4)


def test_shapes_and_slices_per_step() -> None:
    r = tp_mlp_split(tokens=4, hidden=8, ffn=16, ranks=4)
    shapes = {s["step"]: s["shapes"] for s in r["steps"]}
    assert shapes["column split"] == {"W1_r": [8, 4], "H_r": [4, 4]}
    assert shapes["row split"] == {"W2_r": [4, 8], "Y_r": [4, 8]}
    assert shapes["all-reduce"] == {"Y": [4, 8]}
    assert [p["w1_columns"] for p in r["ranks_detail"]] == [[0, 4], [4, 8], [8, 12], [12, 16]]
    assert np.array(r["ranks_detail"][0]["hidden_slice"]).shape == (4, 4)


def test_independent_numpy_rederivation() -> None:
    """Rebuild the matrices from the same seed and compute the unsplit MLP here, in float64."""
    r = tp_mlp_split(tokens=3, hidden=5, ffn=6, ranks=2, activation="silu", seed=11)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 5), dtype=np.float32).astype(np.float64)
    w1 = rng.standard_normal((5, 6), dtype=np.float32).astype(np.float64) / np.sqrt(np.float32(5))
    w2 = rng.standard_normal((6, 5), dtype=np.float32).astype(np.float64) / np.sqrt(np.float32(6))
    h = x @ w1
    y = (h / (1 + np.exp(-h))) @ w2
    np.testing.assert_allclose(np.array(r["unsplit"]), y, atol=2e-4)


def test_seeded_and_pure() -> None:
    assert tp_mlp_split(seed=5) == tp_mlp_split(seed=5)
    assert tp_mlp_split(seed=5)["unsplit"] != tp_mlp_split(seed=6)["unsplit"]


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"ranks": 3}, "must divide ffn"),
        ({"ranks": 0}, "ranks"),
        ({"ranks": 32}, "ranks"),
        ({"hidden": MAX_DIM + 1}, "hidden"),
        ({"tokens": 0}, "tokens"),
        ({"activation": "relu"}, "activation"),
        ({"seed": -1}, "seed"),
    ],
)
def test_refusals(kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        tp_mlp_split(**kwargs)  # type: ignore[arg-type]
