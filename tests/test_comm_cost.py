"""Collective cost model: ring volumes, bus bandwidth, hierarchy, and ZeRO's communication volumes."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.core.comm.cost import Collective, bus_factor, hierarchical_time, ring_time

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
    kw = dict(inner_bytes_per_s=BW, outer_bytes_per_s=BW, inner_latency_s=1e-5, outer_latency_s=1e-5)
    assert hierarchical_time(Collective.ALL_REDUCE, size_bytes=1e3, inner=1, outer=1024, **kw) < ring / 10


# NCCL src/graph/tuning.cc, re-typed here: base latency and ring hop latency per protocol (us), NVLink and NET
NCCL_BASE_US = {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}
NCCL_HOP_NVLINK_US = {"LL": 0.6, "LL128": 1.9, "Simple": 3.4}
NCCL_HOP_NET_US = {"LL": 2.7, "LL128": 4.0, "Simple": 14.0}
NCCL_BW_SHARE = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}


def _nccl_ring(size: float, *, inner: int, outer: int, bw_in: float, bw_out: float) -> float:
    """An all-gather as NCCL's tuner prices it, re-derived: a ring visits all n ranks, outer - 1 hops cross nodes."""
    n = inner * outer
    wire = (inner - 1) / inner * size / bw_in + (outer - 1) / outer * size / inner / bw_out
    return min(
        1e-6 * (NCCL_BASE_US[p] + (n - outer) * NCCL_HOP_NVLINK_US[p] + (outer - 1) * NCCL_HOP_NET_US[p])
        + wire / NCCL_BW_SHARE[p]
        for p in NCCL_BASE_US
    )


@pytest.mark.parametrize("size", [1e3, 1e5, 1e7, 1e9])
@pytest.mark.parametrize(("inner", "outer"), [(8, 1), (1, 16), (8, 192)])
def test_all_gather_is_priced_as_nccl_tunes_it(size: float, inner: int, outer: int) -> None:
    kw = dict(inner_bytes_per_s=300e9, outer_bytes_per_s=25e9, inner_latency_s=3.4e-6, outer_latency_s=14e-6)
    got = hierarchical_time(Collective.ALL_GATHER, size_bytes=size, inner=inner, outer=outer, **kw)
    assert got == pytest.approx(_nccl_ring(size, inner=inner, outer=outer, bw_in=300e9, bw_out=25e9), rel=1e-9)


def test_small_messages_take_ll_and_large_ones_simple() -> None:
    kw = dict(inner=8, outer=1, inner_bytes_per_s=300e9, outer_bytes_per_s=25e9, inner_latency_s=3.4e-6)
    tiny = hierarchical_time(Collective.ALL_GATHER, size_bytes=8.0, outer_latency_s=14e-6, **kw)
    assert tiny == pytest.approx(1e-6 * (6.6 + 7 * 0.6), rel=1e-3)  # LL's base and hops
    huge = hierarchical_time(Collective.ALL_GATHER, size_bytes=1e10, outer_latency_s=14e-6, **kw)
    assert huge == pytest.approx(7 / 8 * 1e10 / 300e9 + 1e-6 * (8.4 + 7 * 3.4), rel=1e-9)  # Simple


def test_a_ring_over_many_nodes_pays_a_hop_per_rank() -> None:
    """1,536 ranks on 192 nodes: 1,344 NVLink hops and 191 network hops, not 7 + 191 of a two-level ring."""
    kw = dict(inner_bytes_per_s=300e9, outer_bytes_per_s=25e9, inner_latency_s=3.4e-6, outer_latency_s=14e-6)
    small = hierarchical_time(Collective.ALL_GATHER, size_bytes=1e3, inner=8, outer=192, **kw)
    assert small > 1e-6 * (1344 * 0.6 + 191 * 2.7)


@given(op=st.sampled_from(list(Collective)), n=st.sampled_from([2, 8, 16]))
def test_hierarchy_with_one_domain_stays_on_the_fast_link(op: Collective, n: int) -> None:
    size = 64e6
    kw = dict(
        size_bytes=size, inner_bytes_per_s=400e9, outer_bytes_per_s=50e9, inner_latency_s=3e-6, outer_latency_s=1e-5
    )
    inside = hierarchical_time(op, inner=n, outer=1, **kw)
    across = hierarchical_time(op, inner=1, outer=n, **kw)
    if op in (Collective.ALL_TO_ALL, Collective.SEND_RECV, Collective.BROADCAST):
        assert inside == pytest.approx(ring_time(op, size_bytes=size, n=n, bandwidth_bytes_per_s=400e9, latency_s=3e-6))
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


def test_a_small_all_reduce_over_many_nodes_takes_the_tree() -> None:
    """1,024 nodes, one GPU each, 1 kB: LL's tree, 6.8 us + 2 log2(1024) hops of 5.0 us (tuning.cc)."""
    kw = dict(inner_bytes_per_s=300e9, outer_bytes_per_s=25e9, inner_latency_s=3.4e-6, outer_latency_s=14e-6)
    t = hierarchical_time(Collective.ALL_REDUCE, size_bytes=1e3, inner=1, outer=1024, **kw)
    wire = 2 * 1023 / 1024 * 1e3 / 25e9
    assert t == pytest.approx(6.8e-6 + 20 * 5.0e-6 + wire / 0.5, rel=1e-9)
