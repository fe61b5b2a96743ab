"""``serve --engine vllm-0.2``: vLLM as it ran in late 2023, its host work between two forwards priced.

Re-derived here from the stated parts (catalog/serving/engines.toml): 2 ms a step and 70 us for each sequence the
step samples (timed on vLLM 0.2.2's own code), and for each sequence and each of the tp x pp Ray workers the driver
sends the step to, what vLLM's pull request 2221 measured its Ray control plane to cost: 2.48 -> 3.48 requests/s
for 512 requests of 1,031 + 317 tokens on 8 A100s, (1/2.48 - 1/3.48) s over 317 sampled steps x 8 workers. The
kernels launch op by op (30 us each, 10 a dense layer and TP's 2 all-reduces), the host's work between forwards
outside that floor.
"""

from __future__ import annotations

import pytest

from meshplan import io
from meshplan.cli import main
from meshplan.reports.serve import serve_report
from meshplan.reports.serve_setup import calibration

STEP_S, SEQUENCE_S = 2.0e-3, 70e-6
WORKER_SEQUENCE_S = (1 / 2.48 - 1 / 3.48) / (317 * 8)
HOST_S_PER_KERNEL, DENSE_LAYER_KERNELS = 30e-6, 10


def _decode(batch: int, *, engine: str = "vllm-0.2", **kw: object) -> dict:
    return serve_report(
        "llama-2-70b", gpu="h100-sxm", gpus=2, tp=2, engine=engine, input_len=512, output_len=128, batch=batch, **kw
    )


def test_the_engine_runs_op_by_op_with_its_stated_constants() -> None:
    cal = calibration("vllm-0.2", "h100-sxm")
    assert cal.launch.value == "eager" and cal.allreduce.value == "nccl"
    assert (cal.step_overhead_s, cal.sequence_host_s) == (STEP_S, SEQUENCE_S)
    assert cal.worker_sequence_host_s == pytest.approx(WORKER_SEQUENCE_S, rel=2e-3)  # 45.7 us
    assert (cal.max_batch, cal.max_num_tokens) == (256, 8192)
    for engine in ("trtllm", "vllm", "sglang", "gpt-fast"):  # today's engines: that work beside the GPU or in C++
        other = calibration(engine, "h100-sxm")
        assert other.sequence_host_s == 0.0 and other.worker_sequence_host_s == 0.0


def test_each_sequence_adds_its_host_work_to_the_step() -> None:
    """Llama-2-70B at TP 2 on H100 in fp16 (Splitwise's machine): the step's host work between forwards is
    2 ms + B (70 + 2 x 45.7) us, and a step of 32 sequences is slower than one of 1 by at least that difference (the
    KV cache and GEMM rows add the rest)."""
    one, many = _decode(1), _decode(32)
    per_sequence = SEQUENCE_S + 2 * calibration("vllm-0.2", "h100-sxm").worker_sequence_host_s
    layers = io.load_model("llama-2-70b").num_layers
    for batch, r in ((1, one), (32, many)):
        layer_floor = layers * calibration("vllm-0.2", "h100-sxm").layer_overhead_s
        assert r["step_s"]["overhead_s"] == pytest.approx(STEP_S + batch * per_sequence + layer_floor, rel=1e-9)
    assert many["tpot_s"] - one["tpot_s"] > 31 * per_sequence
    # today's vLLM op by op has none of it: the same batch is faster by at least the per-sequence work
    today = _decode(32, engine="vllm", launch="eager")
    assert many["tpot_s"] - today["tpot_s"] > 32 * per_sequence


def test_the_host_work_between_forwards_stays_outside_the_launch_floor() -> None:
    """BLOOM-176B at TP 8 at batch 1, host-bound op by op: the step is the floor (70 layers x 12 kernels x 30 us)
    plus the work between forwards, 2 ms + (70 + 8 x 45.7) us, not the larger of the two."""
    r = serve_report(
        "bloom-176b", gpu="h100-sxm", gpus=8, tp=8, engine="vllm-0.2", input_len=128, output_len=128, batch=1
    )
    floor = io.load_model("bloom-176b").num_layers * (DENSE_LAYER_KERNELS + 2) * HOST_S_PER_KERNEL
    between = STEP_S + SEQUENCE_S + 8 * calibration("vllm-0.2", "h100-sxm").worker_sequence_host_s
    assert r["step_s"]["host_wait_s"] > 0
    assert r["tpot_s"] == pytest.approx(floor + between, rel=1e-9)


def test_splitwise_is_typed_as_this_engine_and_its_decode_gains() -> None:
    """Splitwise's rows state vLLM (its paper), of late 2023, and are typed as this engine: their decode step times
    (nothing set on them) are within 26% each and 16% on average, where under today's vLLM launched op by op they
    reached 48% (BLOOM-176B at batch 64) and 22.6%."""
    from meshplan.validation.serving import validate_serving

    rows = [r for r in validate_serving()["runs"] if r["case"].startswith("sw_") and r["metric_class"] == "decode"]
    assert len(rows) == 14 and sum(r["error"] < 0 for r in rows) == 13  # all but BLOOM at batch 64 still too fast
    assert max(abs(r["error"]) for r in rows) < 0.26
    assert sum(abs(r["error"]) for r in rows) / len(rows) < 0.16


def test_graph_padding_is_refused_where_the_engine_runs_op_by_op(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["serve", "llama-2-70b", "--gpu", "h100-sxm", "--gpus", "2", "--input-len", "512", "--output-len", "128"]
    assert main([*argv, "--engine", "vllm-0.2", "--batch", "4", "--cuda-graph-padding"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--cuda-graph-padding" in err and "--launch cudagraph" in err
    assert main([*argv, "--engine", "vllm-0.2", "--batch", "4", "--launch", "cudagraph", "--cuda-graph-padding"]) == 0


def test_serve_plan_times_the_engine_as_it_launches() -> None:
    """serve-plan --engine vllm-0.2 with no --launch times every layout op by op, as serve does, and says so."""
    from meshplan.reports.serve_plan import serve_plan_report

    kw = dict(gpu="h100-sxm", gpus=2, input_len=512, output_len=128, engine="vllm-0.2", top=1)
    left_out = serve_plan_report("llama-3.1-8b", **kw)
    stated = serve_plan_report("llama-3.1-8b", launch="eager", **kw)
    graphs = serve_plan_report("llama-3.1-8b", launch="cudagraph", **kw)
    assert (left_out["launch"], graphs["launch"]) == ("eager", "cudagraph")
    assert left_out["best"]["tpot_s"] == pytest.approx(stated["best"]["tpot_s"], rel=1e-12)
    assert "vllm-0.2-eager" in left_out["uncertainty"]


def test_the_engine_flag_names_every_catalog_engine_and_each_states_its_prefill_forward() -> None:
    """--engine's choices are the engine families of catalog/serving/engines.toml, no more and no fewer; an engine
    that runs new prompts in a forward of their own says where its code does so."""
    import tomllib
    from importlib import resources

    from meshplan.spec.requests import field

    text = resources.files("meshplan").joinpath("catalog/serving/engines.toml").read_text()
    catalog = set(tomllib.loads(text)["engine"])
    assert set(field("engine").choices) == catalog
    separate = {e for e in catalog if calibration(e, "h100-sxm").separate_prefill}
    assert separate == {"sglang", "vllm-0.2"}
    assert all(calibration(e, "h100-sxm").separate_prefill_source for e in separate)
