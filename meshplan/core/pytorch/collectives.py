"""Collectives PyTorch-native training issues beyond the per-layer pattern every framework shares.

Measured on torch 2.13 by ``meshplan check`` (docs/check.md):
  tp edges  DTensor's vocab-sharded embedding all-reduces its output (reduce-scatters it under SP); the
            output head gathers its input (under SP) or all-reduces its input gradient (without SP), and,
            unless the loss runs on the vocabulary shards (loss_parallel), the logits, padded to ceil(V/t)
            rows per rank;
  norms     under SP the replicated norm weights keep Partial gradients: FSDP2 all-reduces each once in
            backward over the TP group; without it every optimizer read redistributes them (AdamW: 3);
  fsdp2     one all-gather per unit (every layer, then the root) forward, every layer again in backward
            (the root stays gathered by default), one reduce-scatter per unit; buffers are padded shards;
  ddp       one all-reduce per gradient bucket (shards.ddp_buckets) and a broadcast of the module buffers
            before every forward.
"""

from __future__ import annotations

from meshplan.core.comm.call import CollectiveCall, StageShape, make_call
from meshplan.core.comm.cost import Collective
from meshplan.core.memory.activations import vocab_parallel_loss
from meshplan.core.num import Num, ceil_div, gcd, maximum, minimum, where
from meshplan.core.placement import AxisPlacement
from meshplan.core.pytorch.shards import RankCoords, ddp_buckets, fsdp_units, fsdp_zero2, gather_bytes, rank_params
from meshplan.core.stages import StageRow
from meshplan.spec.cluster import Cluster
from meshplan.spec.layout import ZeroStage
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import OptimizerKind, Workload

PARTIAL_GRAD_READS = {OptimizerKind.ADAMW: 3, OptimizerKind.SGD_MOMENTUM: 1, OptimizerKind.SGD: 1}
"""Reads of each gradient in one torch.optim step (foreach off), each redistributing a Partial DTensor gradient.
AdamW (lerp_ once, addcmul_ twice) is measured; the others are read from their update rules."""


def _units(st: StageShape) -> StageRow:
    first, last = where(st.embedding, 1, 0), where(st.head, 1, 0)
    layers = st.dense_layers + st.moe_layers
    return StageRow(
        stage=0,
        first_layer=0,
        layers=layers,
        dense_layers=st.dense_layers,
        moe_layers=st.moe_layers,
        embedding=first,
        head=last,
    )


def tp_edge_calls(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], st: StageShape
) -> list[CollectiveCall]:
    """The embedding's and the output head's TP collectives, per micro-batch, on the stages holding them."""
    tp, sp = lay.tp, lay.sp  # type: ignore[attr-defined]
    e = work.precision.activation_bytes
    hidden = st.tokens * model.hidden * e
    logits = st.tokens * ceil_div(model.vocab_size, tp) * tp * e
    m, p = st.micro_batches, pl["tp"]
    first, last = m * where(st.embedding, 1, 0), m * where(st.head, 1, 0)
    gathered = 0 if vocab_parallel_loss(work) else last  # torchtitan's ColwiseParallel(output_layouts=Shard(-1))
    with_sp, no_sp = where(sp, 1, 0), where(sp, 0, 1)

    def call(op: Collective, phase: str, size: Num, count: Num) -> CollectiveCall:
        return make_call("tp", op, p, cl, phase=phase, size=size, count=count, overlappable=False)

    return [
        call(Collective.ALL_REDUCE, "forward", hidden, no_sp * first),
        call(Collective.REDUCE_SCATTER, "forward", hidden, with_sp * first),
        call(Collective.ALL_GATHER, "backward", hidden, with_sp * first),
        call(Collective.ALL_GATHER, "forward", hidden, with_sp * last),
        call(Collective.ALL_GATHER, "forward", logits, gathered),
        call(Collective.ALL_REDUCE, "backward", hidden, no_sp * last),
        call(Collective.REDUCE_SCATTER, "backward", hidden, with_sp * last),
    ]


def partial_norm_calls(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], st: StageShape
) -> list[CollectiveCall]:
    """All-reduces of the Partial gradients of the norm weights sequence parallelism replicates."""
    sp, zero, shard = lay.sp, lay.zero, lay.dp_shard * lay.cp  # type: ignore[attr-defined]
    norms = where(sp, 2 * (st.dense_layers + st.moe_layers) + where(st.head, 1, 0), 0)
    size = model.norm_params * work.precision.grad_bytes
    under_fsdp = (zero >= ZeroStage.PARAMETERS) & (shard > 1)
    reads = PARTIAL_GRAD_READS.get(work.optimizer.kind, 1)
    p = pl["tp"]
    return [
        make_call(
            "tp",
            Collective.ALL_REDUCE,
            p,
            cl,
            phase="backward",
            size=size,
            count=where(under_fsdp, norms * st.micro_batches, 0),
        ),
        make_call(
            "tp",
            Collective.ALL_REDUCE,
            p,
            cl,
            phase="step",
            size=size,
            count=where(under_fsdp, 0, reads * norms),
            per_micro_batch=False,
            overlappable=False,
        ),
    ]


