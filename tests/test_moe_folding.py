"""MoE parallel folding (--expert-tp): expert TP apart from TP, EP folded over TP x DP (Liu et al. 2025,
arXiv:2504.14960; Megatron --expert-tensor-parallel-size). Each number is derived by hand below."""

from __future__ import annotations

import dataclasses

import pytest

from meshplan import io
from meshplan.cli import main
from meshplan.core.memory import activations as act
from meshplan.core.memory.bill import shard_degrees
from meshplan.core.memory.stage_params import stage_params
from meshplan.core.params import count_params
from meshplan.core.placement import place
from meshplan.core.plan import evaluate, mesh_sizes
from meshplan.reports.inputs import resolve_cluster
from meshplan.spec.layout import Layout, Recompute, ZeroStage
from meshplan.spec.workload import Workload

QWEN3 = io.load_model("qwen3-235b-a22b")  # 94 MoE layers, 128 experts of 3 x 4096 x 1536, top-8, hidden 4096
EXPERTS_PER_LAYER = 128 * 3 * 4096 * 1536


def _layout(**kw: object) -> Layout:
    base = dict(tp=4, pp=8, ep=8, dp_shard=8, zero=ZeroStage.OPTIMIZER, sp=True, recompute=Recompute.SELECTIVE)
    return Layout(**(base | kw))  # type: ignore[arg-type]


def test_layout_rules() -> None:
    """ep x expert_tp must divide tp x cp x dp; without expert_tp, EP comes out of the data ranks as before;
    folding needs SP."""
    Layout(tp=8, ep=64, expert_tp=1, dp_shard=8, zero=ZeroStage.OPTIMIZER, sp=True)  # EP 64 = TP 8 x DP 8
    with pytest.raises(ValueError, match="ep=64 must divide dp_replicate"):
        Layout(tp=8, ep=64, dp_shard=8, zero=ZeroStage.OPTIMIZER, sp=True)
    with pytest.raises(ValueError, match=r"ep\*expert_tp = 16\*2 must divide tp\*cp\*dp = 8\*1\*2"):
        Layout(tp=8, ep=16, expert_tp=2, dp_shard=2, zero=ZeroStage.OPTIMIZER, sp=True)
    with pytest.raises(ValueError, match="needs sp"):
        Layout(tp=8, ep=8, expert_tp=1)
    assert Layout(tp=4).etp == 4 and Layout(tp=4, expert_tp=1, sp=True).etp == 1
    with pytest.raises(ValueError, match="expert_tp=2 above tp=1"):  # was a ZeroDivisionError in the DP calls
        Layout(ep=1, expert_tp=2, dp_shard=8, zero=ZeroStage.OPTIMIZER)


def test_expert_tp_above_tp_is_a_clear_cli_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "8", "--expert-tp", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expert_tp=2 above tp=1" in err[0]


def test_expert_parameters_and_their_shard_group() -> None:
    """Stage 1 of 8 holds 12 of the 94 layers (ceil(94/8) = 12; stages 0 and 7 hold 11). Routed experts per GPU:
    12 x 128 x 3 x 4096 x 1536 / (ep x expert_tp): / 32 with expert TP 4, / 8 folded. The experts' data group is
    tp cp dp / (ep etp): 4 x 8 / 32 = 1 unfolded, 4 x 8 / 8 = 4 folded, the group ZeRO-1 shards their state over."""
    params = count_params(QWEN3)
    for etp, divisor, expert_shard in ((4, 32, 1), (1, 8, 4)):
        held = stage_params(params, QWEN3, tp=4, pp=8, ep=8, stage=1, etp=etp)
        assert held.experts == pytest.approx(12 * EXPERTS_PER_LAYER / divisor, rel=1e-12)
        assert shard_degrees(dp_shard=8, cp=1, ep=8, tp=4, etp=etp) == (8, expert_shard)
    assert shard_degrees(dp_shard=8, cp=1, ep=8) == (8, 1)  # the old call: expert TP = TP


