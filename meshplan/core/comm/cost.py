"""Collective costs: alpha-beta models for each NCCL collective, flat and hierarchical.

``size_bytes`` is the buffer size nccl-tests reports: the whole buffer for
all-reduce, the gathered output for all-gather, the unreduced input for
reduce-scatter, the per-rank send buffer for all-to-all. Bandwidths are per
GPU per direction, already scaled by the link's efficiency.

Bus bandwidth (nccl-tests doc/PERFORMANCE.md): busbw = algbw * factor, with
factor 2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter and
all-to-all, and 1 for send/recv; a ring reaches busbw = link bandwidth.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from meshplan.core.num import Num, maximum, where


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


def tree_all_reduce_time(*, size_bytes: Num, n: Num, bandwidth_bytes_per_s: Num, latency_s: Num) -> Num:
    """NCCL double binary tree all-reduce: 2 log2(n) latency steps, about 2 S / bandwidth on the wire."""
    t = 2 * np.log2(maximum(n, 2)) * latency_s + 2 * size_bytes / bandwidth_bytes_per_s
    return where(n > 1, t, 0.0)


def all_reduce_time(*, size_bytes: Num, n: Num, bandwidth_bytes_per_s: Num, latency_s: Num) -> Num:
    """The faster of ring and tree, as NCCL's tuner picks per message size."""
    ring = ring_time(
        Collective.ALL_REDUCE,
        size_bytes=size_bytes,
        n=n,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        latency_s=latency_s,
    )
    tree = tree_all_reduce_time(
        size_bytes=size_bytes, n=n, bandwidth_bytes_per_s=bandwidth_bytes_per_s, latency_s=latency_s
    )
    out = np.minimum(ring, tree)
    return out.item() if np.ndim(out) == 0 else out


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
) -> Num:
    """A collective over ``inner`` ranks per scale-up domain times ``outer`` domains.

    All-reduce: reduce-scatter inside the domain, all-reduce of the 1/inner
    shard across domains (each GPU on its own NIC), all-gather inside.
    All-gather / reduce-scatter: the cross-domain phase moves the 1/inner
    share; all-to-all: the (outer-1)/outer share of each buffer leaves the
    domain over the NICs while the rest stays on the scale-up link.
    With outer = 1 it is the flat ring on the scale-up link; with inner = 1
    the flat ring on the scale-out link. ``leaving_share`` scales an all-to-all's bytes that leave the domain
    (node-limited MoE routing sends fewer copies across nodes).
    """
    n = inner * outer

    def ring(o: Collective, s: Num, k: Num, bw: Num, lat: Num) -> Num:
        return ring_time(o, size_bytes=s, n=k, bandwidth_bytes_per_s=bw, latency_s=lat)

    if op is Collective.ALL_REDUCE:
        intra = 2 * ring(Collective.REDUCE_SCATTER, size_bytes, inner, inner_bytes_per_s, inner_latency_s)
        inter = all_reduce_time(
            size_bytes=size_bytes / inner, n=outer, bandwidth_bytes_per_s=outer_bytes_per_s, latency_s=outer_latency_s
        )
        return intra + inter
    if op is Collective.ALL_TO_ALL:
        leaving = size_bytes * (n - inner) / n * leaving_share
        staying = size_bytes * (inner - 1) / n
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
    intra = ring(op, size_bytes, inner, inner_bytes_per_s, inner_latency_s)
    inter = ring(op, size_bytes / inner, outer, outer_bytes_per_s, outer_latency_s)
    return intra + inter