def fsdp_calls(
    model: ModelSpec,
    lay: object,
    work: Workload,
    cl: Cluster,
    place: AxisPlacement,
    st: StageShape,
    *,
    group: Num,
    inner: Num,
    reshard_root: Num = False,
) -> list[CollectiveCall]:
    """FSDP2's all-gathers and reduce-scatters, unit by unit, over the shard group ``group``, under ZeRO-3 and
    under ZeRO-2 (reshard-after-forward off: each unit gathered once per micro-batch, in forward).

    ``reshard_root``: ``fully_shard(..., reshard_after_forward=True)`` given explicitly, which reshards the root
    too (the default leaves it gathered), so backward gathers it again. Under ``work.conditions``: with
    reshard-after-forward off no unit is gathered again in backward; without gradient sync every micro-batch
    gathers (FSDP2 still reshards after backward) but only the last one reduce-scatters.
    """
    at = RankCoords(tp=lay.tp, tp_rank=st.tp_rank, ep=lay.ep, fsdp=group, etp=lay.etp)  # type: ignore[attr-defined]
    zero = lay.zero  # type: ignore[attr-defined]
    # ZeRO-2: FSDP2 without resharding after forward (SHARD_GRAD_OP), unless it reduces as DeepSpeed does (dp.py)
    on = where(zero == ZeroStage.PARAMETERS, 1, where(zero == ZeroStage.GRADIENTS, int(fsdp_zero2(work)), 0))
    reshard = where(zero == ZeroStage.PARAMETERS, int(work.conditions.reshard_after_forward), 0)
    m, cond = st.micro_batches, work.conditions
    reductions = m if cond.grad_sync else 1
    reduce_bytes = work.precision.grad_bytes
    calls: list[CollectiveCall] = []
    ep_inner = maximum(inner // gcd(inner, lay.ep), 1)  # type: ignore[attr-defined]
    for unit, padded, count, on_group in fsdp_units(model, at, _units(st)):
        # FP8 all-gather converts the layers' Float8Linear weights; the root (embedding, head) stays bf16
        param_bytes = gather_bytes(work.precision, fp8=cond.fp8_all_gather and unit != "root")
        # the experts' group: the shard group's ranks at one EP rank, strided by the EP group inside the domain
        g, g_inner = (on_group, minimum(ep_inner, on_group)) if unit == "experts" else (group, inner)
        regather = where(reshard_root, 1, 0) if unit == "root" else reshard
        gathers = [("forward", count), ("backward", count * regather)]
        calls += [
            make_call(
                "dp",
                Collective.ALL_GATHER,
                place,
                cl,
                phase=phase,
                size=g * padded * param_bytes,
                count=on * m * n,
                group=g,
                inner=g_inner,
            )
            for phase, n in gathers
        ]
        calls.append(
            make_call(
                "dp",
                Collective.REDUCE_SCATTER,
                place,
                cl,
                phase="backward",
                size=g * padded * reduce_bytes,
                count=on * reductions * count,
                group=g,
                inner=g_inner,
            )
        )
    return calls


def ddp_calls(
    model: ModelSpec,
    lay: object,
    work: Workload,
    cl: Cluster,
    place: AxisPlacement,
    st: StageShape,
    *,
    group: Num,
    inner: Num,
) -> list[CollectiveCall]:
    """DDP over ``group``: the gradient buckets (experts left to their own group under EP) and the buffers."""
    ep = lay.ep  # type: ignore[attr-defined]
    at = RankCoords(tp=lay.tp, tp_rank=st.tp_rank, ep=ep, etp=lay.etp)  # type: ignore[attr-defined]
    units = _units(st)
    grad = work.precision.grad_bytes
    p = rank_params(model, at, units)
    reduced = (p.numel - where(ep > 1, p.expert_numel, 0)) * grad
    buckets = ddp_buckets(model, at, units, grad_bytes=grad, experts=ep == 1)
    on = (lay.zero == ZeroStage.NONE) & (group > 1)  # type: ignore[attr-defined]
    sync = on & (st.ddp_buffer_bytes > 0)
    return [
        make_call(
            "dp",
            Collective.ALL_REDUCE,
            place,
            cl,
            phase="backward",
            size=reduced / where(buckets > 0, buckets, 1),
            count=where(on, buckets, 0),
            group=group,
            inner=inner,
            per_micro_batch=False,
        ),
        make_call(
            "dp",
            Collective.BROADCAST,
            place,
            cl,
            phase="forward",
            size=st.ddp_buffer_bytes,
            count=where(sync, st.micro_batches, 0),
            group=group,
            inner=inner,
            overlappable=False,
        ),
    ]
