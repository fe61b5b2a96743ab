"""ZeRO-1/2's gradient reduction as each stack issues it (``--zero-grad-reduce``): one reduce-scatter (Megatron's
distributed optimizer), all-reduced buckets (DeepSpeed's default), or one reduce per destination rank (DeepSpeed's
stage_1_and_2.py before use_multi_rank_bucket_allreduce), whose D calls of D - 1 hops each grow as D^2."""

from __future__ import annotations

import contextlib
import io as stdio
import json

import pytest

from meshplan import io
from meshplan.cli import main
from meshplan.core.params import count_params

RUN = "llama-3.1-8b --gpu a100-80gb --micro-batch 2 --seq 2048"


def _estimate(gpus: int, extra: str) -> dict:
    args = f"{RUN} --gpus {gpus} --dp-shard {gpus} --global-batch {2 * gpus} {extra} --json"
    buf = stdio.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["estimate", *args.split()]) == 0
    return json.loads(buf.getvalue())


def _gradient_calls(out: dict) -> list[dict]:
    return [c for c in out["collectives"] if c["strategy"] == "dp" and c["phase"] == "backward"]


def test_each_mode_issues_the_stacks_calls() -> None:
    gpus = 64
    grads = _estimate(gpus, "--zero 1")
    (rs,) = _gradient_calls(grads)
    assert rs["op"] == "reduce_scatter" and rs["count_per_step"] == 1
    size = rs["size_bytes_per_call"]
    (ar,) = _gradient_calls(_estimate(gpus, "--zero 1 --zero-grad-reduce all-reduce"))
    assert ar["op"] == "all_reduce" and ar["size_bytes_per_call"] == size and ar["count_per_step"] == 1
    assert ar["time_s_per_step"] > 1.8 * rs["time_s_per_step"]  # twice the bus bytes: 2 (n - 1) / n against (n - 1) / n
    (per_rank,) = _gradient_calls(_estimate(gpus, "--zero 1 --zero-grad-reduce reduce"))
    assert per_rank["count_per_step"] == gpus and per_rank["size_bytes_per_call"] == pytest.approx(size / gpus)


def test_a_reduce_per_rank_is_latency_bound_at_scale() -> None:
    """From 8 to 1,024 A100s at a fixed batch per GPU, ZeRO-1 with one reduce-scatter loses under a tenth of its
    per-GPU throughput; with a reduce per rank it loses about half: 1,024 calls a step, each over a ring of 1,023
    hops."""
    flat = [_estimate(g, "--zero 1") for g in (8, 256, 1024)]
    per_rank = [_estimate(g, "--zero 1 --zero-grad-reduce reduce") for g in (8, 256, 1024)]
    assert flat[2]["tokens_per_s_per_gpu"] / flat[0]["tokens_per_s_per_gpu"] > 0.9
    assert per_rank[2]["tokens_per_s_per_gpu"] / per_rank[0]["tokens_per_s_per_gpu"] < 0.6
    # the bytes on the wire are the same either way; what grows is D calls' hops: the reduce-scatter's step
    # time stays flat from 256 to 1,024 GPUs where the per-rank reduces' more than doubles
    rs256, rs1024 = (_gradient_calls(o)[0]["time_s_per_step"] for o in flat[1:])
    t256, t1024 = (_gradient_calls(o)[0]["time_s_per_step"] for o in per_rank[1:])
    assert rs1024 / rs256 < 1.2 and t1024 / t256 > 2.5
    assert t1024 > 5 * rs1024


def test_deepspeed_zero2_gathers_once_after_the_step() -> None:
    """DeepSpeed's ZeRO-2 keeps the parameters whole through forward and backward and gathers them after the step;
    FSDP's SHARD_GRAD_OP (the native ZeRO-2, kept under a reduce-scatter) gathers each unit in every forward."""
    assert io.load_stack("deepspeed").defaults["zero_grad_reduce"] == "all-reduce"
    ds = _estimate(64, "--zero 2 --stack deepspeed")
    gathers = [c for c in ds["collectives"] if c["strategy"] == "dp" and c["op"] == "all_gather"]
    assert [c["phase"] for c in gathers] == ["step"] and gathers[0]["count_per_step"] == 1
    fsdp = _estimate(64, "--zero 2 --stack deepspeed --zero-grad-reduce reduce-scatter")
    assert {c["phase"] for c in fsdp["collectives"] if c["strategy"] == "dp" and c["op"] == "all_gather"} == {"forward"}


@pytest.mark.parametrize(
    ("zero", "expected"),
    [
        ({"reduce_scatter": False}, "all-reduce"),
        ({"reduce_scatter": True, "use_multi_rank_bucket_allreduce": False}, "reduce"),
        ({"use_multi_rank_bucket_allreduce": True}, "all-reduce"),
    ],
)
def test_a_deepspeed_config_says_how_it_reduces(zero: dict, expected: str) -> None:
    from meshplan.configs.deepspeed import read_deepspeed

    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2, **zero}}
    read = read_deepspeed(json.dumps(config), "ds_config.json")
    assert read.values["zero_grad_reduce"] == expected


def test_deepspeed_zero2_bills_whole_weights_and_sharded_state() -> None:
    """ZeRO paper, Sec. 5.2 (P_os+g): each rank keeps the whole 2-byte weights and 1/D of the gradients and the
    optimizer state. Re-derived from the model's parameter count, against FSDP's SHARD_GRAD_OP, whose weights are
    sharded at rest."""
    gpus = 64
    args = f"memory {RUN} --gpus {gpus} --dp-shard {gpus} --zero 2 --stack deepspeed --global-batch {2 * gpus} --json"
    buf = stdio.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(args.split()) == 0
    bill = json.loads(buf.getvalue())["per_gpu"]
    n = count_params(io.load_model("llama-3.1-8b")).total
    assert bill["weights_bytes"] == pytest.approx(2 * n, rel=1e-3)  # bf16, whole
    assert bill["gradients_bytes"] == pytest.approx(4 * n / gpus, rel=1e-3)  # the stack's fp32 gradients, sharded
    assert bill["comm_buffers_bytes"] == 0
