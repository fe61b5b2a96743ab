"""``meshplan serve`` and ``validate --serving`` on the command line: JSON keys, tables, exit code 2."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from meshplan.cli import main

SERVE = ["serve", "llama-3.1-70b", "--gpu", "h100-sxm", "--gpus", "8", "--input-len", "1000", "--output-len", "200"]
KEYS = {
    "ttft_s_p50",
    "ttft_s_p99",
    "tpot_s",
    "itl_s",
    "tokens_per_s_per_gpu",
    "tokens_per_s_per_user",
    "requests_per_s_total",
    "batch_per_replica",
    "batch_limit",
    "knee_batch_per_replica",
    "step_s",
}


def test_serve_json_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SERVE, "--tp", "2", "--weights-dtype", "fp8", "--rate", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= KEYS
    assert out["layout"] == {"tp": 2, "pp": 1, "ep": 1, "dp_attention": False, "replicas": 4}
    assert out["requests_per_s_total"] == pytest.approx(5.0)
    assert set(out["step_s"]) == {
        "weights_read_s", "kv_read_s", "compute_s", "communication_s", "overhead_s", "host_wait_s"
    }  # fmt: skip
    assert out["step_s"]["host_wait_s"] == 0.0 and out["launch"] == "cudagraph"
    assert sum(out["step_s"].values()) == pytest.approx(out["tpot_s"], rel=1e-9)
    assert out["tokens_per_s_per_gpu"] * 8 == pytest.approx(out["tokens_per_s_total"])


@pytest.mark.parametrize(("quant", "dtype", "compute"), [("w-a", "fp8", "w-a"), ("weight-only", "fp8", "weight-only")])
def test_serve_quant_flag(capsys: pytest.CaptureFixture[str], quant: str, dtype: str, compute: str) -> None:
    assert main([*SERVE, "--weights-dtype", dtype, "--quant", quant, "--rate", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["quant"] == compute


def test_serve_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SERVE, "--concurrency", "64"]) == 0
    out = capsys.readouterr().out
    assert "TTFT p50/p99/mean" in out and "TPOT p50 / p99" in out
    assert "tokens/s per GPU" in out and "weights read" in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--tp", "3", "--rate", "1"], "must divide gpus"),
        (["--weights-dtype", "fp4", "--quant", "w-a", "--rate", "1"], "no fp4 tensor cores: use weight-only"),
        (["--ep", "2", "--rate", "1"], "needs a MoE model"),
        (["--concurrency", "0"], "--concurrency: 0 is outside (0, 1e+07]"),
        ([], "one of the arguments --concurrency --rate --num-requests --batch is required"),
        (["--batch", "4", "--concurrency", "2"], "not allowed with"),
        (["--rate", "1", "--concurrency", "2"], "not allowed with"),
    ],
)
def test_serve_bad_input_exits_2(capsys: pytest.CaptureFixture[str], extra: list[str], message: str) -> None:
    assert main([*SERVE, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_validate_serving_json(capsys: pytest.CaptureFixture[str], shared_validation: Callable[[str], None]) -> None:
    shared_validation("serving")  # the session's report, computed once
    code = main(["validate", "--serving", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == (0 if out["all_ok"] else 1)
    # 68 shared rows, the Splitwise and NIM ones with every metric (14 x 2, 7 x 3), and the 16 MoE rows
    assert len({r["case"] for r in out["runs"] if r["shared"]}) == 68
    assert sum(r["shared"] for r in out["runs"]) == 47 + 14 * 2 + 7 * 3 and len(out["runs"]) == 96 + 16
    assert {c["metric_class"] for c in out["classes"]} >= {"decode", "prefill", "throughput-dense", "throughput-moe"}
    assert main(["validate", "--serving"]) == code
    text = capsys.readouterr().out
    band = out["band"]
    row = f"decode               32        4      1.43  {band['decode_time_ratio_p10']:.3f}"
    assert "widened for few sources (the band `serve` prints)" in " ".join(text.split()) and row in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["llama-3.1-8b", "--gpus", "64", "--tp", "64"], "does not divide the 32 attention heads"),
        (["llama-3.1-8b", "--gpus", "64", "--pp", "200"], "pp=200 exceeds gpus=64"),
        (["deepseek-v3", "--gpus", "8", "--dp-attention"], "give --ep 8"),
        (["llama-3.1-8b", "--gpus", "1", "--input-len", "10000000"], "fits in the KV cache"),
    ],
)
def test_serve_layout_errors(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    base = ["serve", argv[0], "--gpu", "h200", "--input-len", "100", "--output-len", "100", "--concurrency", "4"]
    assert main([*base, *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_serve_prints_the_held_out_band_of_each_figure(capsys: pytest.CaptureFixture[str]) -> None:
    """TPOT, unloaded TTFT and tokens/s per GPU each carry the P10-P90 of measured over predicted time on the
    published serving measurements of their kind (catalog/serving/held_out.toml): decode, prefill, and the
    throughput rows of dense or MoE models; a rate's low end comes from the time ratio's P90. --engine trtllm on an
    H100 with a model class the rows ran takes that engine family's band, unwidened (with no engine stated the band
    is widened as for an unseen engine: tests/test_serve_engine_source.py)."""
    from meshplan import io

    band = io.serving_held_out_band()
    moe = ["serve", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "8", "--input-len", "1000", "--output-len", "200"]
    for argv, kind in ((SERVE, "throughput_dense"), (moe, "throughput_moe")):
        assert main([*argv, "--tp", "8", "--concurrency", "64", "--engine", "trtllm", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        for key, cls in (("tpot_s", "decode"), ("ttft_s_unloaded", "prefill")):
            fam = f"{cls}_engine_trtllm"
            assert out[f"{key}_p10"] == pytest.approx(out[key] * band[f"{fam}_time_ratio_p10"], rel=1e-12)
            assert out[f"{key}_p90"] == pytest.approx(out[key] * band[f"{fam}_time_ratio_p90"], rel=1e-12)
        rate, fam = out["tokens_per_s_per_gpu"], f"{kind}_engine_trtllm"
        assert out["tokens_per_s_per_gpu_p10"] == pytest.approx(rate / band[f"{fam}_time_ratio_p90"], rel=1e-12)
        assert out["tokens_per_s_per_gpu_p90"] == pytest.approx(rate / band[f"{fam}_time_ratio_p10"], rel=1e-12)
        borrowed = ["one source: its sibling class's spread"] if kind == "throughput_moe" else []
        assert out["band_widened"] == borrowed and out["band_sources"]["tpot"] == band["decode_engine_trtllm_sources"]
        assert f"throughput) from {int(band[f'{kind}_runs'])} runs of " in out["uncertainty"]
    assert main([*SERVE, "--tp", "2", "--concurrency", "64", "--disaggregate", "4:4"]) == 0
    text = capsys.readouterr().out
    assert "P10 - P90" in text and "P10-P90 of measured over predicted on published serving" in text
