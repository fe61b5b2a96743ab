"""Days, dollars and goodput: the arithmetic re-derived by hand for one case each (goodput at Llama 3's failure
rate, the cost to train, serving's cost per million tokens), the cost objective's ranking by GPU-hours, and the
refusals of inputs that cannot be answered."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from meshplan.cli import main
from meshplan.core import goodput as gp

LLAMA_405B = 405_853_388_800
"""Llama 3.1 405B's parameters (tests/golden hold the published totals)."""
ESTIMATE_405B = ["estimate", "llama-3.1-405b", "--gpu", "h100-sxm", "--gpus", "16384", "--tp", "8", "--sp", "--pp",
                 "16", "--zero", "1", "--seq", "8192", "--global-batch", "2048"]  # fmt: skip
LLAMA3_MTBF = 54 * 24 * 16384 / 466
"""Llama 3 (Sec. 3.3.4): 466 interruptions in 54 days on 16,384 GPUs, as GPU-hours per failure of one GPU."""
PLAN_8B = ["plan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "16", "--seq", "4096", "--global-batch-tokens",
           "1M", "--tokens", "1T"]  # fmt: skip
SERVE_8B = ["serve", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--input-len", "1000", "--output-len", "200",
            "--concurrency", "32"]  # fmt: skip


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main([*argv, "--json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def run_text(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_llama3_failure_rate_goodput_by_hand(capsys: pytest.CaptureFixture[str]) -> None:
    """405B on 16,384 H100 at Llama 3's failure rate, 1 GB/s per node, a save every 4 minutes, 10-minute
    restarts: every figure of the report re-derived from the published numbers alone."""
    flags = ["--tokens", "15T", "--mtbf-gpu-hours", str(LLAMA3_MTBF), "--checkpoint-bandwidth", "1",
             "--checkpoint-interval-minutes", "4", "--restart-minutes", "10"]  # fmt: skip
    r = run_json(capsys, *ESTIMATE_405B, *flags)
    job_mtbf_h = 54 * 24 / 466  # the job fails every 2.78 h
    assert job_mtbf_h == pytest.approx(2.781, abs=1e-3)
    ckpt_bytes = LLAMA_405B * (2 + 4 + 8)  # bf16 weights, fp32 master copy, two fp32 Adam moments
    save_s = ckpt_bytes / (1e9 * 16384 / 8)  # 2,048 nodes of 8 GPUs, each writing at 1 GB/s
    k, g = r["checkpoint"], r["goodput"]
    assert k["bytes_total"] == pytest.approx(ckpt_bytes, rel=1e-12) and k["nodes"] == 2048
    assert k["save_s"] == pytest.approx(save_s, rel=1e-12) == pytest.approx(2.774, abs=1e-3)
    assert g["job_mtbf_hours"] == pytest.approx(job_mtbf_h, rel=1e-12)
    mtbf_s = job_mtbf_h * 3600
    assert g["optimal_interval_s"] == pytest.approx(math.sqrt(2 * save_s * mtbf_s), rel=1e-12)  # Young / Daly
    assert g["optimal_interval_s"] == pytest.approx(235.7, abs=0.1)
    waste = 600 + 240 / 2  # restart + half of the 4-minute interval
    goodput = (1 - waste / mtbf_s) / (1 + save_s / 240)
    assert g["waste_s_per_failure"] == pytest.approx(waste) and g["interval_source"] == "minutes given"
    assert g["goodput_fraction"] == pytest.approx(goodput, rel=1e-12) == pytest.approx(0.9175, abs=1e-4)
    train_s = 15e12 / (r["tokens_per_s_per_gpu"] * 16384)
    assert g["wall_time_days"] == pytest.approx(train_s / goodput / 86400, rel=1e-12)
    assert g["gpu_hours_total"] == pytest.approx(train_s / goodput * 16384 / 3600, rel=1e-12)
    assert g["failures_total"] == pytest.approx(train_s / goodput / mtbf_s, rel=1e-12)
    assert r["time_to_train"]["wall_time_days"] == pytest.approx(train_s / 86400, rel=1e-12)  # failure-free
    text = run_text(capsys, *ESTIMATE_405B, *flags)
    assert f"goodput {100 * goodput:.1f}%" in text and "one every 2.78 h" in text
    assert f"{g['wall_time_days']:,.1f} days" in text and "5.68 TB" in text and "2.77 s" in text


def test_unset_interval_is_young_daly_in_whole_steps(capsys: pytest.CaptureFixture[str]) -> None:
    g = run_json(capsys, *ESTIMATE_405B, "--mtbf-gpu-hours", str(LLAMA3_MTBF), "--checkpoint-bandwidth", "1")["goodput"]
    step = g["interval_s"] / g["interval_steps"]
    assert g["interval_source"] == "Young/Daly optimum" and g["interval_steps"] == round(g["optimal_interval_s"] / step)
    assert "wall_time_days" not in g  # no --tokens: the fractions only


def test_cost_to_train_by_hand(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, *ESTIMATE_405B, "--tokens", "15T", "--price-per-gpu-hour", "2")
    gpu_hours = 15e12 / r["tokens_per_s_per_gpu"] / 3600  # GPUs x (tokens / (tokens/s per GPU x GPUs)) / 3600
    assert r["time_to_train"]["gpu_hours_total"] == pytest.approx(gpu_hours, rel=1e-12)
    assert r["cost"]["cost_total"] == pytest.approx(2 * gpu_hours, rel=1e-12)
    assert r["cost"]["cost_per_million_tokens"] == pytest.approx(2 * gpu_hours / 15e6, rel=1e-12)
    assert "goodput" not in r and "checkpoint" not in r  # only what was asked for
    text = run_text(capsys, *ESTIMATE_405B, "--tokens", "15T", "--price-per-gpu-hour", "2")
    per_million = 2 * gpu_hours / 15e6
    assert f"cost at 2 per GPU-hour: {per_million:.3g} per million tokens, {2 * gpu_hours / 1e6:.3g}M for 15T" in text


def test_no_price_no_cost(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, *ESTIMATE_405B, "--tokens", "15T")
    assert not {"cost", "checkpoint", "goodput"} & set(r)
    assert "cost" not in run_text(capsys, *ESTIMATE_405B, "--tokens", "15T")


def test_serve_cost_per_million_output_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, *SERVE_8B, "--price-per-gpu-hour", "2")
    want = 2 * 8 / (r["tokens_per_s_total"] * 3600) * 1e6
    assert r["cost"]["cost_per_million_output_tokens"] == pytest.approx(want, rel=1e-12)
    assert f"{want:.3g} per million output tokens" in run_text(capsys, *SERVE_8B, "--price-per-gpu-hour", "2")
    assert "cost" not in run_json(capsys, *SERVE_8B)


def test_cost_objective_ranks_by_gpu_hours(capsys: pytest.CaptureFixture[str]) -> None:
    """On 16 GPUs the fastest layout is not the cheapest way to train 1T tokens: 8 GPUs train them for fewer
    GPU-hours; the plans on the fleet kept are in GPU-hour order."""
    fastest = run_json(capsys, *PLAN_8B)
    cheap = run_json(capsys, *PLAN_8B, "--objective", "cost", "--price-per-gpu-hour", "2")
    fleets = cheap["cheapest_fleet"]["fleets"]
    assert [f["gpus"] for f in fleets] == [16, 8, 4, 2, 1] and not fleets[-1]["fits"]
    hours = {f["gpus"]: 1e12 / f["tokens_per_s_per_gpu"] / 3600 for f in fleets if f["fits"]}  # by hand
    for f in fleets[:-1]:
        assert f["gpu_hours_total"] == pytest.approx(hours[f["gpus"]], rel=1e-12)
    assert cheap["gpus"] == min(hours, key=hours.__getitem__) == 8 and cheap["objective"] == "cost"
    plans = cheap["plans"]
    assert [p["gpu_hours_total"] for p in plans] == sorted(p["gpu_hours_total"] for p in plans)
    assert plans[0]["gpu_hours_total"] == pytest.approx(hours[8], rel=1e-12)
    assert plans[0]["cost"]["cost_total"] == pytest.approx(2 * hours[8], rel=1e-12)
    assert fastest["gpus"] == 16 and fastest["plans"][0]["gpu_hours_total"] > plans[0]["gpu_hours_total"]
    assert fastest["plans"][0]["step_time_s"] < plans[0]["step_time_s"]  # faster, yet dearer
    deadline = run_json(capsys, *PLAN_8B, "--objective", "cost", "--days", "100")
    assert deadline["gpus"] == 16  # 8 GPUs take 133 days
    assert [f["meets_deadline"] for f in deadline["cheapest_fleet"]["fleets"][:2]] == [True, False]


def test_cost_objective_table(capsys: pytest.CaptureFixture[str]) -> None:
    text = run_text(capsys, *PLAN_8B, "--objective", "cost", "--price-per-gpu-hour", "2")
    assert "cheapest fleet to train 1T tokens: 8 GPUs" in text and "1: nothing fits" in text
    header = next(line for line in text.splitlines() if line.startswith("#"))
    assert "days" in header and "GPU-hours" in header and "cost" in header


def test_goodput_penalises_the_larger_fleet() -> None:
    """Same failure-free GPU-hours, twice the GPUs: the job fails twice as often and writes its checkpoint twice
    as fast; at Llama 3's rate the larger fleet loses more (restarts dominate)."""
    save = 10.0

    def fraction(gpus: int) -> float:
        mtbf = gp.job_mtbf_s(gp.LLAMA3_MTBF_GPU_HOURS, gpus)
        s = save * 8192 / gpus
        return gp.goodput(mtbf_s=mtbf, save_s=s, interval_s=gp.young_daly_interval_s(s, mtbf), restart_s=600).fraction

    assert fraction(16384) < fraction(8192) < fraction(4096)
    assert abs(gp.LLAMA3_MTBF_GPU_HOURS - 45_565.8) < 0.1


def test_young_daly_is_near_the_best_interval() -> None:
    mtbf, save = 10_000.0, 3.0
    best = max(gp.goodput(mtbf_s=mtbf, save_s=save, interval_s=t, restart_s=0).fraction for t in range(10, 2000))
    at_young = gp.goodput(mtbf_s=mtbf, save_s=save, interval_s=gp.young_daly_interval_s(save, mtbf), restart_s=0)
    assert best - 1e-4 < at_young.fraction <= best + 1e-12


def test_a_job_that_never_finishes() -> None:
    g = gp.goodput(mtbf_s=600.0, save_s=1.0, interval_s=120.0, restart_s=600.0)
    assert g.fraction == 0.0 and not g.finishes and g.wall_s(100.0) == math.inf


def test_never_finishing_job_in_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, *ESTIMATE_405B, "--tokens", "15T", "--mtbf-gpu-hours", "1000", "--checkpoint-bandwidth",
                 "1", "--restart-minutes", "60")  # fmt: skip
    assert r["goodput"]["goodput_fraction"] == 0.0 and r["goodput"]["wall_time_days"] is None
    assert any("never finishes" in w for w in r["warnings"])


