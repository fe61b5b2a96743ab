"""Every collective one training step issues on one GPU: what, how big, how often, over which link.

Per strategy (the module docstrings of Megatron-LM, PyTorch FSDP and the
papers cited below say the same):
  dp    gradient all-reduce over dp x cp (ZeRO-0), once per step, bucketed;
  zero  ZeRO-1: gradient reduce-scatter and parameter all-gather over the
        shard group once per step; ZeRO-2: the reduce-scatter every
        micro-batch; ZeRO-3: parameter all-gathers in forward and backward
        and a gradient reduce-scatter every micro-batch (3x the parameters,
        ZeRO Sec. 7.2); HSDP adds an all-reduce of the shard across replicas;
  tp    Megatron: two all-reduces per layer in forward and two in backward
        (Shoeybi et al. 2019, Sec. 3); with sequence parallelism an
        all-gather and a reduce-scatter in their place (Korthikanti Sec. 4.2.2);
        full recompute repeats the forward ones;
  pp    one activation send forward and one gradient send backward per
        micro-batch and model chunk, b s h / t bytes (Narayanan Sec. 4.1);
  cp    ring: cp-1 K/V block exchanges per attention layer forward, twice the
        bytes backward (K/V and their gradients); all-gather: one all-gather
        of K/V forward and one reduce-scatter of their gradients backward;
  ep    a dispatch and a combine all-to-all per MoE layer forward and again
        backward, k b s h bytes per rank each.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.core.comms import Collective, hierarchical_time
from meshplan.core.num import Num, gcd, maximum, minimum, where
from meshplan.core.placement import AxisPlacement
from meshplan.spec.cluster import Cluster
from meshplan.spec.layout import ContextParallel, Recompute, ZeroStage
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload


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
    """Buffer size of one call, as nccl-tests counts it."""
    count_per_step: Num
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


def _call(
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
) -> CollectiveCall:
    n = place.size if group is None else group
    inner_n = place.inner if inner is None else inner
    outer = n // inner_n
    t = hierarchical_time(
        op,
        size_bytes=size,
        inner=inner_n,
        outer=outer,
        inner_bytes_per_s=cluster.scale_up.effective_bytes_per_s,
        outer_bytes_per_s=cluster.scale_out.effective_bytes_per_s,
        inner_latency_s=cluster.scale_up.latency_s,
        outer_latency_s=cluster.scale_out.latency_s,
    )
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


def tp_calls(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], st: StageShape
) -> list[CollectiveCall]:
    """Megatron TP per layer and micro-batch.

    Without SP: two all-reduces forward (after the attention and MLP
    row-parallel matmuls) and two backward (input gradients of the two
    column-parallel matmuls, overlapped with the weight gradients). With SP:
    forward all-gathers before the column-parallel and reduce-scatters after
    the row-parallel matmuls; backward, the row-parallel side all-gathers its
    output gradient (blocking), and the column-parallel side all-gathers its
    input again for the weight gradient and reduce-scatters the input
    gradient (both overlapped). Full recompute repeats the forward ones.
    """
    sp, recompute = lay.sp, lay.recompute  # type: ignore[attr-defined]
    size = st.tokens * model.hidden * work.precision.activation_bytes
    per_step = (st.dense_layers + st.moe_layers) * st.micro_batches
    fwd = (2 + where(recompute == Recompute.FULL, 2, 0)) * per_step
    no_sp, with_sp = where(sp, 0, 1), where(sp, 1, 0)
    p = pl["tp"]
    blocking = dict(overlappable=work.overlap.tp)
    behind_wgrad = dict(overlappable=work.overlap.tp_backward)
    return [
        _call("tp", Collective.ALL_REDUCE, p, cl, phase="forward", size=size, count=no_sp * fwd, **blocking),
        _call(
            "tp", Collective.ALL_REDUCE, p, cl, phase="backward", size=size, count=no_sp * 2 * per_step, **behind_wgrad
        ),
        _call("sp", Collective.ALL_GATHER, p, cl, phase="forward", size=size, count=with_sp * fwd, **blocking),
        _call("sp", Collective.REDUCE_SCATTER, p, cl, phase="forward", size=size, count=with_sp * fwd, **blocking),
        _call(
            "sp",
            Collective.ALL_GATHER,
            p,
            cl,
            phase="backward",
            size=size,
            count=with_sp * 2 * per_step,
            overlappable=False,
        ),
        _call(
            "sp",
            Collective.ALL_GATHER,
            p,
            cl,
            phase="backward",
            size=size,
            count=with_sp * 2 * per_step,
            **behind_wgrad,
        ),
        _call(
            "sp",
            Collective.REDUCE_SCATTER,
            p,
            cl,
            phase="backward",
            size=size,
            count=with_sp * 2 * per_step,
            **behind_wgrad,
        ),
    ]


def kv_exchange_width(model: ModelSpec) -> int:
    """Width of the K and V a context-parallel rank hands on per token (MLA exchanges expanded K and V)."""
    if model.mla is not None:
        return model.num_heads * (model.mla.qk_head_dim + model.mla.v_head_dim)
    return 2 * model.kv_width


def cp_calls(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], st: StageShape
) -> list[CollectiveCall]:
    cp, tp, kind = lay.cp, lay.tp, lay.cp_kind  # type: ignore[attr-defined]
    block = st.tokens * kv_exchange_width(model) / tp * work.precision.activation_bytes
    layers = (st.dense_layers + st.moe_layers) * st.micro_batches
    ring, p = kind == ContextParallel.RING, pl["cp"]
    ring_count, gather_count = where(ring, (cp - 1) * layers, 0), where(ring, 0, layers)
    hides = work.overlap.cp
    return [
        _call("cp", Collective.SEND_RECV, p, cl, phase="forward", size=block, count=ring_count, overlappable=hides),
        _call(
            "cp", Collective.SEND_RECV, p, cl, phase="backward", size=2 * block, count=ring_count, overlappable=hides
        ),
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


def ep_calls(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], st: StageShape
) -> list[CollectiveCall]:
    if model.moe is None:
        return []
    size = st.tokens * model.moe.experts_per_token * model.hidden * work.precision.activation_bytes
    redo = where(lay.recompute == Recompute.FULL, 2, 0)  # type: ignore[attr-defined]
    per_step = st.moe_layers * st.micro_batches
    p = pl["ep"]
    return [
        _call(
            "ep",
            Collective.ALL_TO_ALL,
            p,
            cl,
            phase="forward",
            size=size,
            count=(2 + redo) * per_step,
            overlappable=work.overlap.ep,
        ),
        _call(
            "ep",
            Collective.ALL_TO_ALL,
            p,
            cl,
            phase="backward",
            size=size,
            count=2 * per_step,
            overlappable=work.overlap.ep,
        ),
    ]


def pp_calls(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], st: StageShape
) -> list[CollectiveCall]:
    size = st.tokens * model.hidden * work.precision.activation_bytes / lay.tp  # type: ignore[attr-defined]
    count = where(lay.pp > 1, st.micro_batches * lay.vpp, 0)  # type: ignore[attr-defined]
    p = pl["pp"]
    return [
        _call("pp", Collective.SEND_RECV, p, cl, phase="forward", size=size, count=count),
        _call("pp", Collective.SEND_RECV, p, cl, phase="backward", size=size, count=count),
    ]


def dp_calls(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], st: StageShape
) -> list[CollectiveCall]:
    """Gradient and parameter traffic of data parallelism and ZeRO, for dense and expert parameters."""
    zero, ep = lay.zero, lay.ep  # type: ignore[attr-defined]
    prec = work.precision
    gather_bytes = 4.0 if prec.compute.value == "tf32" else 2.0  # parameters are gathered in the compute dtype
    shard_p, rep_p, cp_p = pl["dp_shard"], pl["dp_replicate"], pl["cp"]
    shard = shard_p.size * cp_p.size
    shard_inner = shard_p.inner * cp_p.inner
    full = shard * rep_p.size
    full_inner = shard_inner * rep_p.inner
    m = st.micro_batches
    calls: list[CollectiveCall] = []
    for label, params, ep_div in (("dense", st.dense_params, 1), ("experts", st.expert_params, ep)):
        grads = params * prec.grad_bytes
        g_shard = shard // gcd(shard, ep_div)
        g_full = full // gcd(full, ep_div)
        g_inner = where(g_shard > 1, maximum(shard_inner // gcd(shard_inner, ep_div), 1), 1)
        f_inner = maximum(full_inner // gcd(full_inner, ep_div), 1)
        strat = "dp" if label == "dense" else "dp-experts"
        every_mb = zero >= ZeroStage.GRADIENTS
        sharded = dict(group=g_shard, inner=minimum(g_inner, g_shard))
        calls += [
            _call(
                strat,
                Collective.ALL_REDUCE,
                shard_p,
                cl,
                phase="backward",
                size=grads,
                per_micro_batch=False,
                count=where(zero == ZeroStage.NONE, 1, 0),
                group=g_full,
                inner=minimum(f_inner, g_full),
            ),
            _call(
                strat,
                Collective.REDUCE_SCATTER,
                shard_p,
                cl,
                phase="backward",
                size=grads,
                per_micro_batch=every_mb,
                count=where(zero == ZeroStage.OPTIMIZER, 1, where(every_mb, m, 0)),
                **sharded,
            ),
            _call(
                strat,
                Collective.ALL_GATHER,
                shard_p,
                cl,
                phase="step",
                size=params * gather_bytes,
                per_micro_batch=False,
                count=where((zero == ZeroStage.OPTIMIZER) | (zero == ZeroStage.GRADIENTS), 1, 0),
                **sharded,
            ),
            _call(
                strat,
                Collective.ALL_GATHER,
                shard_p,
                cl,
                phase="forward",
                size=params * gather_bytes,
                count=where(zero == ZeroStage.PARAMETERS, m, 0),
                **sharded,
            ),
            _call(
                strat,
                Collective.ALL_GATHER,
                shard_p,
                cl,
                phase="backward",
                size=params * gather_bytes,
                count=where(zero == ZeroStage.PARAMETERS, m, 0),
                **sharded,
            ),
            _call(
                strat,
                Collective.ALL_REDUCE,
                rep_p,
                cl,
                phase="backward",
                size=grads / g_shard,
                per_micro_batch=False,
                count=where((zero > ZeroStage.NONE) & (rep_p.size > 1), 1, 0),
            ),
        ]
    return calls


def inventory(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], st: StageShape
) -> list[CollectiveCall]:
    """All collectives of one step on a GPU of the stage described by ``st``."""
    calls: list[CollectiveCall] = []
    for build in (tp_calls, cp_calls, ep_calls, pp_calls, dp_calls):
        calls += build(model, lay, work, cl, pl, st)
    return calls