def test_routed_activations_per_token() -> None:
    """With SP each rank dispatches s/t tokens and the expert-TP group gathers e_t of them: k e_t / t routed
    copies per local token, each with its h-wide dispatched row and expert output (2 beta h, Megatron) and
    n beta f_e / e_t of expert internals. Folding (e_t = 1 instead of t) keeps the internals per token the same
    and divides the h-wide copies by t: the difference is k 2 beta h (1 - 1/t)."""
    beta, k, h, t = 2.0, 8, 4096, 4
    common = dict(sp=True, act_bytes=beta, moe_layer=True)
    plain = act.mlp_bytes_per_token(QWEN3, tp=t, etp=t, **common)  # type: ignore[arg-type]
    folded = act.mlp_bytes_per_token(QWEN3, tp=t, etp=1, **common)  # type: ignore[arg-type]
    assert plain - folded == pytest.approx(k * 2 * beta * h * (1 - 1 / t), rel=1e-12)
    assert act.mlp_bytes_per_token(QWEN3, tp=t, **common) == plain  # type: ignore[arg-type]


def test_placement_keeps_folded_ep_inside_the_node() -> None:
    """Eight GPUs a node, TP 4 innermost. EP 8 on the data ranks: neighbours 4 ranks apart, 2 per node, 4 nodes.
    Folded (expert TP 1): the expert mesh fills the block innermost first, neighbours 1 apart, all 8 in one node.
    EP 16 folded over TP 8 x DP: 8 per node, 2 nodes."""
    plain = place(mesh_sizes(_layout()), domain=8)
    assert (plain["ep"].stride, plain["ep"].inner, plain["ep"].outer) == (4, 2, 4)
    assert plain["etp"].size == 4 and plain["etp"].outer == 1
    folded = place(mesh_sizes(_layout(expert_tp=1)), domain=8)
    assert (folded["ep"].stride, folded["ep"].inner, folded["ep"].outer) == (1, 8, 1)
    wide = place(mesh_sizes(_layout(tp=8, ep=16, expert_tp=1, dp_shard=4)), domain=8)
    assert (wide["ep"].stride, wide["ep"].inner, wide["ep"].outer) == (1, 8, 2)


def test_folding_keeps_the_all_to_all_on_nvlink() -> None:
    """Qwen3-235B on 256 H100, TP 4 PP 8 EP 8: the dispatch all-to-all carries s/t k h beta = 4096/4 x 8 x 4096
    x 2 = 67.1 MB per call; unfolded it crosses InfiniBand and the expert-TP group all-gathers 4 x that, folded it
    stays on NVLink with no expert-TP traffic: a fifth of the exposed EP time, and the step near twice as fast."""
    cluster = resolve_cluster(gpu="h100-sxm", gpus=256)
    work = Workload(seq_len=4096, global_batch=1024)
    plans = {etp: evaluate(QWEN3, cluster, _layout(expert_tp=etp), work) for etp in (4, 1)}
    for etp, plan in plans.items():
        a2a = [c for c in plan.collectives if c.strategy == "ep" and c.phase == "forward" and c.op.name == "ALL_TO_ALL"]
        assert a2a[0].size_bytes == pytest.approx(4096 / 4 * 8 * 4096 * 2, rel=1e-12)
        assert bool(a2a[0].outer > 1) is (etp == 4)
        gathers = [c for c in plan.collectives if c.strategy == "etp"]
        assert [c.size_bytes for c in gathers[:1]] == ([pytest.approx(4 * a2a[0].size_bytes)] if etp == 4 else [])
    assert float(plans[1].step.exposed_ep_s) < 0.2 * float(plans[4].step.exposed_ep_s)
    assert float(plans[1].step.step_time_s) < 0.6 * float(plans[4].step.step_time_s)


def test_search_offers_folded_layouts() -> None:
    """The planner tries EP folded over TP (expert TP 1) beside EP from the data ranks."""
    from meshplan.search.space import SearchSpace, enumerate_layouts

    small = dataclasses.replace(QWEN3, num_layers=8)
    space = SearchSpace()
    batch = enumerate_layouts(small, num_gpus=16, global_batch=32, space=space, domain=8, allow_cross_node_tp=False)
    folded = (batch.etp == 1) & (batch.tp == 8) & (batch.ep == 16) & batch.sp
    assert folded.any()
    assert batch.layout(int(folded.nonzero()[0][0])).expert_tp == 1