def test_lora_checkpoint_holds_the_adapters_alone(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, "estimate", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--finetune", "lora",
                 "--checkpoint-bandwidth", "2")  # fmt: skip
    assert r["checkpoint"]["bytes_total"] == pytest.approx(r["trainable_params"] * 14, rel=1e-12)
    assert r["checkpoint"]["save_s"] == pytest.approx(r["trainable_params"] * 14 / 2e9, rel=1e-12)  # one node


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--mtbf-gpu-hours", "45566"], "--checkpoint-bandwidth"),
        (["--checkpoint-interval", "100", "--checkpoint-bandwidth", "1"], "--mtbf-gpu-hours"),
        (["--checkpoint-interval", "100", "--checkpoint-interval-minutes", "5"], "not both"),
        (["--price-per-gpu-hour", "0"], "--price-per-gpu-hour"),
        (["--checkpoint-bandwidth", "nan"], "--checkpoint-bandwidth"),
        (["--restart-minutes", "-1"], "--restart-minutes"),
    ],
)
def test_bad_cost_inputs_are_one_line_errors(extra: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ESTIMATE_405B, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and needle in err, err


def test_cost_objective_needs_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*PLAN_8B[:-2], "--objective", "cost"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--tokens" in err


def test_api_answers_the_cost_keys_as_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from meshplan.server.app import create_app

    est = {"model": "llama-3.1-405b", "gpu": "h100-sxm", "gpus": 16384, "tp": 8, "sp": True, "pp": 16, "zero": 1,
           "seq": 8192, "global_batch": 2048, "tokens": 15e12, "price_per_gpu_hour": 2,
           "mtbf_gpu_hours": LLAMA3_MTBF, "checkpoint_bandwidth": 1}  # fmt: skip
    flags = ["--tokens", "15T", "--price-per-gpu-hour", "2", "--mtbf-gpu-hours", str(LLAMA3_MTBF),
             "--checkpoint-bandwidth", "1"]  # fmt: skip
    srv = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 8, "input_len": 1000, "output_len": 200,
           "concurrency": 32, "price_per_gpu_hour": 2}  # fmt: skip
    with TestClient(create_app(), base_url="http://127.0.0.1") as client:
        assert client.get("/api/estimate", params=est).json() == run_json(capsys, *ESTIMATE_405B, *flags)
        assert client.get("/api/serve", params=srv).json() == run_json(capsys, *SERVE_8B, "--price-per-gpu-hour", "2")
        refused = client.get("/api/estimate", params={k: v for k, v in est.items() if k != "checkpoint_bandwidth"})
    assert refused.status_code == 400 and "--checkpoint-bandwidth" in refused.json()["error"]
