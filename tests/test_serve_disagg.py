"""Disaggregated serving (--disaggregate P:D): the pools, the KV hand-over, the bottleneck."""

from __future__ import annotations

import json

import pytest

from meshplan import io
from meshplan.cli import main
from meshplan.core.serving.load import Requests, step_at
from meshplan.reports.serve import resolve, serve_report

BASE = {"gpu": "h100-sxm", "gpus": 16, "tp": 4, "weights_dtype": "fp8", "kv_dtype": "fp8"}


def report(**kw: object) -> dict:
    return serve_report("llama-3.1-70b", **(BASE | kw))  # type: ignore[arg-type]


def test_kv_hand_over_is_the_prompt_cache_over_the_nic() -> None:
    """4,000 tokens x 80 layers x 2 x (8 KV heads / TP 4) x 128 x 1 byte = 40,960 B per token per GPU."""
    r = report(input_len=4000, output_len=500, rate=2, disaggregate="8:8")
    nic = io.load_link("ib-ndr")
    want = nic.latency_s + 4000 * 40_960 / nic.effective_bytes_per_s
    assert r["kv_bytes_per_token_per_gpu"] == 40_960
    assert r["disaggregated"]["kv_transfer_s"] == pytest.approx(want, rel=1e-9)
    assert r["ttft_s_unloaded"] > r["disaggregated"]["prefill_s"] + r["disaggregated"]["kv_transfer_s"]


def test_decode_steps_carry_no_prefill() -> None:
    """At the same decode batch, a disaggregated step is never slower than a colocated one with prompts riding."""
    dis = report(input_len=4000, output_len=500, concurrency=64, disaggregate="8:8")
    s = resolve("llama-3.1-70b", context=4500, **BASE)  # type: ignore[arg-type]
    req = Requests(input_len=4000, output_len=500, concurrency=64)
    colocated = float(step_at(s.model, s.shape, s.hw, s.layout, req, batch=dis["batch_per_replica"]).total_s)
    assert dis["tpot_s"] < colocated


def test_the_smaller_pool_is_the_bottleneck() -> None:
    long_prompts = report(input_len=8000, output_len=100, rate=1, disaggregate="4:12")["disaggregated"]
    long_answers = report(input_len=200, output_len=4000, rate=1, disaggregate="12:4")["disaggregated"]
    assert long_prompts["bottleneck"] == "prefill" and long_answers["bottleneck"] == "decode"
    over = report(input_len=8000, output_len=100, rate=1.1 * long_prompts["prefill_requests_per_s_max"],
                  disaggregate="4:12")  # fmt: skip
    assert over["saturated"] and over["ttft_s_p50"] is None


def test_closed_loop_held_back_by_prefill_queues_the_rest() -> None:
    r = report(input_len=8000, output_len=100, concurrency=500, disaggregate="4:12")
    d = r["disaggregated"]
    assert r["requests_per_s_total"] == pytest.approx(d["prefill_requests_per_s_max"])
    assert r["queue_s_p50"] > 0 and r["ttft_s_p50"] > r["queue_s_p50"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--disaggregate", "8:9"], "P + D = 16"),
        (["--disaggregate", "a:b"], "takes P:D"),
        (["--disaggregate", "6:10"], "whole replicas of 4 GPUs"),
        (["--disaggregate", "8:8", "--replicas", "4"], "drop --replicas"),
    ],
)
def test_bad_pools_exit_2(capsys: pytest.CaptureFixture[str], extra: list[str], message: str) -> None:
    argv = ["serve", "llama-3.1-70b", "--gpu", "h100-sxm", "--gpus", "16", "--tp", "4", "--input-len", "100",
            "--output-len", "100", "--rate", "1"]  # fmt: skip
    assert main([*argv, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_cli_json_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["serve", "llama-3.1-70b", "--gpu", "h100-sxm", "--gpus", "16", "--tp", "4", "--input-len", "2000",
            "--output-len", "300", "--rate", "2", "--disaggregate", "8:8"]  # fmt: skip
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["disaggregated"]["prefill_gpus"] == 8 and out["tokens_per_s_total"] > 0
    assert main(argv) == 0
    assert "KV hand-over" in capsys.readouterr().out
