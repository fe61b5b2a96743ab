"""Collective costs: alpha-beta models for each NCCL collective, flat and hierarchical.

``size_bytes`` is the buffer size nccl-tests reports: the whole buffer for
all-reduce, the gathered output for all-gather, the unreduced input for
reduce-scatter, the per-rank send buffer for all-to-all. Bandwidths are per
GPU per direction, already scaled by the link's efficiency.

Bus bandwidth (nccl-tests doc/PERFORMANCE.md): busbw = algbw * factor, with
factor 2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter and
all-to-all, and 1 for send/recv; a ring reaches busbw = link bandwidth.

All-reduce, all-gather and reduce-scatter are priced as NCCL's tuner prices them (src/graph/tuning.cc): a base
latency per protocol, a hop latency per ring step (a ring visits every rank, so its latency grows with the group,
not with its number of domains), the tree for all-reduce, and the cheapest of the LL, LL128 and Simple protocols:
small messages ride LL's short hops at half the bandwidth, large ones Simple's full bandwidth.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from meshplan.core.num import Num, maximum, minimum, where


class Collective(StrEnum):
    """The communication operations a training step issues."""

    ALL_REDUCE = "all_reduce"
    """Every rank ends with the sum of all ranks' buffers."""
    ALL_GATHER = "all_gather"
    """Every rank ends with the concatenation of all ranks' shards."""
    REDUCE_SCATTER = "reduce_scatter"
    """Every rank ends with its shard of the sum."""
    ALL_TO_ALL = "all_to_all"
    """Every rank sends a distinct slice to every other rank (MoE dispatch and combine)."""
    SEND_RECV = "send_recv"
    """Point-to-point transfer between neighbouring pipeline stages or ring neighbours."""
    BROADCAST = "broadcast"
    """One rank's buffer copied to every rank (DDP's module buffers before each forward)."""


BUS_FACTOR_DOC = {
    Collective.ALL_REDUCE: "2(n-1)/n",
    Collective.ALL_GATHER: "(n-1)/n",
    Collective.REDUCE_SCATTER: "(n-1)/n",
    Collective.ALL_TO_ALL: "(n-1)/n",
    Collective.SEND_RECV: "1",
    Collective.BROADCAST: "1",
}


def peer_share(members: Num, *, domain: int, switched: bool) -> Num:
    """Share of each GPU's scale-up bandwidth a group of ``members`` GPUs inside one domain of ``domain`` reaches:
    all of it under a switch; on a board of direct links (one bundle per peer pair, NCCL's topology edges), the
    links to its own peers, (members - 1) / (domain - 1)."""
    if switched or domain <= 1:
        return 1.0 + 0.0 * members
    return minimum(maximum(members - 1, 1) / (domain - 1), 1.0)


def bus_factor(op: Collective, n: Num) -> Num:
    """nccl-tests bus-bandwidth factor: bytes each rank moves per byte of buffer."""
    if op is Collective.ALL_REDUCE:
        return 2 * (n - 1) / n
    if op in (Collective.SEND_RECV, Collective.BROADCAST):
        return 1.0 + 0 * n
    return (n - 1) / n


def ring_time(op: Collective, *, size_bytes: Num, n: Num, bandwidth_bytes_per_s: Num, latency_s: Num) -> Num:
    """Time of one collective over a ring of ``n`` ranks: steps * alpha + bus bytes / bandwidth.

    A ring all-reduce is a reduce-scatter then an all-gather: 2(n-1) steps;
    all-gather, reduce-scatter and all-to-all take n-1 steps; send/recv one.
    A group of one rank costs nothing.
    """
    steps = {Collective.ALL_REDUCE: 2 * (n - 1), Collective.SEND_RECV: 1 + 0 * n}.get(op, n - 1)
    t = steps * latency_s + bus_factor(op, n) * size_bytes / bandwidth_bytes_per_s
    return where(n > 1, t, 0.0)


class Protocol(StrEnum):
    """NCCL's wire protocols: the tuner prices each (latency + bytes / bandwidth) and runs the cheapest."""

    LL = "ll"
    """Low-latency: 8-byte stores with a flag in each; half the bus bandwidth, the shortest hop."""
    LL128 = "ll128"
    """128-byte lines with a flag per line: 0.92 of the bus bandwidth, a middle hop latency."""
    SIMPLE = "simple"
    """Bulk copies with a fence per chunk: the whole bus bandwidth, the longest hop (the link's ``latency_s``)."""


