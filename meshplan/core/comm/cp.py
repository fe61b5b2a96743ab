"""Context parallelism. Ring: cp-1 K/V block exchanges per attention layer forward, twice the bytes backward
(K/V and their gradients). All-gather: one all-gather of K/V forward, one reduce-scatter of their gradients
backward."""

from __future__ import annotations

from meshplan.core.comm.call import CollectiveCall, StageShape
from meshplan.core.comm.call import make_call as _call
from meshplan.core.comm.cost import Collective
from meshplan.core.comm.patterns import PATTERNS
from meshplan.core.num import where
from meshplan.core.placement import AxisPlacement
from meshplan.spec.cluster import Cluster
from meshplan.spec.layout import ContextParallel
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload
from meshplan.units import FP32_BYTES


def kv_exchange_width(model: ModelSpec, *, repeated: bool = False) -> float:
    """Width of the K and V a context-parallel rank hands on per token (MLA exchanges expanded K and V; K and V
    repeated before the attention, one head per query head, ``repeated``)."""
    if model.mla is not None:
        return model.num_heads * (model.mla.qk_head_dim + model.mla.v_head_dim)
    return 2 * model.kv_width * (model.num_heads / model.num_kv_heads if repeated else 1)


def cp_calls(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], st: StageShape
) -> list[CollectiveCall]:
    cp, tp, kind = lay.cp, lay.tp, lay.cp_kind  # type: ignore[attr-defined]
    width = kv_exchange_width(model, repeated=work.conditions.repeat_kv)
    block = st.tokens * width / tp * work.precision.activation_bytes
    layers = (st.dense_layers + st.moe_layers) * st.micro_batches
    ring, p = kind == ContextParallel.RING, pl["cp"]
    ring_count, gather_count = where(ring, (cp - 1) * layers, 0), where(ring, 0, layers)
    hides = work.overlap.cp
    apart = PATTERNS[work.framework].ring_grads_apart
    back = block if apart else 2 * block
    calls = [
        _call("cp", Collective.SEND_RECV, p, cl, phase="forward", size=block, count=ring_count, overlappable=hides),
        _call("cp", Collective.SEND_RECV, p, cl, phase="backward", size=back, count=ring_count, overlappable=hides),
        _call(
            "cp", Collective.ALL_GATHER, p, cl, phase="forward", size=block * cp, count=gather_count, overlappable=False
        ),
        _call(
            "cp",
            Collective.REDUCE_SCATTER,
            p,
            cl,
            phase="backward",
            size=block * cp,
            count=gather_count,
            overlappable=False,
        ),
    ]
    if apart:  # the fp32 dK/dV accumulators go round the whole ring, back to the rank that owns the block
        grads = block * FP32_BYTES / work.precision.activation_bytes
        calls.append(
            _call(
                "cp",
                Collective.SEND_RECV,
                p,
                cl,
                phase="backward",
                size=grads,
                count=where(ring, where(cp > 1, cp, 0) * layers, 0),  # no ring, no round: cp = 1 sends nothing
                overlappable=hides,
            )
        )
    return calls
