"""Data parallelism and ZeRO/FSDP. ZeRO-0: gradient all-reduce over dp x cp, once per step, bucketed. ZeRO-1:
gradient reduce-scatter and parameter all-gather over the shard group once per step. ZeRO-2: the
reduce-scatter every micro-batch. ZeRO-3: parameter all-gathers in forward and backward and a gradient
reduce-scatter every micro-batch (3x the parameters, ZeRO Sec. 7.2), one per layer, each paying its latency.
HSDP adds an all-reduce of the shard across replicas."""

from __future__ import annotations

from meshplan.core.comm.call import CollectiveCall, StageShape
from meshplan.core.comm.call import make_call as _call
from meshplan.core.comm.cost import Collective
from meshplan.core.comm.patterns import PATTERNS
from meshplan.core.num import gcd, maximum, minimum, where
from meshplan.core.placement import AxisPlacement
from meshplan.core.pytorch import collectives as torch_calls
from meshplan.core.pytorch.shards import gather_bytes
from meshplan.spec.cluster import Cluster
from meshplan.spec.layout import ZeroStage
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload


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
    zero3 = zero == ZeroStage.PARAMETERS
    for label, params, train, ep_div, layers in (
        ("dense", st.dense_params, trained[0], 1, st.dense_layers + st.moe_layers),
        ("experts", st.expert_params, trained[1], ep, st.moe_layers),
    ):
        # ZeRO-3 gathers and reduce-scatters one layer at a time (FSDP's per-layer units, DeepSpeed's per-module
        # fetches): the same bytes as one whole-stage collective, and one latency per layer
        units = where(zero3, maximum(layers, 1), 1)
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
                size=grads / units,
                per_micro_batch=every_mb,
                count=where(zero == ZeroStage.OPTIMIZER, 1, where(every_mb & whole_model_zero3, m * units, 0)),
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
                _call(  # ZeRO-3 gathers every layer before its forward and again before its backward
                    strat,
                    Collective.ALL_GATHER,
                    shard_p,
                    cl,
                    phase=phase,
                    size=params * base_gather / units,
                    count=where(zero3 & whole_model_zero3, m * units, 0),
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