# NVIDIA/nccl src/graph/tuning.cc (master, 2026): baseLatencies (Ring: LL 6.6, LL128 14, Simple 8.4 us; Tree:
# 6.8, 14, 8.4 us); hwLatencies per hop, Ring NVLink 0.6 / 1.9 / 3.4 us and NET 2.7 / 4.0 / 14 us, Tree NVLink
# 0.6 / 1.25 / 4.0 and NET 5.0 / 8.5 / 14; ring bus bandwidth x 0.5 under LL, x 0.92 under LL128. A link's
# ``latency_s`` is its Simple ring hop; the other protocols' hops are the same shares of it as in those tables.
PROTOCOL_BASE_S = {Protocol.LL: 6.6e-6, Protocol.LL128: 14e-6, Protocol.SIMPLE: 8.4e-6}
PROTOCOL_BANDWIDTH_SHARE = {Protocol.LL: 0.5, Protocol.LL128: 0.92, Protocol.SIMPLE: 1.0}
PROTOCOL_HOP_SHARE_INNER = {Protocol.LL: 0.6 / 3.4, Protocol.LL128: 1.9 / 3.4, Protocol.SIMPLE: 1.0}
PROTOCOL_HOP_SHARE_OUTER = {Protocol.LL: 2.7 / 14, Protocol.LL128: 4.0 / 14, Protocol.SIMPLE: 1.0}
TREE_BASE_S = {Protocol.LL: 6.8e-6, Protocol.LL128: 14e-6, Protocol.SIMPLE: 8.4e-6}
TREE_HOP_SHARE_INNER = {Protocol.LL: 0.6 / 3.4, Protocol.LL128: 1.25 / 3.4, Protocol.SIMPLE: 4.0 / 3.4}
TREE_HOP_SHARE_OUTER = {Protocol.LL: 5.0 / 14, Protocol.LL128: 8.5 / 14, Protocol.SIMPLE: 1.0}
"""The tree's hops, as shares of the link's Simple ring hop (tuning.cc, Tree columns)."""


def ring_hops(op: Collective, *, inner: Num, outer: Num) -> tuple[Num, Num]:
    """Hops (inside the domain, across domains) of one NCCL ring collective over inner x outer ranks.

    A ring visits every rank: n - 1 steps for all-gather and reduce-scatter, 2 (n - 1) for all-reduce, of
    which outer - 1 (twice for all-reduce) cross a domain boundary (tuning.cc: nsteps, nInterSteps).
    """
    twice = 2 if op is Collective.ALL_REDUCE else 1
    across = twice * (outer - 1)
    return twice * (inner * outer - 1) - across, across


def wire_time(
    op: Collective, *, size_bytes: Num, inner: Num, outer: Num, inner_bytes_per_s: Num, outer_bytes_per_s: Num
) -> Num:
    """Seconds on the wire of an all-reduce, all-gather or reduce-scatter over inner x outer ranks.

    The phase inside the domain moves the whole buffer; the phase across domains moves its 1/inner share, each
    GPU on its own NIC (all-reduce: reduce-scatter inside, all-reduce across, all-gather inside). The phases add
    up: an effective price of collectives in training. NCCL's own ring pipelines them, and nccl-tests see the
    slower of the two (NVIDIA/nccl issue #812), but priced so the published training runs come out too fast
    (docs/validation.md, "NCCL's ring, pipelined across nodes").
    """
    inside = 2 if op is Collective.ALL_REDUCE else 1
    across_op = Collective.ALL_REDUCE if op is Collective.ALL_REDUCE else op
    intra = where(inner > 1, inside * bus_factor(Collective.ALL_GATHER, inner) * size_bytes / inner_bytes_per_s, 0.0)
    inter = where(outer > 1, bus_factor(across_op, outer) * size_bytes / inner / outer_bytes_per_s, 0.0)
    return intra + inter


