"""MLPerf Inference's Llama-2-70B Server runs typed into ``serve`` (meshplan/validation/serving_load.py): the band
under Poisson arrivals holds what they published, the CLI line a user types gives the same answer, and serve says
when the arrivals take most of what a replica serves."""

from __future__ import annotations

import json
import shlex

import pytest

from meshplan.cli import main
from meshplan.reports.serve import serve_report
from meshplan.reports.serve_load import NEAR_CAPACITY
from meshplan.reports.serve_plan import serve_plan_report
from meshplan.validation.serving_load import FIGURES, check, command, flags, offline, rows, under_load


def test_the_rows_are_the_published_logs() -> None:
    """Four runs (v4.0, v4.1; 8 H100 at TP 2, 8 H200 at TP 1), each publishing TTFT and TPOT at p50, p99 and mean
    below MLPerf's Server limits (TTFT p99 2 s, TPOT p99 200 ms), at a rate 88-96% of the same system's Offline
    result (the submitters push the rate to the limits)."""
    got = rows()
    assert len(got) == 4 and {r["gpu"] for r in got} == {"h100-sxm", "h200"}
    for r in got:
        assert r["ttft_ms"]["p99"] <= 2000 and r["tpot_ms"]["p99"] <= 200
        assert r["ttft_ms"]["p50"] <= r["ttft_ms"]["p99"] and r["tpot_ms"]["p50"] <= r["tpot_ms"]["p99"]
        share = r["rate_per_s"] * r["output_len"] / r["offline_tokens_per_s"]
        assert 0.85 < share < 0.97, r["id"]


@pytest.mark.parametrize("row", rows(), ids=lambda r: r["id"])
def test_every_published_figure_lies_inside_the_band_serve_prints(row: dict) -> None:
    """The promise of the band under load: each of the six figures inside its P10-P90. The point figures are far
    below (the batch in flight is a quarter of the published one's; docs/validation.md): the band holds them
    because a machine the decode rows' P90 slower cannot keep up with these arrivals, as the published runs
    barely did."""
    checks, report = check(row)
    assert [c.figure for c in checks] == list(FIGURES)
    for c in checks:
        assert c.inside, (c.figure, c.measured_s, c.band_s)
    assert report["load_band"]["ttft_s_p99"][1] is None  # the slow machine saturates
    assert any("of what a replica serves" in w for w in report["warnings"])


def test_the_typed_command_is_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    row = rows()[0]
    assert main([*shlex.split(command(row))[1:], "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    direct = serve_report("llama-2-70b", **flags(row))
    for key in ("tpot_s", "ttft_s_p99", "batch_per_replica", "load_band"):
        assert printed[key] == direct[key], key  # JSON keeps every float exactly


def test_the_warning_starts_at_the_share_of_capacity() -> None:
    """Poisson arrivals below 80% of what a replica serves at its cap: no warning; above: one, naming the share."""
    kw = flags(rows()[0]) | {"rate": 1.0}
    top = serve_report("llama-2-70b", **kw)["max_tokens_per_s_per_gpu"] * 8 / kw["output_len"]  # requests/s
    below = serve_report("llama-2-70b", **kw | {"rate": 0.75 * top})
    above = serve_report("llama-2-70b", **kw | {"rate": 0.9 * top})
    assert not any("of what a replica serves" in w for w in below["warnings"])
    share = above["tokens_per_s_per_gpu"] / above["max_tokens_per_s_per_gpu"]
    assert share >= NEAR_CAPACITY and f"take {share:.0%} of" in " ".join(above["warnings"])
    # the batch on a machine 5% slower: the same traffic 5% faster on the model's clock, re-solved
    moved = serve_report("llama-2-70b", **kw | {"rate": 0.9 * top * 1.05})
    grows = moved["batch_per_replica"] / above["batch_per_replica"]
    assert grows > 1.1  # near capacity a few percent of step time moves the batch far more
    assert f"holds {grows:.1f} times the sequences ({moved['batch_per_replica']:,.0f} a replica)" in " ".join(
        above["warnings"]
    )
    closed = serve_report("llama-2-70b", **{k: v for k, v in kw.items() if k != "rate"}, concurrency=4000.0)
    assert not any("of what a replica serves" in w for w in closed["warnings"])


@pytest.mark.parametrize("row", [r for r in rows() if r["id"].startswith("mlperf-v4.1")], ids=lambda r: r["id"])
def test_the_planner_at_mlperfs_limits_runs_as_the_submission_did(row: dict) -> None:
    """serve-plan asked as the v4.1 submitters asked (TTFT p99 2 s, TPOT p99 200 ms, FP8 allowed) picks their layout
    and a batch cap within 25% of theirs, and its tokens/s a GPU (a closed loop at the cap, as an Offline run
    holds) is the same system's published Offline result within 10% (+3.5% on H100, +0.1% on H200 today)."""
    r = serve_plan_report(
        "llama-2-70b", gpu=row["gpu"], gpus=8, input_len=row["input_len"], output_len=row["output_len"],
        ttft_p99_s=2.0, tpot_p99_s=0.2, allow_quantization=True, engine="trtllm",
    )  # fmt: skip
    best = r["best"]
    assert (best["layout"]["tp"], best["replicas"], best["layout"]["weights_dtype"]) == (
        row["tp"],
        row["replicas"],
        "fp8",
    )
    assert best["batch_cap_per_replica"] == pytest.approx(row["max_batch"], rel=0.25)
    assert best["tokens_per_s_per_gpu"] * 8 == pytest.approx(row["offline_tokens_per_s"], rel=0.10)
    assert best["tpot_s_p99"] <= 0.2 and best["ttft_s_p99"] <= 2.0


@pytest.mark.parametrize("row", rows(), ids=lambda r: r["id"])
def test_the_offline_runs_are_the_capacity_the_servers_ran_below(row: dict) -> None:
    """``serve --num-requests 24576`` at the Offline config's batch cap against the published Offline result: within
    5% for v4.1 (+2.9% on H100, +0.3% on H200 today), within 20% for v4.0, whose older TensorRT-LLM ran 13-16%
    slower on the same systems; inside the band serve prints either way."""
    o = offline(row)
    assert abs(o["error"]) < (0.05 if row["id"].startswith("mlperf-v4.1") else 0.20)
    assert o["inside"]


def test_validate_sets_the_p99_errors_beside_the_best_constant() -> None:
    """The bar a model must clear: one p99 guessed for all four runs (re-derived here on a fine grid). Today the
    model does not clear it under load (82% and 70% against 15% and 9.5%); the Offline rates do (8.1% against 11.4%)."""
    u = under_load()
    published = {k: [row[f"{k}_ms"]["p99"] / 1e3 for row in rows()] for k in ("ttft", "tpot")}
    for k, values in published.items():
        grid = [min(values) + (max(values) - min(values)) * i / 20000 for i in range(20001)]
        best = min(sum(abs(c / v - 1) for v in values) / len(values) for c in grid)
        assert u["p99_best_constant_mean_abs_error"][k] == pytest.approx(best, abs=1e-4)
        errors = [f["error"] for f in u["figures"] if f["figure"] == f"{k}_s_p99"]
        assert u["p99_mean_abs_error"][k] == pytest.approx(sum(map(abs, errors)) / len(errors))
    assert u["offline_mean_abs_error"] < u["offline_best_constant_mean_abs_error"]
