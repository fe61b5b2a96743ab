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

Where frameworks issue different collectives for the same layout,
``PATTERNS`` says which (measured for PyTorch 2.13 by ``meshplan check``,
docs/check.md), and torch_calls.py builds what only PyTorch-native training
issues (embedding and head collectives, Partial norm gradients, FSDP2 units,
DDP buckets and buffer broadcasts).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.core import torch_calls
from meshplan.core.calls import CollectiveCall, StageShape
from meshplan.core.calls import make_call as _call
from meshplan.core.comms import Collective
from meshplan.core.num import gcd, maximum, minimum, where
from meshplan.core.placement import AxisPlacement
from meshplan.core.shards import gather_bytes
from meshplan.spec.cluster import Cluster
from meshplan.spec.layout import ContextParallel, Recompute, ZeroStage
from meshplan.spec.model import MlpKind, ModelSpec
from meshplan.spec.workload import Framework, Workload

__all__ = ["PATTERNS", "CollectiveCall", "CollectivePattern", "StageShape", "inventory"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectivePattern:
    """Where frameworks issue different collectives for the same layout."""

    fused_column_inputs: bool
    """TP backward all-reduces one input gradient per column-parallel input (fused QKV, fused gate/up: 2 per
    layer); False: one per column-parallel module (q, k, v, gate, up: 5), each module wrapping its input alone."""
    sp_regathers_inputs: bool
    """Sequence parallelism gathers each sharded input again in backward for the weight gradient."""
    ring_grads_apart: bool
    """Ring CP backward passes K/V n - 1 times and the fp32 dK/dV accumulators n times; False: K/V and their
    gradients travel together n - 1 times."""
    ep_count_exchange: bool
    """An all-to-all of the per-expert token counts precedes each dispatch (8 E bytes)."""
    torch_native: bool
    """The embedding and head TP collectives, Partial norm gradients, FSDP2 units and DDP buckets of
    torch_calls.py (False: per-layer TP traffic and ZeRO's whole-model volumes only)."""


PATTERNS: dict[Framework, CollectivePattern] = {
    Framework.MEGATRON: CollectivePattern(
        fused_column_inputs=True,
        sp_regathers_inputs=True,
        ring_grads_apart=False,
        ep_count_exchange=False,
        torch_native=False,
    ),
    Framework.TORCH: CollectivePattern(
        fused_column_inputs=False,
        sp_regathers_inputs=False,
        ring_grads_apart=True,
        ep_count_exchange=True,
        torch_native=True,
    ),
}


FP32_BYTES = 4.0
INDEX_BYTES = 8.0
"""int64 token counts per expert."""


def column_parallel_inputs(model: ModelSpec, framework: Framework) -> int:
    """Input gradients TP all-reduces per layer in backward (reduce-scatters under SP with Megatron)."""
    if PATTERNS[framework].fused_column_inputs:
        return 2
    attention = 2 if model.mla is not None else 3  # MLA: wq (or wq_b) and wkv_b
    return attention + (2 if model.mlp is MlpKind.GATED else 1)


def tp_calls(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], st: StageShape
) -> list[CollectiveCall]:
    """TP per layer and micro-batch (Megatron's pattern; ``PATTERNS`` for the others).

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
    pattern = PATTERNS[work.framework]
    size = st.tokens * model.hidden * work.precision.activation_bytes
    per_step = (st.dense_layers + st.moe_layers) * st.micro_batches
    fwd = (2 + where(recompute == Recompute.FULL, 2, 0)) * per_step
    no_sp, with_sp = where(sp, 0, 1), where(sp, 1, 0)
    inputs = column_parallel_inputs(model, work.framework)
    regather = 2 if pattern.sp_regathers_inputs else 0
    p = pl["tp"]
    blocking = dict(overlappable=work.overlap.tp)
    behind_wgrad = dict(overlappable=work.overlap.tp_backward)
    calls = [
        _call("tp", Collective.ALL_REDUCE, p, cl, phase="forward", size=size, count=no_sp * fwd, **blocking),
        _call(
            "tp",
            Collective.ALL_REDUCE,
            p,
            cl,
            phase="backward",
            size=size,
            count=no_sp * inputs * per_step,
            **behind_wgrad,
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
            count=with_sp * regather * per_step,
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
    if pattern.torch_native:
        calls += torch_calls.tp_edge_calls(model, lay, work, cl, pl, st)
        calls += torch_calls.partial_norm_calls(model, lay, work, cl, pl, st)
    return calls


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
                count=where(ring, cp * layers, 0),
                overlappable=hides,
            )
        )
    return calls


def ep_calls(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], st: StageShape
) -> list[CollectiveCall]:
    if model.moe is None:
        return []
    size = st.tokens * model.moe.experts_per_token * model.hidden * work.precision.activation_bytes
    redo = where(lay.recompute == Recompute.FULL, 2, 0)  # type: ignore[attr-defined]
    per_step = st.moe_layers * st.micro_batches
    p = pl["ep"]
    calls = [
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
    if PATTERNS[work.framework].ep_count_exchange:
        counts = INDEX_BYTES * model.moe.num_experts
        exchanges = where(redo > 0, 2, 1) * per_step
        calls.append(
            _call("ep", Collective.ALL_TO_ALL, p, cl, phase="forward", size=counts, count=exchanges, overlappable=False)
        )
    return calls


def pp_calls(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], st: StageShape
) -> list[CollectiveCall]:
    tp, sp = lay.tp, lay.sp  # type: ignore[attr-defined]
    # Megatron scatters the stage output over the TP ranks; PyTorch sends what the stage returns
    split = tp if PATTERNS[work.framework].fused_column_inputs else where(sp, tp, 1)
    size = st.tokens * model.hidden * work.precision.activation_bytes / split
    count = where(lay.pp > 1, st.micro_batches * lay.vpp, 0)  # type: ignore[attr-defined]
    p = pl["pp"]
    return [
        _call("pp", Collective.SEND_RECV, p, cl, phase="forward", size=size, count=count * where(st.last_stage, 0, 1)),
        _call(
            "pp", Collective.SEND_RECV, p, cl, phase="backward", size=size, count=count * where(st.first_stage, 0, 1)
        ),
    ]


def dp_calls(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], st: StageShape
) -> list[CollectiveCall]:
    """Gradient and parameter traffic of data parallelism and ZeRO, for dense and expert parameters.

    PyTorch-native training replaces the whole-model volumes of ZeRO-0 (DDP's buckets) and ZeRO-3 (FSDP2's
    units) with torch_calls.py's exact ones.
    """
    zero, ep = lay.zero, lay.ep  # type: ignore[attr-defined]
    prec = work.precision
    gathered = gather_bytes(prec)  # parameters are gathered in the compute dtype
    native = PATTERNS[work.framework].torch_native
    whole_model_zero3 = where(native, zero != ZeroStage.PARAMETERS, True)
    shard_p, rep_p, cp_p = pl["dp_shard"], pl["dp_replicate"], pl["cp"]
    shard = shard_p.size * cp_p.size
    shard_inner = shard_p.inner * cp_p.inner
    full = shard * rep_p.size
    full_inner = shard_inner * rep_p.inner
    m = st.micro_batches
    calls: list[CollectiveCall] = []
    trained = (
        st.dense_params if st.trained_dense_params is None else st.trained_dense_params,
        st.expert_params if st.trained_expert_params is None else st.trained_expert_params,
    )
    base_gather = gathered if st.base_gather_bytes is None else st.base_gather_bytes
    for label, params, train, ep_div in (
        ("dense", st.dense_params, trained[0], 1),
        ("experts", st.expert_params, trained[1], ep),
    ):
        grads = train * prec.grad_bytes  # only what trains is reduced (the adapters under LoRA)
        g_shard = shard // gcd(shard, ep_div)
        g_full = full // gcd(full, ep_div)
        g_inner = where(g_shard > 1, maximum(shard_inner // gcd(shard_inner, ep_div), 1), 1)
        f_inner = maximum(full_inner // gcd(full_inner, ep_div), 1)
        strat = "dp" if label == "dense" else "dp-experts"
        every_mb = zero >= ZeroStage.GRADIENTS
        sharded = dict(group=g_shard, inner=minimum(g_inner, g_shard))
        # natively, DDP's buckets carry the dense gradients, and the experts' too unless EP owns them
        bucketed = where(native, (ep == 1) | (label == "dense"), False)
        calls += [
            _call(
                strat,
                Collective.ALL_REDUCE,
                shard_p,
                cl,
                phase="backward",
                size=grads,
                per_micro_batch=False,
                count=where(bucketed, 0, where(zero == ZeroStage.NONE, 1, 0)),
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
                count=where(zero == ZeroStage.OPTIMIZER, 1, where(every_mb & whole_model_zero3, m, 0)),
                **sharded,
            ),
            _call(
                strat,
                Collective.ALL_GATHER,
                shard_p,
                cl,
                phase="step",
                size=train * gathered,  # the updated parameters: only what trains
                per_micro_batch=False,
                count=where((zero == ZeroStage.OPTIMIZER) | (zero == ZeroStage.GRADIENTS), 1, 0),
                **sharded,
            ),
            *(
                _call(  # ZeRO-3 gathers the whole stage before its forward and again before its backward
                    strat,
                    Collective.ALL_GATHER,
                    shard_p,
                    cl,
                    phase=phase,
                    size=params * base_gather,
                    count=where((zero == ZeroStage.PARAMETERS) & whole_model_zero3, m, 0),
                    **sharded,
                )
                for phase in ("forward", "backward")
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
    if native:
        inner = minimum(shard_inner, shard)
        calls += torch_calls.fsdp_calls(model, lay, work, cl, shard_p, st, group=shard, inner=inner)
        calls += torch_calls.ddp_calls(model, lay, work, cl, shard_p, st, group=full, inner=minimum(full_inner, full))
    return calls


def inventory(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], st: StageShape
) -> list[CollectiveCall]:
    """All collectives of one step on a GPU of the stage described by ``st``."""
    calls: list[CollectiveCall] = []
    for build in (tp_calls, cp_calls, ep_calls, pp_calls, dp_calls):
        calls += build(model, lay, work, cl, pl, st)
    return calls
