"""``serve --launch eager``: a forward waits for the host to issue its layers' kernels (core/time/host.py).

The floor is re-derived here from its stated parts: 10 kernels per dense serving layer (vLLM's decoder layer),
2 all-reduces under TP, 30 us of host per kernel launched op by op (gpt-fast's eager Llama-2-7B), and the
forward takes max(GPU time, host time) plus the scheduler's step overhead.
"""

from __future__ import annotations

import pytest

from meshplan import io
from meshplan.cli import main
from meshplan.configs import read_config
from meshplan.reports.serve import serve_report
from meshplan.reports.serve_setup import calibration

HOST_S_PER_KERNEL = 30e-6  # gpt-fast's eager Llama-2-7B on A100: 1.2 ms per layer of about 40 kernels
DENSE_LAYER_KERNELS = 10  # 2 fused add-RMSNorms, QKV, rotary, KV write, attention, output, gate-up, SiLU-mul, down


def _static(model: str, gpu: str, gpus: int, *, launch: str | None, engine: str = "vllm", **kw: object) -> dict:
    return serve_report(
        model, gpu=gpu, gpus=gpus, engine=engine, input_len=128, output_len=128, batch=1, launch=launch, **kw
    )


def test_a_small_model_at_batch_one_runs_at_the_hosts_pace() -> None:
    """Llama 3.1 8B on one H100 at batch 1: 16 GB read per token is ~6 ms of HBM, under the 32 x 300 us = 9.6 ms
    the host takes to issue 32 layers of 10 kernels each: TPOT is the host's time plus the step overhead."""
    graphs = _static("llama-3.1-8b", "h100-sxm", 1, launch=None)
    eager = _static("llama-3.1-8b", "h100-sxm", 1, launch="eager")
    layers = io.load_model("llama-3.1-8b").num_layers
    step_overhead = calibration("vllm", "h100-sxm").step_overhead_s
    host = layers * DENSE_LAYER_KERNELS * HOST_S_PER_KERNEL
    assert graphs["tpot_s"] - step_overhead < host  # the GPU alone is faster than the host: host-bound
    assert eager["tpot_s"] == pytest.approx(step_overhead + host, rel=1e-9)
    assert eager["launch"] == "eager" and graphs["launch"] == "cudagraph"
    # the wait is its own term of the step: what the host adds to the GPU's work, zero under graphs
    wait = eager["step_s"]["host_wait_s"]
    assert wait == pytest.approx(host - (sum(graphs["step_s"].values()) - step_overhead), rel=1e-9) and wait > 0
    assert graphs["step_s"]["host_wait_s"] == 0.0


def test_tensor_parallelism_adds_its_all_reduces_to_what_the_host_issues() -> None:
    eager = _static("llama-3.1-8b", "h100-sxm", 2, launch="eager", tp=2)
    layers = io.load_model("llama-3.1-8b").num_layers
    step_overhead = calibration("vllm", "h100-sxm").step_overhead_s
    assert eager["tpot_s"] == pytest.approx(step_overhead + layers * (DENSE_LAYER_KERNELS + 2) * HOST_S_PER_KERNEL)


def test_gpu_bound_work_is_not_slowed_and_eager_is_never_faster() -> None:
    """A 4,096-token prefill of the 8B takes the GPU far longer than the host's 9.6 ms: the same TTFT either way;
    and no step is faster eager than replayed."""
    kw = dict(gpu="h100-sxm", gpus=1, engine="vllm", input_len=4096, output_len=64)
    graphs = serve_report("llama-3.1-8b", batch=8, **kw)
    eager = serve_report("llama-3.1-8b", batch=8, launch="eager", **kw)
    assert eager["static_batch"]["ttft_s"] == pytest.approx(graphs["static_batch"]["ttft_s"], rel=1e-12)
    for model, gpu, gpus in (("llama-3.1-70b", "h100-sxm", 4), ("mixtral-8x7b", "a100-80gb", 2)):
        g = _static(model, gpu, gpus, launch=None)
        e = _static(model, gpu, gpus, launch="eager")
        c = _static(model, gpu, gpus, launch="compile")
        assert g["tpot_s"] <= c["tpot_s"] <= e["tpot_s"]


