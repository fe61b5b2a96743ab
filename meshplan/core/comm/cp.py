"""Context parallelism. Ring: cp-1 K/V block exchanges per attention layer forward, twice the bytes backward
(K/V and their gradients); PyTorch's ring sends its fp32 dK/dV accumulators apart, cp hops, and with
``--cp-rotate allgather`` gathers every K/V block at once instead of block by block. All-gather (Llama 3): one
all-gather of K/V forward; backward gathers them again from the local blocks it saved and reduce-scatters their
gradients (Transformer Engine's AttnFuncWithCPAndKVAllGather), all exposed. Full recompute repeats the forward's
exchange in the recomputed forward."""

from __future__ import annotations

from meshplan.core.comm.call import CollectiveCall, StageShape
from meshplan.core.comm.call import make_call as _call
from meshplan.core.comm.cost import Collective
from meshplan.core.comm.patterns import PATTERNS
from meshplan.core.num import Num, where
from meshplan.core.placement import AxisPlacement
from meshplan.spec.cluster import Cluster
from meshplan.spec.conditions import CpRotate
from meshplan.spec.layout import ContextParallel, Recompute
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
    # full recompute runs each layer's forward again in backward, its K/V exchange with it (as TP's collectives)
    forward_layers = layers * where(lay.recompute == Recompute.FULL, 2, 1)  # type: ignore[attr-defined]
    ring, p = kind == ContextParallel.RING, pl["cp"]
    hides = work.overlap.cp
    apart = PATTERNS[work.framework].ring_grads_apart
    gathered = apart and work.conditions.cp_rotate is CpRotate.ALLGATHER
    each_block = where(ring & (cp > 1), 0 if gathered else 1, 0)  # block by block: cp - 1 sends a call
    at_once = where(ring & (cp > 1), 1 if gathered else 0, 0)  # PyTorch's _AllGatherRotater: one all-gather
    llama3 = where(ring, 0, 1)

    def call(op: Collective, phase: str, size: Num, count: Num, overlappable: Num = hides) -> CollectiveCall:
        return _call("cp", op, p, cl, phase=phase, size=size, count=count, overlappable=overlappable)

    calls = [
        call(Collective.SEND_RECV, "forward", block, each_block * (cp - 1) * forward_layers),
        call(Collective.SEND_RECV, "backward", block if apart else 2 * block, each_block * (cp - 1) * layers),
        call(Collective.ALL_GATHER, "forward", block * cp, at_once * forward_layers),
        call(Collective.ALL_GATHER, "backward", block * cp, at_once * layers),
        call(Collective.ALL_GATHER, "forward", block * cp, llama3 * forward_layers, overlappable=False),
        # the backward gathers K/V again from the local blocks it saved (TE's AttnFuncWithCPAndKVAllGather.backward)
        call(Collective.ALL_GATHER, "backward", block * cp, llama3 * layers, overlappable=False),
        call(Collective.REDUCE_SCATTER, "backward", block * cp, llama3 * layers, overlappable=False),
    ]
    if apart:  # the fp32 dK/dV accumulators go round the whole ring, back to the rank that owns the block
        grads = block * FP32_BYTES / work.precision.activation_bytes
        hops = where(ring & (cp > 1), layers, 0)  # no ring, no round: cp = 1 sends nothing
        calls.append(call(Collective.SEND_RECV, "backward", grads, (cp - 1) * hops))
        # the last hop is waited for after the last block (``dkv_rotater.next_buffer()`` before the return)
        calls.append(call(Collective.SEND_RECV, "backward", grads, hops, overlappable=False))
    return calls
