"""Tensor parallelism: two all-reduces per layer forward and two backward (Shoeybi et al. 2019, Sec. 3); with
sequence parallelism an all-gather and a reduce-scatter in their place (Korthikanti et al. 2022, Sec. 4.2.2);
full recompute repeats the forward ones."""

from __future__ import annotations

from meshplan.core.comm.call import CollectiveCall, StageShape
from meshplan.core.comm.call import make_call as _call
from meshplan.core.comm.cost import Collective
from meshplan.core.comm.patterns import PATTERNS
from meshplan.core.num import where
from meshplan.core.placement import AxisPlacement
from meshplan.core.pytorch import collectives as torch_calls
from meshplan.spec.cluster import Cluster
from meshplan.spec.layout import Recompute
from meshplan.spec.model import MlpKind, ModelSpec
from meshplan.spec.workload import Framework, Workload


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
