"""The separate gradient-accumulation pass of Megatron-LM's 2021 fp16 runs (``--grad-accum-fusion off``).

Without Megatron's fused accumulation, autograd adds every micro-batch's weight gradients after the first into
the parameters' ``.grad``: read the old and the new, write the sum, in the parameters' dtype (6 bytes a weight
in fp16), m - 1 times a step. The expected time is derived here from the model's parameter count, not from the
function that prices it.
"""

from __future__ import annotations

import json

import pytest

from meshplan import io
from meshplan.cli import main
from meshplan.core.params import count_params
from meshplan.core.plan import Plan, evaluate
from meshplan.reports.inputs import resolve_cluster
from meshplan.spec.conditions import Conditions
from meshplan.spec.layout import Layout, Recompute
from meshplan.spec.workload import PRECISIONS, Framework, Workload

MODEL = io.load_model("megatron-22b")
CLUSTER = resolve_cluster(gpu="a100-80gb", gpus=8)
LAYOUT = Layout(tp=8, micro_batch=4, recompute=Recompute.FULL)


def _plan(fusion: bool, *, global_batch: int = 32, framework: Framework = Framework.MEGATRON) -> Plan:
    work = Workload(
        seq_len=2048,
        global_batch=global_batch,
        precision=PRECISIONS["fp16"],
        framework=framework,
        conditions=Conditions(grad_accum_fusion=fusion),
    )
    return evaluate(MODEL, CLUSTER, LAYOUT, work)


def test_the_unfused_pass_reads_and_writes_six_bytes_a_weight_per_micro_batch_after_the_first() -> None:
    fused, unfused = _plan(True), _plan(False)
    m = 32 // 4
    weights_per_gpu = count_params(MODEL).total / 8  # TP 8; the replicated norms are 0.01% of it
    gpu = CLUSTER.gpu
    expected = (m - 1) * 3 * 2 * weights_per_gpu / (gpu.hbm_bandwidth_bytes_per_s * gpu.calibration.hbm_efficiency)
    assert expected > 0.05  # 22B at TP 8: 2.8e9 weights a GPU, 7 passes of 16.6 GB
    assert unfused.step.compute_s - fused.step.compute_s == pytest.approx(expected, rel=0.005)
    assert unfused.step.step_time_s - fused.step.step_time_s == pytest.approx(expected, rel=0.005)


def test_one_micro_batch_and_pytorch_native_stacks_pay_nothing() -> None:
    assert _plan(False, global_batch=4).step.step_time_s == _plan(True, global_batch=4).step.step_time_s
    torch_off = _plan(False, framework=Framework.TORCH).step.step_time_s
    assert torch_off == _plan(True, framework=Framework.TORCH).step.step_time_s


def test_the_flag_and_the_2021_stack_set_it(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "megatron-22b", "--gpu", "a100-80gb", "--gpus", "8", "--tp", "8", "--seq", "2048"]
    args += ["--global-batch", "32", "--micro-batch", "4", "--recompute", "full", "--precision", "fp16", "--json"]
    args += ["--loss-fusion", "on"]  # as Conditions() has it (megatron-core's is off)
    out = {}
    for value in ("on", "off"):
        assert main([*args, "--grad-accum-fusion", value]) == 0
        out[value] = json.loads(capsys.readouterr().out)
        assert out[value]["conditions"]["grad_accum_fusion"] == {"value": value, "source": "flag"}
    assert out["off"]["step_time_s"] == pytest.approx(_plan(False).step.step_time_s, rel=1e-9)
    assert out["off"]["step_time_s"] > out["on"]["step_time_s"]
    for stack, value in (("megatron-lm-2021", "off"), ("megatron-core", "on"), ("nemo", "on")):
        assert main([*args, "--stack", stack]) == 0
        conditions = json.loads(capsys.readouterr().out)["conditions"]
        assert conditions["grad_accum_fusion"] == {"value": value, "source": "stack"}
