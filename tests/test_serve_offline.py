"""Offline runs of N requests (core/serving/offline.py) and CUDA-graph padding of decode-only steps."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.cli import main
from meshplan.core.serving.load import Requests, load_point
from meshplan.core.serving.offline import offline_run, offline_schedule
from meshplan.core.serving.phases import decode_step
from meshplan.core.serving.shape import CUDA_GRAPH_BATCH_SIZES, graph_batch
from meshplan.reports.serve import resolve, serve_report


def test_schedule_by_hand() -> None:
    """10 requests of 1000 + 3 tokens, 4 slots, 2,048 tokens a step: step 0 prefills two prompts and 48 tokens of
    the third (their first tokens come out there), step 1 the rest of the third and the fourth beside the two
    decoding; each sequence decodes its 2 remaining tokens in the 2 steps after its prompt, then frees its slot."""
    b, p = offline_schedule(input_len=1000, output_len=3, num_requests=10, max_sequences=4, max_num_tokens=2048)
    assert list(b[:4]) == [0, 2, 4, 2] and list(p[:4]) == [2048, 1952, 0, 2000]
    assert p.sum() == 10 * 1000  # every prompt once
    assert b.sum() + 10 == 10 * 3  # every output token: the first from the prompt's step, the rest decoding


@pytest.mark.parametrize(("slots", "tokens"), [(7, 512), (64, 4096), (500, 2048)])
def test_schedule_keeps_its_caps(slots: int, tokens: int) -> None:
    b, p = offline_schedule(input_len=300, output_len=50, num_requests=1000, max_sequences=slots, max_num_tokens=tokens)
    assert b.max() <= slots and (b + p).max() <= tokens
    assert p.sum() == 1000 * 300 and b.sum() + 1000 == 1000 * 50


def test_graph_batch_is_the_smallest_captured_size_at_least_the_batch() -> None:
    assert graph_batch(1.0) == 1 and graph_batch(3.0) == 4 and graph_batch(300.0) == 384
    assert graph_batch(3000.0) == 4096 and graph_batch(9000.0) == 9000  # beyond the largest graph: eager, unpadded
    assert list(graph_batch(np.array([100.0, 512.0]))) == [128, 512]
    assert CUDA_GRAPH_BATCH_SIZES[-1] == 8192


def test_padded_rows_cost_gemms_not_kv_reads() -> None:
    s = resolve("llama-3.3-70b", gpu="b200", gpus=8, tp=8, weights_dtype="fp4", kv_dtype="fp8", context=2000)
    real = decode_step(s.model, s.shape, s.hw, s.layout, batch=3000, context=1500)
    padded = decode_step(s.model, s.shape, s.hw, s.layout, batch=3000, context=1500, rows=4096)
    assert padded.kv_read_s == real.kv_read_s
    assert padded.gemm_s > real.gemm_s and padded.tp_comm_s > real.tp_comm_s


def test_an_offline_run_is_the_steady_state_when_the_batch_turns_over_many_times() -> None:
    """30,000 requests of 128 + 128 tokens through 224 slots: 134 turnovers, ramp and drain a rounding error."""
    s = resolve("llama-3.1-8b", gpu="h100-sxm", gpus=1, context=256)
    req = Requests(input_len=128, output_len=128, concurrency=224)
    steady = load_point(s.model, s.shape, s.hw, s.layout, req).output_tokens_per_s
    run = offline_run(
        s.model, s.shape, s.hw, s.layout, input_len=128, output_len=128, num_requests=30000, max_sequences=224
    )
    assert run.output_tokens_per_s == pytest.approx(steady, rel=0.03)


def test_one_wave_decodes_alone_after_its_ramp() -> None:
    """3,000 requests that all fit: after the prompts, the steps decode alone (the ones a CUDA graph replays)."""
    s = resolve("llama-3.3-70b", gpu="b200", gpus=8, tp=8, weights_dtype="fp4", kv_dtype="fp8", context=2000)
    kw = {"input_len": 1000, "output_len": 1000, "num_requests": 3000, "max_sequences": 3000}
    run = offline_run(s.model, s.shape, s.hw, s.layout, **kw)  # type: ignore[arg-type]
    b, p = offline_schedule(input_len=1000, output_len=1000, num_requests=3000, max_sequences=3000, max_num_tokens=8192)
    last_prompt = int(np.nonzero(p)[0][-1])
    assert run.steps == b.size == last_prompt + 1000  # the last prompt's 999 decode steps end the run
    assert run.decode_only_share == pytest.approx(1 - (last_prompt + 1) / b.size)
    padded = resolve(
        "llama-3.3-70b",
        gpu="b200",
        gpus=8,
        tp=8,
        weights_dtype="fp4",
        kv_dtype="fp8",
        context=2000,
        cuda_graph_padding=True,
    )
    slower = offline_run(padded.model, padded.shape, padded.hw, padded.layout, **kw)  # type: ignore[arg-type]
    assert slower.run_s > run.run_s and slower.steps == run.steps


def test_serve_reports_the_offline_run() -> None:
    kw = {"gpu": "h100-sxm", "gpus": 2, "input_len": 1000, "output_len": 500, "kv_dtype": "fp8", "weights_dtype": "fp8"}
    out = serve_report("llama-3.1-8b", num_requests=600, **kw)  # type: ignore[arg-type]
    assert out["concurrency_total"] == 600 and out["offline"]["num_requests"] == 600
    assert out["offline"]["tokens_per_s_total"] == pytest.approx(2 * out["offline"]["tokens_per_s_per_gpu"])
    assert out["offline"]["tokens_per_s_total"] <= out["tokens_per_s_total"] * 1.01  # a run pays its ramp and drain
    assert main(["serve", "llama-3.1-8b", "--gpu", "h100-sxm", "--input-len", "100", "--output-len", "10"]) == 2


def test_a_run_too_long_to_simulate_is_refused() -> None:
    """10^5 requests of 1,000 tokens one at a time would be 10^8 forwards: refused, not simulated for minutes."""
    with pytest.raises(ValueError, match="forwards"):
        offline_schedule(input_len=1, output_len=1000, num_requests=100_000, max_sequences=1, max_num_tokens=8192)
    b, _ = offline_schedule(input_len=1, output_len=1000, num_requests=100, max_sequences=1, max_num_tokens=8192)
    assert b.size > 100 * 999  # just under the bound, it is simulated whole