def nccl_time(
    op: Collective,
    *,
    size_bytes: Num,
    inner: Num,
    outer: Num,
    inner_bytes_per_s: Num,
    outer_bytes_per_s: Num,
    inner_latency_s: Num,
    outer_latency_s: Num,
) -> Num:
    """An all-reduce, all-gather or reduce-scatter as NCCL's tuner prices it: the cheapest protocol (and, for an
    all-reduce, the cheaper of ring and tree) of base latency + hops x hop latency + wire time / bandwidth share.

    Small messages take LL's short hops, large ones Simple's full bandwidth. The ring's latency grows with every
    rank it visits (``ring_hops``); the tree's with 2 (inner - 1) hops inside and 2 log2(outer) across.
    """
    wire = wire_time(
        op,
        size_bytes=size_bytes,
        inner=inner,
        outer=outer,
        inner_bytes_per_s=inner_bytes_per_s,
        outer_bytes_per_s=outer_bytes_per_s,
    )
    hops_in, hops_out = ring_hops(op, inner=inner, outer=outer)
    tree_in, tree_out = 2 * (inner - 1), 2 * np.log2(maximum(outer, 1))
    best: Num = np.inf
    for p in Protocol:
        ring = (
            hops_in * inner_latency_s * PROTOCOL_HOP_SHARE_INNER[p]
            + hops_out * outer_latency_s * (PROTOCOL_HOP_SHARE_OUTER[p])
        )
        latency = PROTOCOL_BASE_S[p] + ring
        if op is Collective.ALL_REDUCE:
            tree = (
                tree_in * inner_latency_s * TREE_HOP_SHARE_INNER[p]
                + tree_out * outer_latency_s * (TREE_HOP_SHARE_OUTER[p])
            )
            latency = minimum(latency, TREE_BASE_S[p] + tree)
        best = minimum(best, latency + wire / PROTOCOL_BANDWIDTH_SHARE[p])
    return where(inner * outer > 1, best, 0.0)


def hierarchical_time(
    op: Collective,
    *,
    size_bytes: Num,
    inner: Num,
    outer: Num,
    inner_bytes_per_s: Num,
    outer_bytes_per_s: Num,
    inner_latency_s: Num,
    outer_latency_s: Num,
    leaving_share: Num = 1.0,
    staying_share: Num = 1.0,
) -> Num:
    """A collective over ``inner`` ranks per scale-up domain times ``outer`` domains.

    All-reduce, all-gather and reduce-scatter: ``nccl_time``. All-to-all: the (outer-1)/outer share of each
    buffer leaves the domain over the NICs while the rest stays on the scale-up link; ``leaving_share`` scales
    the bytes that leave (node-limited MoE routing sends fewer copies across nodes), ``staying_share`` those on the
    scale-up link (DeepEP: its deduplicated and forwarded copies, core/comm/ep.py). Broadcast: across the
    domains, then inside each. Send/recv: one message over the slower link it crosses.
    """
    n = inner * outer

    def ring(o: Collective, s: Num, k: Num, bw: Num, lat: Num) -> Num:
        return ring_time(o, size_bytes=s, n=k, bandwidth_bytes_per_s=bw, latency_s=lat)

    if op is Collective.ALL_TO_ALL:
        leaving = size_bytes * (n - inner) / n * leaving_share
        staying = size_bytes * (inner - 1) / n * staying_share
        t_out = where(outer > 1, leaving / outer_bytes_per_s + (outer - 1) * outer_latency_s, 0.0)
        t_in = where(inner > 1, staying / inner_bytes_per_s + (inner - 1) * inner_latency_s, 0.0)
        return maximum(t_out, t_in)
    if op is Collective.BROADCAST:  # across the domains, then inside each
        return ring(op, size_bytes, outer, outer_bytes_per_s, outer_latency_s) + ring(
            op, size_bytes, inner, inner_bytes_per_s, inner_latency_s
        )
    if op is Collective.SEND_RECV:
        return where(
            outer > 1,
            size_bytes / outer_bytes_per_s + outer_latency_s,
            size_bytes / inner_bytes_per_s + inner_latency_s,
        )
    return nccl_time(
        op,
        size_bytes=size_bytes,
        inner=inner,
        outer=outer,
        inner_bytes_per_s=inner_bytes_per_s,
        outer_bytes_per_s=outer_bytes_per_s,
        inner_latency_s=inner_latency_s,
        outer_latency_s=outer_latency_s,
    )
