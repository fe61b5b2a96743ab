"""meshplan plan and meshplan recipe: the JSON contract, explanations, objectives and the published recipes."""

import itertools
import json
from collections.abc import Callable

import pytest

from meshplan.cli import main
from meshplan.cli.tables import render_table
from meshplan.reports.inputs import FinetuneRequest, LayoutRequest
from meshplan.reports.plan import plan_report
from meshplan.reports.plan_explain import parse_compare
from meshplan.reports.recipes import factors, list_report, recipe_report, recipes


def test_plan_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "plan",
                "llama-3.1-70b",
                "--gpu",
                "h200",
                "--gpus",
                "64",
                "--seq",
                "8192",
                "--global-batch-tokens",
                "4194304",
                "--top",
                "3",
                "--explain",
                "--compare",
                "tp=8,pp=2,zero=1,sp=true",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    for key in ("evaluated", "feasible", "elapsed_s", "plans", "pareto", "rejections"):
        assert key in out
    assert out["evaluated"] >= out["feasible"] > 0 and len(out["plans"]) == 3
    for p in out["plans"]:
        assert set(p["layout"]) >= {
            "tp",
            "pp",
            "vpp",
            "cp",
            "ep",
            "dp_shard",
            "dp_replicate",
            "zero",
            "sp",
            "recompute",
            "micro_batch",
        }
        assert {"step_time_s", "mfu", "tokens_per_s_per_gpu", "per_gpu", "placement"} <= set(p)
        assert p["per_gpu"]["total_bytes"] <= 0.9 * 143_771 * 2**20
    times = [p["step_time_s"] for p in out["plans"]]
    assert times == sorted(times)
    assert all(isinstance(v, int) and v > 0 for v in out["rejections"].values())
    front = out["pareto"]
    assert [f["step_time_s"] for f in front] == sorted(f["step_time_s"] for f in front)
    assert all(a["memory_bytes_per_gpu"] > b["memory_bytes_per_gpu"] for a, b in itertools.pairwise(front))
    explained = {e["b"]: e for e in out["explain"]}
    assert "runner-up" in explained and "tp=8,pp=2,zero=1,sp=true" in explained
    assert "slower per step" in explained["tp=8,pp=2,zero=1,sp=true"]["why"]


def test_fewest_gpus_meets_the_deadline() -> None:
    out = plan_report(
        "llama-3.1-8b",
        gpu="h100-sxm",
        gpus=8,
        seq=4096,
        global_batch_tokens=1 << 21,
        objective="fewest-gpus",
        tokens=1e12,
        days=30,
        top=1,
    )
    days = 1e12 / (out["plans"][0]["tokens_per_s_per_gpu"] * out["gpus"]) / 86400
    assert days <= 30
    assert out["objective"] == "fewest-gpus"
    fewest = out["fewest_gpus"]
    assert {k: fewest[k] for k in ("gpus", "searched_from", "tokens", "days")} == {
        "gpus": out["gpus"],
        "searched_from": 8,
        "tokens": 1e12,
        "days": 30,
    }
    # every size tried below the answer misses the deadline, every one at or above it that met it is larger
    tried = {t["gpus"]: t for t in fewest["tried"]}
    assert tried[out["gpus"]]["meets_deadline"] and tried[out["gpus"]]["days"] == pytest.approx(days)
    assert all(not t["meets_deadline"] for n, t in tried.items() if n < out["gpus"])
    assert fewest["sizes_untried_below"] == 0
    half = (
        plan_report("llama-3.1-8b", gpu="h100-sxm", gpus=out["gpus"] // 2, seq=4096, global_batch_tokens=1 << 21, top=1)
        if out["gpus"] > 8
        else None
    )
    if half is not None:  # the half fleet misses the deadline
        assert 1e12 / (half["plans"][0]["tokens_per_s_per_gpu"] * half["gpus"]) / 86400 > 30


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("tp8", "key=value"), ("tq=8", "unknown layout key"), ("tp=eight", "--tp: expected an integer")],
)
def test_bad_compare_strings(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        parse_compare(text)


def test_plan_bad_input_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "plan",
                "llama-3.1-8b",
                "--gpu",
                "h100-sxm",
                "--gpus",
                "8",
                "--seq",
                "4096",
                "--global-batch-tokens",
                "1000",
            ]
        )
        == 2
    )
    assert "whole number" in capsys.readouterr().err


