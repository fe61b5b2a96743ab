"""The step-time band of a layout no published run resembles: a GPU kind, a stack or a parallelism mix that none of
catalog/runs used takes at least the range of every held-out run (validation/band.py step 4)."""

from __future__ import annotations

import tomllib
from importlib import resources

import pytest

from meshplan import io
from meshplan.reports.estimate import estimate_report, uncertainty
from meshplan.reports.inputs import LayoutRequest
from meshplan.reports.novelty import mix_of, published_kinds, unseen
from meshplan.validation.band import held_out_band


def _run_files() -> list[dict]:
    folder = resources.files("meshplan") / "catalog" / "runs"
    return [tomllib.loads(e.read_text(encoding="utf-8")) for e in folder.iterdir() if e.name.endswith(".toml")]


def test_the_published_kinds_are_re_read_from_the_run_files() -> None:
    """Each case's GPU kind, stack (the one it names, else the one its source ran, else the default stack,
    megatron-core) and axes above 1."""
    gpus, stacks, mixes = set(), set(), set()
    for data in _run_files():
        for raw in data["case"]:
            case = {**data.get("defaults", {}), **raw}
            gpus.add(case["gpu"])
            stacks.add(case.get("stack", data["source"].get("ran_on_stack", "megatron-core")))
            lay = case["layout"]
            mixes.add("+".join(a for a in ("tp", "pp", "cp", "ep") if lay.get(a, 1) > 1))
    kinds = published_kinds()
    assert kinds == {"gpu": gpus, "stack": stacks, "mix": mixes}
    assert {"", "tp+pp", "cp"} <= mixes and "ep" not in mixes
    assert {"megatron-lm-2021", "deepspeed", "nemo", "megatron-core", "fsdp2", "torchtitan"} <= stacks
    assert mix_of(tp=2, pp=4, ep=8) == "tp+pp+ep" and mix_of() == ""


def test_unseen_names_each_dimension_no_run_used() -> None:
    assert unseen(gpu="h100-sxm", stack="megatron-core", mix="tp+pp") == []
    assert unseen(gpu="mi300x", stack="my-stack", mix="ep") == [
        "the GPU kind mi300x",
        "the stack my-stack",
        "the parallelism mix EP",
    ]
    assert unseen(gpu=None, stack=None, mix=None) == []


def test_the_unseen_bounds_are_the_least_and_largest_held_out_ratio() -> None:
    """Steps 3 and 4 re-derived on a small report: a rate's error e is a time ratio 1 + e, a time's 1 / (1 + e);
    the bounds are the least and largest of every run of every source, never inside the every-run band, and a
    class of too few sources takes them too."""
    report = {
        "sources": [{"source": "a", "metric": "tokens_per_s_per_gpu"}, {"source": "b", "metric": "iteration_time_s"}],
        "runs": [{"source": "a", "layout": {}}] * 2
        + [{"source": "a", "layout": {"cp": 2}}]
        + [{"source": "b", "layout": {}}] * 2,
        "held_out": {
            "sources": [
                {"source": "a", "loso_residuals": [0.1, -0.2, 0.0]},
                {"source": "b", "loso_residuals": [0.25, -0.5]},
            ]
        },
    }
    band = held_out_band(report)
    assert band["unseen_time_ratio_p10"] == pytest.approx(0.8)  # a's 1 - 0.2
    assert band["unseen_time_ratio_p90"] == pytest.approx(2.0)  # b's 1 / (1 - 0.5)
    assert band["unseen_time_ratio_p10"] <= band["time_ratio_p10"] and band["unseen_time_ratio_p90"] >= 1.25
    # the CP class, one run of one source (ratio 1.0): too few sources, so the same range (step 3)
    assert (band["cp_runs"], band["cp_sources"], band["cp_promised"]) == (1, 1, 0)
    assert (band["cp_time_ratio_p10"], band["cp_time_ratio_p90"]) == (band["unseen_time_ratio_p10"], 2.0)


def test_a_layout_no_published_run_resembles_takes_the_range_of_every_run() -> None:
    """The catalog's file: the unseen bounds hold the every-run band; an estimate with a mix no run used (EP
    without PP or TP) or on a GPU kind none ran on takes them and says why; one whose kind, stack and mix the runs
    used keeps its band. Every catalog stack has published runs today (a stack added without them would widen)."""
    band = io.held_out_band()
    lo, hi = band["unseen_time_ratio_p10"], band["unseen_time_ratio_p90"]
    assert lo < band["time_ratio_p10"] and hi > band["time_ratio_p90"]
    kw = dict(gpus=8, seq=4096, global_batch=16)
    seen = estimate_report("llama-3.1-8b", gpu="h100-sxm", layout=LayoutRequest(dp_shard=8, zero=3), **kw)
    assert "widened" not in seen["uncertainty"]
    assert seen["step_time_s_p90"] == pytest.approx(band["time_ratio_p90"] * seen["step_time_s"], rel=1e-9)
    cases = [
        ("mixtral-8x7b", "h100-sxm", LayoutRequest(ep=8, dp_shard=8, zero=1), {}, "the parallelism mix EP"),
        ("llama-3.1-8b", "mi300x", LayoutRequest(dp_shard=8, zero=3), {}, "the GPU kind mi300x"),
    ]
    for model, gpu, layout, conditions, words in cases:
        out = estimate_report(model, gpu=gpu, layout=layout, conditions=conditions, **kw)
        assert f"no published run used {words}" in out["uncertainty"], out["uncertainty"]
        assert out["step_time_s_p10"] <= lo * out["step_time_s"] * (1 + 1e-12)
        assert out["step_time_s_p90"] >= hi * out["step_time_s"] * (1 - 1e-12)
        assert out["step_time_band_sources"] == int(band["sources"])
    stacks = {e.name.removesuffix(".toml") for e in (resources.files("meshplan") / "catalog" / "stacks").iterdir()}
    assert all(unseen(gpu=None, stack=stack, mix=None) == [] for stack in stacks) and len(stacks) == 8
    # not checked where the caller does not give the layout's TP and PP (the mix is then unknown)
    assert "widened" not in uncertainty(1.0, None, ep=8, gpu="h100-sxm")["uncertainty"]
