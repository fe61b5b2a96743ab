"""serve-plan --search-disaggregated without trying every split: the same plans as the search that does."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest

from meshplan.core.serving import search as serve_search
from meshplan.core.serving.disagg import SplitTerms
from meshplan.core.serving.splits import kept_splits, smallest_splits
from meshplan.reports.serve_plan import serve_plan_report
from meshplan.spec.requests import MAX_GPUS

SAME = ("best", "top", "pareto", "pareto_points_total", "rejected", "layouts_evaluated")


def _terms(seed: int, n: int = 120) -> SplitTerms:
    """A made-up layout: TPOT rising with the batch cap (with plateaus, so points tie), a prefill replica fast or
    slow against its decode peers."""
    rng = np.random.default_rng(seed)
    batches = np.arange(1.0, n + 1)
    tpot = 0.01 + np.round(rng.uniform(0, 2e-4, n).cumsum(), 4)
    return SplitTerms(batches=batches, tpot_s=tpot, first_s=float(rng.uniform(0.05, 2.0)),
                      prefill_rate=float(rng.uniform(0.05, 40.0)), output_len=int(rng.integers(16, 4096)),
                      gpus_per_replica=int(rng.choice([1, 2, 8])))  # fmt: skip


def _every_split(terms: SplitTerms, usable: np.ndarray, replicas: int, first_usable: bool) -> list[tuple[Any, ...]]:
    """Every split's candidate, ranked the way the planner sorts them (key, then the order tried)."""
    prefill = np.arange(1, replicas)[:, None]
    gpu, tpot, _, keeps_up = terms.curve(prefill, replicas - prefill)
    rows = []
    for p, g, ok in zip(prefill[:, 0], gpu, keeps_up & usable, strict=True):
        if ok.any():
            idx = np.flatnonzero(ok)
            i = int(idx[0]) if first_usable else int(idx[np.argmax(g[ok])])
            rows.append(((float(tpot[i]), -float(g[i])) if first_usable else (-float(g[i]),), int(p)))
    return sorted(rows, key=lambda r: r[0])


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("first_usable", [False, True])
def test_kept_splits_are_the_best_of_every_split(seed: int, first_usable: bool) -> None:
    terms = _terms(seed)
    replicas = [40, 300, 1000, 5000][seed % 4]
    usable = np.random.default_rng(seed).uniform(size=terms.batches.size) < 0.8
    every = _every_split(terms, usable, replicas, first_usable)
    for keep in (1, 5, 20):
        kept = kept_splits(terms, usable, replicas=replicas, keep=keep, first_usable=first_usable)
        assert kept.prefill_replicas == sorted(p for _, p in every[:keep])
    prefill = np.arange(1, replicas)[:, None]
    keeps_up = terms.curve(prefill, replicas - prefill)[3] & usable
    first = np.where(keeps_up.any(axis=0), np.argmax(keeps_up, axis=0) + 1, 0)
    assert np.array_equal(smallest_splits(terms, usable, replicas=replicas)[0], first)
    assert 0 < np.count_nonzero(first) < usable.size and np.unique(first[first > 0]).size > 1


def _plan(model: str, gpus: int, every: int, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> dict[str, Any]:
    monkeypatch.setattr(serve_search, "EVERY_SPLIT_UP_TO", every)
    return serve_plan_report(
        model, gpu="h100-sxm", gpus=gpus, disaggregate=True, dtypes=["fp8"], allow_quantization=True, **kw
    )


CASES = [
    ("llama-3.1-8b", {"input_len": 2048, "output_len": 256}),
    ("llama-3.1-70b", {"input_len": 2048, "output_len": 256}),
    ("mixtral-8x7b", {"input_len": 2048, "output_len": 256}),
    ("llama-3.1-70b", {"input_len": 8000, "output_len": 300, "ttft_p99_s": 2.0, "tpot_p99_s": 0.03}),
    ("llama-3.1-70b", {"input_len": 8000, "output_len": 300, "ttft_p99_s": 2.0, "tpot_p99_s": 0.05,
                       "objective": "latency"}),
    ("llama-3.1-8b", {"input_len": 512, "output_len": 2048, "top": 20}),
]  # fmt: skip


@pytest.mark.parametrize("gpus", [64, 256])
@pytest.mark.parametrize(("model", "kw"), CASES)
def test_bounded_search_gives_the_plans_of_every_split(
    model: str, kw: dict[str, Any], gpus: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dense 8B and 70B, MoE Mixtral; throughput and latency; with and without targets: the best plan, the top
    list and the Pareto front are those of the search that ranks every split, while far fewer splits are ranked."""
    every = _plan(model, gpus, sys.maxsize, monkeypatch, **kw)
    bounded = _plan(model, gpus, 0, monkeypatch, **kw)
    assert every["best"] is not None
    for key in SAME:
        assert bounded[key] == every[key], key
    if gpus == 64:  # layouts of up to 16 splits try every one, the others not
        default = _plan(model, gpus, serve_search.EVERY_SPLIT_UP_TO, monkeypatch, **kw)
        assert all(default[key] == every[key] for key in SAME)
    assert bounded["layouts_meeting_targets"] < every["layouts_meeting_targets"]
    if "ttft_p99_s" in kw and "objective" not in kw:  # the pools win under a tight TPOT with long prompts
        assert 0 < every["best"]["prefill_replicas"] < every["best"]["replicas"]
    elif "ttft_p99_s" in kw:  # for latency: one request alone on a colocated replica sees no other prompt between
        # its tokens (TPOT as a decode pool's) and no step to wait for, and every GPU of the fleet decodes
        assert every["best"]["prefill_replicas"] == 0 and every["best"]["batch_cap_per_replica"] == 1


def test_the_largest_fleet_is_searched_in_bounded_work() -> None:
    """10^7 GPUs (the most the CLI and API take): splits of millions of replicas ranked from a few thousand
    points per layout, not one row per split."""
    r = serve_plan_report("llama-3.1-70b", gpu="h100-sxm", gpus=MAX_GPUS, input_len=2048, output_len=256,
                          disaggregate=True, dtypes=["fp8"], allow_quantization=True)  # fmt: skip
    splits = [p for p in r["top"] if p["prefill_replicas"]]
    assert splits and all(0 < p["prefill_replicas"] < p["replicas"] and p["replicas"] >= 10**6 for p in splits)
    assert r["points_evaluated"] < 100_000 * r["layouts_evaluated"]
    assert r["pareto_points_total"] < 1_000
