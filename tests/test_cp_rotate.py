"""PyTorch's ring attention as torchtitan runs it (--cp-rotate allgather): one all-gather of every K/V block per
call, hidden behind the first block's attention alone; the fp32 dK/dV ring's last hop waited for; full recompute
exchanging K/V again. Llama 3.1 8B (32 layers, K and V repeated to 32 heads of 128), 64K tokens over CP 4."""

from __future__ import annotations

import pytest

from meshplan import io
from meshplan.core.comm.call import CollectiveCall
from meshplan.core.comm.cost import Collective
from meshplan.core.plan import evaluate
from meshplan.core.time.stage_time import StageTimes
from meshplan.core.time.step_time import _exposed_per_micro_batch
from meshplan.reports.conditions import conditions_of
from meshplan.reports.inputs import resolve_cluster
from meshplan.spec.conditions import Conditions, CpRotate
from meshplan.spec.layout import Layout, Recompute, ZeroStage
from meshplan.spec.workload import Framework, Workload

LLAMA_8B = io.load_model("llama-3.1-8b")
SEQ, CP, LAYERS = 65536, 4, 32
BLOCK = SEQ // CP * 2 * 4096 * 2  # s/cp tokens of K and V, 4,096 wide each when repeated, bf16


def _cp_calls(rotate: CpRotate, recompute: Recompute) -> list[CollectiveCall]:
    work = Workload(
        seq_len=SEQ,
        global_batch=2,
        framework=Framework.TORCH,
        conditions=Conditions(repeat_kv=True, cp_rotate=rotate),
    )
    layout = Layout(cp=CP, dp_shard=2, zero=ZeroStage.PARAMETERS, recompute=recompute)
    plan = evaluate(LLAMA_8B, resolve_cluster(gpu="h100-sxm", gpus=8), layout, work)
    return [c for c in plan.collectives if c.strategy == "cp" and float(c.count_per_step) > 0]


def _bytes(calls: list[CollectiveCall], op: Collective, phase: str, overlappable: bool = True) -> float:
    return sum(
        float(c.size_bytes * c.count_per_step)
        for c in calls
        if c.op is op and c.phase == phase and bool(c.overlappable) == overlappable
    )


@pytest.mark.parametrize("recompute", [Recompute.NONE, Recompute.FULL])
def test_allgather_rotate_gathers_once_per_call(recompute: Recompute) -> None:
    """Forward: one all-gather of the 4 blocks per layer (again in the recomputed forward), no block sends;
    backward: the K/V gathered again, the fp32 dK/dV (twice a block's bytes) sent 4 times, the last waited for."""
    calls = _cp_calls(CpRotate.ALLGATHER, recompute)
    forwards = 2 if recompute is Recompute.FULL else 1
    assert _bytes(calls, Collective.ALL_GATHER, "forward") == forwards * LAYERS * CP * BLOCK
    assert _bytes(calls, Collective.SEND_RECV, "forward") == 0
    assert _bytes(calls, Collective.ALL_GATHER, "backward") == LAYERS * CP * BLOCK
    assert _bytes(calls, Collective.SEND_RECV, "backward") == LAYERS * (CP - 1) * 2 * BLOCK
    assert _bytes(calls, Collective.SEND_RECV, "backward", overlappable=False) == LAYERS * 2 * BLOCK


def test_alltoall_rotate_sends_block_by_block() -> None:
    """The same bytes of K/V, as cp - 1 block sends per layer each way (the forward's twice under full recompute)."""
    calls = _cp_calls(CpRotate.ALLTOALL, Recompute.FULL)
    assert _bytes(calls, Collective.ALL_GATHER, "forward") == 0
    assert _bytes(calls, Collective.SEND_RECV, "forward") == 2 * LAYERS * (CP - 1) * BLOCK
    assert _bytes(calls, Collective.SEND_RECV, "backward") == LAYERS * (CP - 1) * (BLOCK + 2 * BLOCK)


def _call(op: Collective, time_s: float) -> CollectiveCall:
    return CollectiveCall(
        strategy="cp",
        op=op,
        axis="cp",
        phase="forward",
        group_size=CP,
        size_bytes=1.0,
        count_per_step=1.0,
        call_s=time_s,
        outer=1,
    )


def test_gathered_kv_hides_behind_the_first_block_alone() -> None:
    """20 ms of K/V beside 40 ms of attention over 4 blocks: sent block by block it hides behind all 40 ms, all
    but the (1 - overlap efficiency) share; gathered at once behind the first 10 ms, 10 ms shows whole."""
    times = StageTimes(
        fwd_compute_s=0.1,
        bwd_compute_s=0.2,
        weight_grad_s=0.05,
        attention_fwd_s=0.04,
        attention_bwd_s=0.1,
        dense_layers=1,
        moe_layers=0,
    )
    cluster = resolve_cluster(gpu="h100-sxm", gpus=8)
    eff = cluster.gpu.calibration.overlap_efficiency
    work = Workload(seq_len=SEQ, global_batch=2, framework=Framework.TORCH)
    lay = Layout(cp=CP, dp_shard=2, zero=ZeroStage.PARAMETERS)

    def exposed(op: Collective) -> float:
        got = _exposed_per_micro_batch([_call(op, 0.02)], times, copies=1, m=1, cluster=cluster, work=work, lay=lay)
        return float(got["cp_f"])

    assert exposed(Collective.SEND_RECV) == pytest.approx((1 - eff) * 0.02)
    assert exposed(Collective.ALL_GATHER) == pytest.approx(0.01 + (1 - eff) * 0.01)


def test_the_flag_and_the_torchtitan_stack() -> None:
    assert conditions_of({"cp_rotate": "allgather"}).cp_rotate is CpRotate.ALLGATHER
    assert conditions_of({}).cp_rotate is CpRotate.ALLTOALL
    assert io.load_stack("torchtitan").defaults["cp_rotate"] == "allgather"