def test_pytorch_native_experts_split_by_expert_tp() -> None:
    """PyTorch-native accounting splits a routed expert's matrices over expert TP: with TP 4 and EP 8 a rank
    holds 1/32 of a layer's routed experts at expert TP 4, 1/8 folded (128 x 3 x 4096 x 1536 a layer)."""
    from meshplan.core.pytorch import shards
    from meshplan.core.stages import stage_row

    row = stage_row(QWEN3, pp=94, stage=1)  # one MoE layer
    for etp, divisor in ((None, 32), (4, 32), (1, 8)):
        p = shards.rank_params(QWEN3, shards.RankCoords(tp=4, ep=8, etp=etp), row)
        assert p.expert_numel == pytest.approx(EXPERTS_PER_LAYER / divisor, rel=1e-12)


def test_folded_experts_reduce_their_gradients_over_the_group_that_shards_their_state() -> None:
    """Qwen3-235B on 256 GPUs, TP 4 x PP 8 x EP 8 with ZeRO-1: unfolded, each expert lives on one data rank (8 data
    ranks / EP 8) and its gradients go nowhere; with --expert-tp 1 the 4 TP ranks are data ranks of the experts
    too, tp cp dp / (ep etp) = 4 x 8 / 8 = 4, the group memory shards their optimizer state over."""
    from meshplan.core.memory.bill import shard_degrees
    from meshplan.reports import LayoutRequest
    from meshplan.reports.estimate import estimate_report

    for etp, want in ((None, 1), (1, 4)):
        lay = LayoutRequest(tp=4, sp=True, pp=8, ep=8, zero=1, expert_tp=etp)
        r = estimate_report("qwen3-235b-a22b", gpu="h100-sxm", gpus=256, layout=lay, seq=4096, global_batch=512)
        groups = {c["group_size"] for c in r["collectives"] if c["strategy"] == "dp-experts"}
        assert groups == {want}
        assert shard_degrees(dp_shard=8, cp=1, ep=8, tp=4, etp=4 if etp is None else etp)[1] == want


def test_fp8_dispatch_moves_a_byte_and_a_scale_per_element_and_leaves_the_combine_in_bf16() -> None:
    """DeepSeek-V3 Sec. 3.3.2: the dispatch carries the up-projections' FP8 input, 1 byte an element and an fp32
    scale per 1 x 128 tile; the combine and the backward all-to-alls stay bf16. Folded as above (EP on NVLink)."""
    from meshplan.spec.conditions import Conditions
    from meshplan.spec.workload import PRECISIONS

    cluster = resolve_cluster(gpu="h100-sxm", gpus=256)
    fp8 = PRECISIONS["fp8"]
    plans = {
        on: evaluate(
            QWEN3,
            cluster,
            _layout(expert_tp=1),
            Workload(seq_len=4096, global_batch=1024, precision=fp8, conditions=Conditions(fp8_dispatch=on)),
        )
        for on in (False, True)
    }
    rows = 4096 / 4 * 8  # s/t tokens, k copies each
    for on, plan in plans.items():
        fwd = sorted(
            c.size_bytes
            for c in plan.collectives
            if c.strategy == "ep" and c.phase == "forward" and c.op.name == "ALL_TO_ALL"
        )
        bwd = [c.size_bytes for c in plan.collectives if c.strategy == "ep" and c.phase == "backward"]
        dispatch = rows * 4096 * (1 + 4 / 128) if on else rows * 4096 * 2
        assert fwd == [pytest.approx(dispatch), pytest.approx(rows * 4096 * 2)]
        assert bwd == [pytest.approx(rows * 4096 * 2)]
    assert float(plans[True].step.exposed_ep_s) < float(plans[False].step.exposed_ep_s)
    with pytest.raises(ValueError, match="fp8_dispatch needs FP8 matmuls"):
        Workload(seq_len=4096, global_batch=1024, conditions=Conditions(fp8_dispatch=True))