def test_a_moe_layer_issues_its_routing_and_shared_expert_kernels_too() -> None:
    """DeepSeek-V3 on 8 H200 at batch 1, launched op by op: 3 dense layers of 12 kernels and 58 MoE layers of
    12 + 4 routing + 3 shared-expert kernels, 30 us each (35 ms a token, 28.5 tokens/s: inside the 13-30 tokens/s
    published for early-2025 engines before their FP8 MoE ran under CUDA graphs)."""
    eager = _static("deepseek-v3", "h200", 8, launch="eager", engine="sglang", weights_dtype="fp8")
    step_overhead = calibration("sglang", "h200").step_overhead_s
    host = (3 * 12 + 58 * (12 + 4 + 3)) * HOST_S_PER_KERNEL
    assert eager["tpot_s"] == pytest.approx(step_overhead + host, rel=1e-9)
    assert 13 <= 1 / eager["tpot_s"] <= 30


def test_the_engines_eager_switches_are_read_from_their_launch_commands(tmp_path: object) -> None:
    from pathlib import Path

    d = Path(str(tmp_path))
    (d / "vllm.sh").write_text("vllm serve meta-llama/Llama-3.1-70B --tensor-parallel-size 4 --enforce-eager\n")
    (d / "sglang.sh").write_text(
        "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B --tp 4 --disable-cuda-graph\n"
    )
    for name in ("vllm.sh", "sglang.sh"):
        read = read_config(d / name)
        assert read.values["launch"] == "eager", name


def test_the_table_says_when_the_host_sets_the_pace(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["serve", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "1", "--input-len", "128", "--output-len", "128"]
    assert main([*argv, "--batch", "1", "--engine", "vllm", "--launch", "eager"]) == 0
    out = capsys.readouterr().out
    assert "(vllm, kernels launched eagerly)" in out and "host wait (host-bound)" in out
    assert main([*argv, "--batch", "1", "--engine", "vllm"]) == 0
    assert "host wait" not in capsys.readouterr().out


def test_padding_graphs_that_are_not_launched_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["serve", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "1", "--input-len", "128", "--output-len", "128"]
    assert main([*argv, "--concurrency", "4", "--launch", "eager", "--cuda-graph-padding"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--cuda-graph-padding" in err


def test_serve_plan_times_every_layout_as_launched_and_its_exports_say_so(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    """serve-plan --launch eager: each layout timed under the host floor (its best plan no faster than the one with
    graphs, its band the eager family's); the saved plan exports vLLM's and SGLang's eager switches, which their
    readers take back as --launch eager; TensorRT-LLM's export refuses it; a file saved before plans carried a launch
    mode reads as CUDA graphs."""
    import json
    import shlex
    from pathlib import Path

    d = Path(str(tmp_path))
    argv = ["serve-plan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "2", "--input-len", "512", "--output-len"]
    argv += ["128", "--engine", "vllm", "--top", "1"]
    assert main([*argv, "--launch", "eager", "--save", str(d / "eager.json")]) == 0
    assert main([*argv, "--save", str(d / "graphs.json")]) == 0
    capsys.readouterr()
    eager, graphs = (json.loads((d / f"{n}.json").read_text()) for n in ("eager", "graphs"))
    assert (eager["launch"], graphs["launch"]) == ("eager", "cudagraph")
    assert eager["best"]["tpot_s"] >= graphs["best"]["tpot_s"]
    # no published row ran today's vLLM op by op (Splitwise's is vLLM 0.2's): the eager family's band is widened
    assert "no published decode row of vllm-eager" in eager["uncertainty"] and "vllm-eager" not in graphs["uncertainty"]
    for engine, switch in (("vllm", "--enforce-eager"), ("sglang", "--disable-cuda-graph")):
        assert main(["export", engine, "--from-plan", str(d / "eager.json"), "--json"]) == 0
        command = json.loads(capsys.readouterr().out)["command"]
        assert switch in shlex.split(command)
        (d / f"{engine}.sh").write_text(command + "\n")
        assert read_config(d / f"{engine}.sh").values["launch"] == "eager"
        assert main(["export", engine, "--from-plan", str(d / "graphs.json"), "--json"]) == 0
        assert switch not in json.loads(capsys.readouterr().out)["command"]
    assert main(["export", "trtllm", "--from-plan", str(d / "eager.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--launch eager" in err
    old = graphs.copy()
    del old["launch"]
    (d / "old.json").write_text(json.dumps(old))
    assert main(["export", "vllm", "--from-plan", str(d / "old.json")]) == 0