def test_recipe_list_is_the_fleet_ruler() -> None:
    items = {r["name"]: r for r in list_report()["recipes"]}
    assert items["llama3-405b-8k"]["factors"] == {"tp": 8, "pp": 16, "dp": 128, "gpus": 16384}
    assert items["llama3-405b-128k"]["factors"] == {"tp": 8, "cp": 16, "pp": 16, "dp": 8, "gpus": 16384}
    assert items["deepseek-v3"]["factors"] == {"tp": 1, "pp": 16, "ep": 64, "dp": 128, "gpus": 2048}
    for name in recipes():
        f = factors(name)
        product = f["tp"] * f.get("cp", 1) * f["pp"] * f["dp"]
        assert product == f["gpus"], name


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(recipes()))
def test_published_recipes_are_valid_and_ranked(name: str, ranked_recipe: Callable[[str], dict]) -> None:
    r = ranked_recipe(name)
    s = r["search"]
    assert s["feasible"] > 0 and s["rank_of_published"] >= 1
    if r["layout"]["schedule"] == "dualpipe":
        # DualPipe is searched too (an even pipeline, 2 pp micro-batches or more): the published layout, which
        # keeps less than the planner's headroom, is within 5% of the best the planner keeps (DeepSeek-V3 with its
        # IB-then-NVLink dispatch priced as such: TP 2 x PP 8 x EP 128 under DualPipe 2.8% faster)
        assert s["best_step_time_s"] <= s["published_step_time_s"] <= 1.05 * s["best_step_time_s"]
    elif s["published_fits_with_headroom"]:
        # the planner finds something at least as fast as the published layout
        assert s["best_step_time_s"] <= s["published_step_time_s"] * (1 + 1e-9)
    else:
        # the published layout is left out by the headroom it does not keep (Llama 3's at 8K is billed 8 GB over
        # HBM): the best that the planner keeps, ring or all-gathered CP, is near it (8K: 0.9% faster, 128K: 2.7%
        # slower)
        assert s["best_step_time_s"] <= s["published_step_time_s"] * 1.05
    if name.startswith("llama3"):
        # near the top: within 3% of the best the planner finds
        assert s["published_step_time_s"] <= 1.03 * s["best_step_time_s"]
    # the table never says a layout billed over HBM (or short of the headroom) ranks among those that fit
    (line,) = [x for x in render_table("recipe", r).splitlines() if x.startswith("planner:")]
    said = {"over": "is billed over HBM" in line, "short": "less than the planner's headroom" in line}
    assert said == {"over": not r["fits"], "short": r["fits"] and not s["published_fits_with_headroom"]}, line


def test_memory_verdict_of_recipes() -> None:
    """The Megatron recipes fit in our bill; the Llama 3 ones (no recompute at 8K tokens per GPU) are predicted
    over 80 GB: a known gap of the activation accounting for that framework, stated in docs/formulas.md."""
    fits = {name: recipe_report(name, rank=False)["fits"] for name in recipes()}
    assert fits["megatron-gpt3-175b"] and fits["megatron-1t"]
    assert not fits["llama3-405b-8k"]
    assert fits["deepseek-v3"]  # with the recompute its report states (Sec. 3.2.3, 3.3.2)


def test_pins_keep_only_the_layouts_asked_for() -> None:
    pins = {"zero": 1, "recompute": "none", "micro_batch": 1, "tp": 4}
    out = plan_report("llama-3.1-70b", gpu="h200", gpus=64, seq=8192, global_batch_tokens=4 * 2**20, pins=pins)
    assert out["plans"]
    for p in out["plans"] + out["pareto"]:
        lay = p["layout"]
        assert (lay["zero"], lay["recompute"], lay["micro_batch"], lay["tp"]) == (1, "none", 1, 4)
    assert out["rejections"]["not the pinned tp"] > 0


def test_engine_filter_gives_plans_the_export_accepts() -> None:
    """The README's plan ranks first a layout torchtitan cannot run (ZeRO-1); with --engine it exports."""
    from meshplan.exports import UnsupportedByEngine
    from meshplan.reports.export import export_training

    kw = dict(gpu="h200", gpus=64, seq=8192, global_batch_tokens=4 * 2**20, top=3)
    free = plan_report("llama-3.1-70b", **kw)
    first = LayoutRequest.parse(free["plans"][0]["layout"])
    with pytest.raises(UnsupportedByEngine):
        export_training("torchtitan", "llama-3.1-70b", gpu="h200", gpus=64, layout=first, seq=8192,
                        global_batch=free["global_batch"])  # fmt: skip
    out = plan_report("llama-3.1-70b", training_engine="torchtitan", **kw)
    assert out["engine"] == "torchtitan" and len(out["plans"]) == 3
    for p in out["plans"]:
        layout = LayoutRequest.parse(p["layout"])
        export_training("torchtitan", "llama-3.1-70b", gpu="h200", gpus=64, layout=layout, seq=8192,
                        global_batch=out["global_batch"])  # fmt: skip


def test_when_nothing_fits_the_plan_says_what_would() -> None:
    """70B on 8 H100s cannot train at 8K: the answer names the lightest bill, the fleet that fits, the variants."""
    kw = dict(gpu="h100-sxm", seq=8192, global_batch_tokens=2**20)
    out = plan_report("llama-3.1-70b", gpus=8, finetune=FinetuneRequest(mode="full"), **kw)
    assert out["plans"] == []
    n = out["nothing_fits"]
    budget = 0.9 * 81_559 * 2**20  # 90% of the H100 driver total
    assert n["lightest_bytes_per_gpu"] > n["budget_bytes_per_gpu"] == pytest.approx(budget)
    # the lightest layout billed is the one estimate bills at the same size
    from meshplan.reports.estimate import estimate_report

    est = estimate_report("llama-3.1-70b", gpu="h100-sxm", gpus=8, layout=LayoutRequest.parse(n["lightest_layout"]),
                          seq=8192, global_batch=out["global_batch"])  # fmt: skip
    assert est["per_gpu"]["total_bytes"] == pytest.approx(n["lightest_bytes_per_gpu"], rel=1e-9)
    fewest = n["fewest_gpus_that_fit"]
    assert fewest and plan_report("llama-3.1-70b", gpus=fewest, **kw)["plans"]
    assert not plan_report("llama-3.1-70b", gpus=fewest // 2, **kw)["plans"]
    changes = {v["change"] for v in n["variants"]}
    assert {"--finetune lora", "--finetune qlora"} <= changes
