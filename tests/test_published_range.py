"""Predictions held to what the published runs measured (reports/published_range.py): the MFU range of each GPU
kind and class of layout, the plans the step-time band cannot rank, and the MoE routing note."""

from __future__ import annotations

import json
from typing import Any

import pytest

from meshplan.cli import main
from meshplan.reports.published_range import (
    mark_plans,
    mark_ties,
    mfu_check,
    mfu_class,
    numbered,
    published_mfu,
    run_classes,
)
from meshplan.units import DType

A100_70B = [
    "estimate", "llama-3.1-70b", "--gpu", "a100-80gb", "--gpus", "64", "--tp", "4", "--sp", "--pp", "4", "--vpp", "3",
    "--schedule", "interleaved", "--zero", "1", "--micro-batch", "1", "--seq", "4096", "--global-batch", "1024",
]  # fmt: skip


def _json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main([*args, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_70b_on_a100_above_every_published_a100_run_warns_with_the_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    """No published A100 run of a dense model without CP measured this MFU (the highest: llm-foundry's MPT-3b at
    sequence 512); the estimate says so, naming the run, the range and the runs and sources behind it."""
    out = _json(A100_70B, capsys)
    rng = out["published_mfu"]
    stored = published_mfu()["a100-80gb"]["dense"]["16-bit"]
    assert (rng["layout_class"], rng["matmul"], rng["runs"], rng["sources"]) == ("dense", "16-bit", 114, 10)
    assert rng["mfu_max"] == stored["mfu_max"] and rng["highest_run"].startswith("llm_foundry_a100: MPT-3b")
    assert out["fits"] and out["mfu"] > rng["mfu_max"] and rng["above"] is True
    (said,) = [w for w in out["warnings"] if "published run" in w]
    assert f"MFU {out['mfu']:.1%} is above" in said and f"{rng['mfu_max']:.1%}" in said and "a100-80gb" in said
    assert "114 runs from 10 sources" in said and rng["highest_run"] in said
    # the case: 68.6% on A100
    rng, warned = mfu_check(0.686, gpu="a100-80gb", cp=1, ep=1, moe=False, dtype=DType.BF16)
    assert rng["above"] is True and "MFU 68.6% is above" in warned[0] and "62.7%" in warned[0]


def test_within_the_range_no_warning_and_a_class_or_gpu_without_runs_says_so() -> None:
    below, warned = mfu_check(0.40, gpu="a100-80gb", cp=1, ep=1, moe=False, dtype=DType.BF16)
    assert below["above"] is False and warned == []
    # fp8 runs are held apart: no A100 run used FP8 matmuls
    none, warned = mfu_check(0.40, gpu="a100-80gb", cp=1, ep=1, moe=False, dtype=DType.FP8)
    assert none["above"] is None and none["runs"] == 0 and none["mfu_max"] is None
    assert warned == [
        "MFU 40.0%: no published run of its class (dense models without context parallelism, fp8 matmuls) ran on "
        "a100-80gb, so no measured MFU bounds it"
    ]
    _, warned = mfu_check(0.40, gpu="mi300x", cp=1, ep=1, moe=False, dtype=DType.BF16)
    assert warned == ["MFU 40.0%: none of the published training runs ran on mi300x, so no measured MFU bounds it"]


def test_the_classes_of_a_layout_and_of_a_published_run() -> None:
    """A layout with CP and EP is held to every published run with either (cp_ep); a run with both counts in CP,
    EP and cp_ep; a MoE without EP is a class of its own, not a dense one."""
    assert mfu_class(cp=2, ep=8, moe=True) == "cp_ep"
    assert mfu_class(cp=1, ep=1, moe=True) == "moe" and mfu_class(cp=1, ep=1, moe=False) == "dense"
    assert run_classes(cp=2, ep=8, moe=True) == ("cp", "ep", "cp_ep")
    assert run_classes(cp=2, ep=1, moe=False) == ("cp", "cp_ep") and run_classes(cp=1, ep=1, moe=False) == ("dense",)
    h100 = published_mfu()["h100-sxm"]
    union = h100["cp_ep"]["16-bit"]
    assert union["mfu_max"] == max(h100["cp"]["16-bit"]["mfu_max"], h100["ep"]["16-bit"]["mfu_max"])
    assert union["mfu_min"] == min(h100["cp"]["16-bit"]["mfu_min"], h100["ep"]["16-bit"]["mfu_min"])


def _plan(step: float, lo: float = 0.8, hi: float = 1.4, cp: int = 1) -> dict[str, Any]:
    layout = {"cp": cp, "ep": 1}
    return {
        "step_time_s": step,
        "step_time_s_p10": lo * step,
        "step_time_s_p90": hi * step,
        "mfu": 0.3,
        "layout": layout,
    }


def test_plans_within_each_others_band_are_marked_as_ties() -> None:
    plans = [_plan(10.0), _plan(10.5), _plan(11.0), _plan(14.5)]  # 14.5 is above plan 1's P90 (14.0)
    line = mark_ties(plans)
    assert [p["ties_with_best"] for p in plans] == [True, True, True, False]
    assert line is not None and line.startswith("plans 1-3 are within the step-time band (P10-P90) of each other")
    alone = [_plan(10.0, hi=1.01), _plan(10.2)]
    assert mark_ties(alone) is None and [p["ties_with_best"] for p in alone] == [True, False]
    # plans 2 and 3 each lie within plan 1's band and it within theirs, but 3 is outside 2's narrow band
    odd = [_plan(10.0), _plan(10.05, lo=0.99, hi=1.01), _plan(13.0, lo=0.7)]
    assert mark_ties(odd) == (
        "plans 1-3 are within the step-time band (P10-P90) of plan 1: the model cannot rank them; choose among them "
        "on memory, the fabric they cross or what your stack runs"
    )
    assert numbered([1, 2, 3, 5]) == "1-3, 5" and numbered([1, 2]) == "1, 2" and numbered([2, 4]) == "2, 4"


def test_mark_plans_groups_the_plans_above_the_range_by_class() -> None:
    plans = [_plan(10.0), _plan(10.1, cp=2), _plan(10.2)]
    for p, mfu in zip(plans, (0.70, 0.30, 0.65), strict=True):
        p["mfu"] = mfu
    out = mark_plans(plans, gpu="a100-80gb", moe=False, dtype=DType.BF16)
    assert [p["published_mfu"]["above"] for p in plans] == [True, None, True]
    dense, cp = out["warnings"]
    assert dense.startswith("plans 1, 3: MFU 65.0%-70.0% is above the highest")
    assert cp.startswith("plan 2: MFU 30.0%: no published run of its class (layouts with context parallelism")


def test_a_plan_whose_top_plans_are_within_the_band_marks_them(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq", "8192", "--global-batch-tokens", "1M"]
    out = _json(args, capsys)
    plans = out["plans"]
    best = plans[0]
    tied = [p["ties_with_best"] for p in plans]
    assert tied[0] and len(plans) >= 2
    for p, flag in zip(plans, tied, strict=True):
        inside = best["step_time_s_p10"] <= p["step_time_s"] <= best["step_time_s_p90"]
        mine = p["step_time_s_p10"] <= best["step_time_s"] <= p["step_time_s_p90"]
        assert flag == (inside and mine)
    assert sum(tied) >= 2 and out["ties"].startswith(f"plans {numbered([i + 1 for i, t in enumerate(tied) if t])} ")
    assert main([*args]) == 0
    text = capsys.readouterr().out  # the text table prints the line (wrapped at 120 columns)
    assert " ".join(out["ties"].split()) in " ".join(text.split())


def test_an_expert_parallel_moe_estimate_says_routing_is_assumed_balanced(capsys: pytest.CaptureFixture[str]) -> None:
    """The default routing_imbalance is 1 (no published per-router measure of the busiest EP rank's share is solid
    enough to replace it): the estimate says so, and what the busiest rank holds at a capacity factor of 1.25."""
    args = ["estimate", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "32", "--tp", "2", "--ep", "8", "--pp", "2",
            "--seq", "4096", "--global-batch", "256"]  # fmt: skip
    balanced = _json(args, capsys)
    skewed = _json([*args, "--routing-imbalance", "1.25"], capsys)
    (note,) = [w for w in balanced["warnings"] if w.startswith("routing is assumed perfectly balanced")]
    extra = skewed["per_gpu"]["total_bytes"] - balanced["per_gpu"]["total_bytes"]
    assert extra > 0 and f"holds {extra / 1e9:.1f} GB more activations" in note
    assert f"{skewed['per_gpu']['total_bytes'] / 1e9:.1f} GB per GPU" in note
    assert skewed["step_time_s"] == balanced["step_time_s"]  # the step time models no imbalance, as the note says
    assert not [w for w in skewed["warnings"] if w.startswith("routing is assumed")]
    no_ep = _json(["estimate", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "32", "--tp", "8", "--pp", "4"], capsys)
    assert not [w for w in no_ep["warnings"] if w.startswith("routing is assumed")]
    assert no_ep["published_mfu"]["layout_class"] == "moe"
