"""One collective of a training step: the record, the stage it belongs to, and its timing on the fleet.

``collectives.py`` lists what every strategy issues; ``torch_calls.py`` what PyTorch-native training adds.
Both build their records here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from meshplan.core.comm.cost import Collective, hierarchical_time, peer_share
from meshplan.core.num import Num
from meshplan.core.placement import AxisPlacement
from meshplan.spec.cluster import Cluster


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveCall:
    """One kind of collective of one step, on one GPU."""

    strategy: str
    op: Collective
    axis: str
    phase: str
    """forward, backward, or step (after the last backward)."""
    group_size: Num
    size_bytes: Num
    """Buffer size of one call, as nccl-tests counts it (send/recv: one message)."""
    count_per_step: Num
    """Calls this GPU issues per step (send/recv: the messages it sends; it receives what its peers send)."""
    call_s: Num
    """Time of one call."""
    outer: Num
    """Scale-up domains the group spans (1: inside NVLink)."""
    per_micro_batch: Num = True
    """Issued once per micro-batch (False: once per step)."""
    overlappable: Num = True
    """Can run beside compute (False: the next op waits for it)."""

    @property
    def time_s(self) -> Num:
        return self.call_s * self.count_per_step

    @property
    def bytes_per_step(self) -> Num:
        return self.size_bytes * self.count_per_step


@dataclass(frozen=True, slots=True, kw_only=True)
class StageShape:
    """What one pipeline stage does per step, as the collectives need it."""

    tokens: Num
    """Local tokens per micro-batch: s / cp * b."""
    dense_layers: Num
    moe_layers: Num
    micro_batches: Num
    dense_params: Num
    """Parameters of the stage on this GPU that are not routed experts (before ZeRO)."""
    expert_params: Num
    trained_dense_params: Num = None
    """Dense parameters that get gradients (None: all of them; the adapters under LoRA)."""
    trained_expert_params: Num = None
    """Expert parameters that get gradients (None: all of them)."""
    base_gather_bytes: Num = None
    """Bytes per parameter ZeRO-3 gathers of the base (None: the compute dtype; NF4 under QLoRA)."""
    first_stage: Num = False
    """No stage before it: it sends nothing backward (False, with last_stage: a middle stage, sending both ways)."""
    last_stage: Num = False
    """No stage after it: it sends nothing forward."""
    embedding: Num = False
    """Holds the token embedding (PyTorch-native collectives only: its TP collectives, its FSDP2 root unit)."""
    head: Num = False
    """Holds the final norm, the output head and the loss (PyTorch-native collectives only, as embedding)."""
    tp_rank: Num = 0
    """TP rank of this GPU: the last ranks of an uneven split hold fewer rows (PyTorch-native sizes only)."""
    ddp_buffer_bytes: Num = 0
    """Module buffers DDP broadcasts before every forward (0: none, or buffer sync off)."""


UNISSUED_SHARE_TO_SKIP = 0.6
"""A batch prices a call on the layouts that issue it alone when they are at most this share of the batch."""


def scale_up_share(cluster: Cluster, members: Num) -> Num:
    """Share of each GPU's scale-up bandwidth a group of ``members`` GPUs inside one of the fleet's domains reaches
    (``cost.peer_share``)."""
    return peer_share(members, domain=cluster.domain_size, switched=cluster.scale_up_switched)


def make_call(
    strategy: str,
    op: Collective,
    place: AxisPlacement,
    cluster: Cluster,
    *,
    phase: str,
    size: Num,
    count: Num,
    group: Num | None = None,
    inner: Num | None = None,
    per_micro_batch: Num = True,
    overlappable: Num = True,
    leaving_share: Num = 1.0,
    staying_share: Num = 1.0,
    host_s: Num = 0.0,
) -> CollectiveCall:
    """One collective's record; ``host_s`` is time per call the host adds beside the wire (copies it launches)."""
    n = place.size if group is None else group
    inner_n = place.inner if inner is None else inner
    outer = n // inner_n

    def price(rows: npt.NDArray[np.int64] | None) -> Num:
        def on(x: Num) -> Num:
            return x if rows is None or np.ndim(x) == 0 else x[rows]

        return hierarchical_time(
            op,
            size_bytes=on(size),
            inner=on(inner_n),
            outer=on(outer),
            inner_bytes_per_s=cluster.scale_up.effective_bytes_per_s * scale_up_share(cluster, on(inner_n)),
            outer_bytes_per_s=cluster.scale_out.effective_bytes_per_s
            / (cluster.oversubscription if op is Collective.ALL_TO_ALL else 1.0),
            inner_latency_s=cluster.scale_up.latency_s,
            outer_latency_s=cluster.scale_out.latency_s,
            leaving_share=on(leaving_share),
            staying_share=on(staying_share),
        ) + on(host_s)

    t: Num = 0.0
    if np.ndim(count) == 0:
        t = price(None) if count else 0.0
    else:  # a batch: priced where some layout issues the call (an unissued call's time counts nowhere)
        rows = np.flatnonzero(count)
        if len(rows) > UNISSUED_SHARE_TO_SKIP * np.size(count):
            t = price(None)
        elif len(rows):
            t = np.zeros(np.shape(count))
            t[rows] = price(rows)
    return CollectiveCall(
        strategy=strategy,
        op=op,
        axis=place.axis,
        phase=phase,
        group_size=n,
        size_bytes=size,
        count_per_step=count,
        call_s=t,
        outer=outer,
        per_micro_batch=per_micro_batch,
        overlappable=overlappable,
    )
