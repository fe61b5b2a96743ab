"""Collective cost model: ring volumes, bus bandwidth, hierarchy, and ZeRO's communication volumes."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.core.comm.cost import Collective, all_reduce_time, bus_factor, hierarchical_time, ring_time

BW = 100e9


@pytest.mark.parametrize("n", [2, 4, 8, 64, 1024])
def test_ring_all_reduce_moves_2_n_minus_1_over_n(n: int) -> None:
    size = 1e9
    t = ring_time(Collective.ALL_REDUCE, size_bytes=size, n=n, bandwidth_bytes_per_s=BW, latency_s=0.0)
    assert t == pytest.approx(2 * (n - 1) / n * size / BW)
    # an all-reduce is a reduce-scatter followed by an all-gather
    rs = ring_time(Collective.REDUCE_SCATTER, size_bytes=size, n=n, bandwidth_bytes_per_s=BW, latency_s=0.0)
    ag = ring_time(Collective.ALL_GATHER, size_bytes=size, n=n, bandwidth_bytes_per_s=BW, latency_s=0.0)
    assert t == pytest.approx(rs + ag)


def test_bus_factors_are_those_of_nccl_tests() -> None:
    assert bus_factor(Collective.ALL_REDUCE, 8) == pytest.approx(2 * 7 / 8)
    for op in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_TO_ALL):
        assert bus_factor(op, 8) == pytest.approx(7 / 8)
    assert bus_factor(Collective.SEND_RECV, 8) == 1.0


def test_zero_communication_volumes() -> None:
    """ZeRO Sec. 7.2: DP and ZeRO-2 move 2 Psi per step, ZeRO-3 moves 3 Psi (1.5x)."""
    psi, n = 7.5e9 * 2, 64  # 16-bit elements
    kw = dict(n=n, bandwidth_bytes_per_s=BW, latency_s=0.0)
    dp = ring_time(Collective.ALL_REDUCE, size_bytes=psi, **kw)
    zero2 = ring_time(Collective.REDUCE_SCATTER, size_bytes=psi, **kw) + ring_time(
        Collective.ALL_GATHER, size_bytes=psi, **kw
    )
    zero3 = 2 * ring_time(Collective.ALL_GATHER, size_bytes=psi, **kw) + ring_time(
        Collective.REDUCE_SCATTER, size_bytes=psi, **kw
    )
    assert zero2 == pytest.approx(dp)
    assert zero3 == pytest.approx(1.5 * dp)


def test_one_rank_costs_nothing() -> None:
    assert ring_time(Collective.ALL_REDUCE, size_bytes=1e9, n=1, bandwidth_bytes_per_s=BW, latency_s=1e-5) == 0


def test_tree_wins_for_small_messages_on_many_ranks() -> None:
    ring = ring_time(Collective.ALL_REDUCE, size_bytes=1e3, n=1024, bandwidth_bytes_per_s=BW, latency_s=1e-5)
    assert all_reduce_time(size_bytes=1e3, n=1024, bandwidth_bytes_per_s=BW, latency_s=1e-5) < ring


@given(op=st.sampled_from(list(Collective)), n=st.sampled_from([2, 8, 16]))
def test_hierarchy_with_one_domain_is_the_flat_ring(op: Collective, n: int) -> None:
    size = 64e6
    flat_up = ring_time(op, size_bytes=size, n=n, bandwidth_bytes_per_s=400e9, latency_s=3e-6)
    flat_out = ring_time(op, size_bytes=size, n=n, bandwidth_bytes_per_s=50e9, latency_s=1e-5)
    kw = dict(
        size_bytes=size, inner_bytes_per_s=400e9, outer_bytes_per_s=50e9, inner_latency_s=3e-6, outer_latency_s=1e-5
    )
    inside = hierarchical_time(op, inner=n, outer=1, **kw)
    across = hierarchical_time(op, inner=1, outer=n, **kw)
    if op is not Collective.ALL_REDUCE:  # a flat all-reduce may pick the tree; check the others exactly
        assert inside == pytest.approx(flat_up)
        assert across == pytest.approx(flat_out)
    assert inside <= across


@given(size=st.floats(1e3, 1e10), bw=st.floats(1e9, 1e12), n=st.sampled_from([2, 8, 64]))
def test_more_bandwidth_never_slows_a_collective(size: float, bw: float, n: int) -> None:
    for op in Collective:
        slow = ring_time(op, size_bytes=size, n=n, bandwidth_bytes_per_s=bw, latency_s=5e-6)
        fast = ring_time(op, size_bytes=size, n=n, bandwidth_bytes_per_s=2 * bw, latency_s=5e-6)
        assert fast <= slow


@pytest.mark.parametrize("stack", ["torchtitan", "megatron-core", "llm-foundry"])
def test_an_axis_of_one_sends_nothing(stack: str) -> None:
    """A layout without CP, TP, EP or PP pays none of their traffic, whatever the stack's patterns (the fp32
    dK/dV round of PyTorch's ring attention once cost 0.38 s per step on an 8-GPU FSDP run without CP)."""
    from meshplan.reports import LayoutRequest
    from meshplan.reports.estimate import estimate_report

    report = estimate_report(
        "llama-3.1-8b",
        gpu="h100-sxm",
        gpus=8,
        layout=LayoutRequest(dp_shard=8, zero=3),
        seq=65536,
        global_batch=8,
        conditions={"stack": stack},
    )
    idle = [c for c in report["collectives"] if c["group_size"] == 1]
    assert idle and all(c["time_s_per_step"] == 0 and c["exposed_s_per_step"] == 0 for c in idle), idle
    assert report["breakdown"]["exposed_cp_s"] == 0 and report["breakdown"]["exposed_tp_s"] == 0
