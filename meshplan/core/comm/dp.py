"""Data parallelism and ZeRO/FSDP. ZeRO-0: gradient all-reduce over dp x cp, once per step, bucketed. ZeRO-1:
gradient reduce-scatter and parameter all-gather over the shard group once per step. ZeRO-2: the
reduce-scatter every micro-batch. ZeRO-3: parameter all-gathers in forward and backward and a gradient
reduce-scatter every micro-batch (3x the parameters, ZeRO Sec. 7.2), one per unit, each paying its latency: a
layer for FSDP, a weight matrix for DeepSpeed (``Zero3Unit``), whose recomputed forward gathers again; DeepSpeed
0.3 by default all-reduces each matrix's gradient instead (``Zero3GradReduce``).
HSDP adds an all-reduce of the shard across replicas."""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.core.comm.call import CollectiveCall, StageShape
from meshplan.core.comm.call import make_call as _call
from meshplan.core.comm.cost import Collective
from meshplan.core.comm.patterns import PATTERNS
from meshplan.core.comm.persistent import persistent_regather
from meshplan.core.comm.tp import column_parallel_inputs
from meshplan.core.num import Num, gcd, maximum, minimum, where
from meshplan.core.placement import AxisPlacement
from meshplan.core.pytorch import collectives as torch_calls
from meshplan.core.pytorch.shards import gather_bytes
from meshplan.spec.cluster import Cluster
from meshplan.spec.conditions import Zero3GradReduce, Zero3Unit, ZeroGradReduce
from meshplan.spec.layout import Recompute, ZeroStage
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload


@dataclass(frozen=True, slots=True, kw_only=True)
class DpPart:
    """One kind of parameters the data-parallel group reduces (dense, or routed experts) and how it does."""

    strategy: str
    params: Num
    """Parameters of the stage on this GPU (before ZeRO)."""
    trained: Num
    """Those that get gradients."""
    gather_bytes: Num
    """Bytes per parameter ZeRO-3 gathers."""
    units: Num
    """ZeRO-3 collectives per gather or reduce-scatter of the whole part (1 without ZeRO-3)."""
    issued: Num
    """1 when the stage holds any of these parameters (a dense model issues no expert collectives), else 0."""
    shard_group: Num
    shard_inner: Num
    full_group: Num
    full_inner: Num
    rank_op_s: Num
    """Host time of one operation per rank of the shard group under list collectives (``Zero3Unit.PARAMETER``),
    else 0: a launch gap."""
    copy_s_per_byte: Num
    """Seconds one pass over a byte of buffer takes in HBM under list collectives, else 0."""


GATHER_PASSES = 1
"""HBM passes over the gathered buffer beside the wire and the per-rank copies under list collectives: torch.zeros
fills the flat buffer before the gather (DeepSpeed 0.3.14 partition_parameters.py _allgather_param)."""
REDUCE_SCATTER_PASSES = 2
"""The same for the gradient: its pre-division by the group size, read and written (stage3.py average_tensor,
tensor.div_)."""
BUCKET_PASSES = 6
"""HBM passes over a gradient bucket all-reduced whole (``Zero3GradReduce.ALL_REDUCE``): flattened into one buffer,
divided by the group size and copied back, each a read and a write (DeepSpeed 0.3.14 stage3.py allreduce_bucket,
allreduce_and_copy)."""


def listed_host_s(part: DpPart, *, size: Num, passes: int) -> Num:
    """Time a list collective adds beside the wire (0 unless ``Zero3Unit.PARAMETER``): DeepSpeed 0.3 builds a view
    per rank (_allgather_param, _reduce_scatter_gradient), and PyTorch's ProcessGroupNCCL copies every rank's slice
    out of (all_gather) or into (reduce_scatter) a flat buffer of its own, a copy per rank: launch-bound, or bound
    by the read and write of the whole buffer in HBM; then ``passes`` whole-buffer kernels. The fetch synchronizes
    the device around them, so nothing hides them."""
    if not (part.rank_op_s or part.copy_s_per_byte):  # plain floats: 0.0 unless listed
        return 0.0
    launches = part.shard_group * part.rank_op_s
    return launches + maximum(launches, 2 * size * part.copy_s_per_byte) + passes * size * part.copy_s_per_byte


def zero3_units_per_layer(model: ModelSpec, work: Workload) -> int:
    """ZeRO-3 collectives per layer and pass: 1 for FSDP's layer units; under DeepSpeed one per weight matrix.

    DeepSpeed ZeRO-3 fetches each sub-module's partitioned parameters when its forward (or backward) starts
    and reduce-scatters each parameter's gradient (DeepSpeed v0.3.14 stage3.py fetch_sub_module,
    partition_parameters.py _allgather_param and _reduce_scatter_gradient, one collective per parameter);
    biases and norms below stage3_param_persistence_threshold (1e5 elements) stay whole. The matrices of a layer
    are its column-parallel inputs plus the two row-parallel outputs (fused QKV and fused gate/up count once).
    """
    if work.conditions.zero3_unit is Zero3Unit.LAYER:
        return 1  # PARAMETER: the same matrices, listed
    return column_parallel_inputs(model, work.framework) + 2


def _parts(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], st: StageShape
) -> list[DpPart]:
    """The dense and the expert part, with their groups: expert gradients skip the EP ranks that own them."""
    zero, ep = lay.zero, lay.ep  # type: ignore[attr-defined]
    shard_p, rep_p, cp_p = pl["dp_shard"], pl["dp_replicate"], pl["cp"]
    shard, shard_inner = shard_p.size * cp_p.size, shard_p.inner * cp_p.inner
    full, full_inner = shard * rep_p.size, shard_inner * rep_p.inner
    base_gather = gather_bytes(work.precision) if st.base_gather_bytes is None else st.base_gather_bytes
    per_layer = where(zero == ZeroStage.PARAMETERS, zero3_units_per_layer(model, work), 0)
    listed = work.conditions.zero3_unit is Zero3Unit.PARAMETER
    launch_s = cl.gpu.calibration.kernel_overhead_s
    hbm_bytes_per_s = cl.gpu.hbm_bandwidth_bytes_per_s * cl.gpu.calibration.hbm_efficiency
    out = []
    # folded (expert TP below TP), the TP ranks an expert does not split are data ranks of the experts too: the
    # experts' data group is tp cp dp / (ep etp) (Megatron's MoE parallel folding; memory's shard_degrees)
    fold = lay.tp // lay.etp  # type: ignore[attr-defined]
    for label, params, trained, ep_div, widen, layers in (
        ("dp", st.dense_params, st.trained_dense_params, 1, 1, st.dense_layers + st.moe_layers),
        ("dp-experts", st.expert_params, st.trained_expert_params, ep, fold, st.moe_layers),
    ):
        g_shard, g_full = shard * widen // gcd(shard * widen, ep_div), full * widen // gcd(full * widen, ep_div)
        g_inner = where(g_shard > 1, maximum(shard_inner // gcd(shard_inner, ep_div), 1), 1)
        f_inner = maximum(full_inner // gcd(full_inner, ep_div), 1)
        out.append(
            DpPart(
                strategy=label,
                params=params,
                trained=params if trained is None else trained,  # the adapters only, under LoRA
                gather_bytes=base_gather,
                units=maximum(per_layer * layers, 1),
                issued=where(params > 0, 1, 0),
                shard_group=g_shard,
                shard_inner=minimum(g_inner, g_shard),
                full_group=g_full,
                full_inner=minimum(f_inner, g_full),
                rank_op_s=launch_s if listed else 0.0,
                copy_s_per_byte=1 / hbm_bytes_per_s if listed else 0.0,
            )
        )
    return out


def _gradient_calls(
    part: DpPart, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], *, m: Num, native: bool
) -> list[CollectiveCall]:
    """Gradient reduction: ZeRO-0's all-reduce, ZeRO-1/2/3's reduce-scatter, HSDP's all-reduce over replicas."""
    zero, ep = lay.zero, lay.ep  # type: ignore[attr-defined]
    shard_p, rep_p = pl["dp_shard"], pl["dp_replicate"]
    grads = part.trained * work.precision.grad_bytes
    every_mb = zero >= ZeroStage.GRADIENTS
    # natively, DDP's buckets carry the dense gradients, and the experts' too unless EP owns them; FSDP2's units
    # carry ZeRO-3's reduce-scatters (torch_calls.py)
    bucketed = native & ((ep == 1) | (part.strategy == "dp"))
    # natively FSDP2's units carry ZeRO-2 too, unless it is DeepSpeed's (zero_grad_reduce other than reduce-scatter)
    whole_model_zero3 = where(native, (zero < ZeroStage.GRADIENTS) | deepspeed_zero2(zero, work, native=native), True)
    rs_count = where(zero == ZeroStage.OPTIMIZER, 1, where(every_mb & whole_model_zero3, m * part.units, 0))
    # ZeRO-1/2's reductions as the stack issues them: one reduce-scatter, all-reduced buckets, or a reduce per rank
    mode = work.conditions.zero_grad_reduce
    zero12 = where((zero == ZeroStage.OPTIMIZER) | (zero == ZeroStage.GRADIENTS), rs_count, 0)
    if mode is not ZeroGradReduce.REDUCE_SCATTER:
        rs_count = rs_count - zero12
    # DeepSpeed 0.3 without contiguous gradients all-reduces each bucket of ZeRO-3's gradients instead
    bucket_ar = work.conditions.zero3_grad_reduce is Zero3GradReduce.ALL_REDUCE
    zero3_ar = (zero == ZeroStage.PARAMETERS) & whole_model_zero3 if bucket_ar else False
    calls = [
        _call(
            part.strategy,
            Collective.ALL_REDUCE,
            shard_p,
            cl,
            phase="backward",
            size=grads,
            per_micro_batch=False,
            count=part.issued * where(bucketed, 0, where(zero == ZeroStage.NONE, 1, 0)),
            group=part.full_group,
            inner=part.full_inner,
        ),
        _call(
            part.strategy,
            Collective.REDUCE_SCATTER,
            shard_p,
            cl,
            phase="backward",
            size=grads / part.units,
            per_micro_batch=every_mb,
            count=part.issued * (where(zero3_ar, 0, rs_count) if bucket_ar else rs_count),
            group=part.shard_group,
            inner=part.shard_inner,
            host_s=where(
                zero == ZeroStage.PARAMETERS,
                listed_host_s(part, size=grads / part.units, passes=REDUCE_SCATTER_PASSES),
                0.0,
            ),
        ),
        _call(
            part.strategy,
            Collective.ALL_REDUCE,
            rep_p,
            cl,
            phase="backward",
            size=grads / part.shard_group,
            per_micro_batch=False,
            count=part.issued * where((zero > ZeroStage.NONE) & (rep_p.size > 1), 1, 0),
        ),
    ]
    if bucket_ar:
        calls.append(_bucket_all_reduce(part, cl, shard_p, grads=grads, count=where(zero3_ar, m * part.units, 0)))
    if mode is not ZeroGradReduce.REDUCE_SCATTER:
        calls.append(_zero12_reduction(part, cl, shard_p, mode=mode, grads=grads, count=zero12, every_mb=every_mb))
    return calls


def deepspeed_zero2(zero: Num, work: Workload, *, native: bool) -> Num:
    """ZeRO-2 under a PyTorch-native stack that reduces as DeepSpeed does (``zero_grad_reduce`` all-reduce or reduce):
    the parameters stay whole through forward and backward and are gathered once after the step, where FSDP's
    SHARD_GRAD_OP (the native default) gathers each unit in every forward."""
    if not native or torch_calls.fsdp_zero2(work):
        return False
    return zero == ZeroStage.GRADIENTS


def _zero12_reduction(
    part: DpPart, cl: Cluster, shard_p: AxisPlacement, *, mode: ZeroGradReduce, grads: Num, count: Num, every_mb: Num
) -> CollectiveCall:
    """ZeRO-1/2's gradients reduced as DeepSpeed's stage_1_and_2.py does: buckets all-reduced whole (twice a
    reduce-scatter's bus bytes), or one reduce per destination rank, D calls of 1/D of the gradients, each a ring's
    D - 1 hops (priced as a reduce-scatter of that slice: the same hops, (D - 1)/D of its bytes). The D reduces of
    ZeRO-1's once-a-step reduction are listed as issued every micro-batch so that step_time hides all of them, not
    one, behind the backward (its once-a-step calls count one call each): exact with one micro-batch a step, a
    backward's worth too hidden for each further one."""
    per_rank = mode is ZeroGradReduce.REDUCE
    return _call(
        part.strategy,
        Collective.REDUCE_SCATTER if per_rank else Collective.ALL_REDUCE,
        shard_p,
        cl,
        phase="backward",
        size=grads / part.shard_group if per_rank else grads,
        per_micro_batch=every_mb | per_rank,
        count=part.issued * count * (part.shard_group if per_rank else 1),
        group=part.shard_group,
        inner=part.shard_inner,
    )


def _bucket_all_reduce(part: DpPart, cl: Cluster, shard_p: AxisPlacement, *, grads: Num, count: Num) -> CollectiveCall:
    """DeepSpeed 0.3's ZeRO-3 gradient bucket, all-reduced whole over the shard group (``count`` per step), its
    flattening, division and copy back on the host side at HBM speed (``BUCKET_PASSES``)."""
    hbm_bytes_per_s = cl.gpu.hbm_bandwidth_bytes_per_s * cl.gpu.calibration.hbm_efficiency
    return _call(
        part.strategy,
        Collective.ALL_REDUCE,
        shard_p,
        cl,
        phase="backward",
        size=grads / part.units,
        count=part.issued * count,
        group=part.shard_group,
        inner=part.shard_inner,
        host_s=BUCKET_PASSES * grads / part.units / hbm_bytes_per_s,
    )


def _parameter_calls(
    part: DpPart, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], *, m: Num, native: bool
) -> list[CollectiveCall]:
    """Parameter gathers: ZeRO-1/2's after the step (in FP8 with ``fp8_all_gather``; exposed whole under a
    PyTorch-native engine, which gathers inside the optimizer step); ZeRO-3's before each unit's forward and backward
    (and again before its recomputed forward when each matrix is fetched on its own)."""
    zero = lay.zero  # type: ignore[attr-defined]
    zero3 = (zero == ZeroStage.PARAMETERS) & where(native, False, True)
    by_matrix = work.conditions.zero3_unit is not Zero3Unit.LAYER
    regather = (lay.recompute == Recompute.FULL) & by_matrix  # type: ignore[attr-defined]
    sharded = dict(group=part.shard_group, inner=part.shard_inner)
    shard_p = pl["dp_shard"]
    return [
        _call(
            part.strategy,
            Collective.ALL_GATHER,
            shard_p,
            cl,
            phase="step",
            # the updated parameters, only what trains; in FP8 where the parameter buffer holds FP8 weights
            # (Megatron's --fp8-param-gather: the distributed optimizer casts its shard and gathers 1 byte each)
            size=part.trained * gather_bytes(work.precision, fp8=work.conditions.fp8_all_gather),
            per_micro_batch=False,
            # natively ZeRO-2 is FSDP2 without resharding after forward: its units gather in forward (torch_calls)
            count=part.issued
            * where(
                (zero == ZeroStage.OPTIMIZER)
                | ((zero == ZeroStage.GRADIENTS) & (not native))
                | deepspeed_zero2(zero, work, native=native),
                1,
                0,
            ),
            # a PyTorch-native engine gathers inside optimizer.step(), before the next forward can start (DeepSpeed
            # stage_1_and_2.py step: all_gather_dp_groups; torch's ZeroRedundancyOptimizer.step: _sync_params);
            # Megatron's distributed optimizer can gather bucket by bucket in the next forward (--overlap-param-gather)
            overlappable=not native,
            **sharded,
        ),
        *(
            _call(
                part.strategy,
                Collective.ALL_GATHER,
                shard_p,
                cl,
                phase=phase,
                size=part.params * part.gather_bytes / part.units,
                count=part.issued * where(zero3, m * part.units * passes, 0),
                host_s=listed_host_s(part, size=part.params * part.gather_bytes / part.units, passes=GATHER_PASSES),
                **sharded,
            )
            for phase, passes in (("forward", 1), ("backward", where(regather, 2, 1)))
        ),
    ]


def _persistent_call(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, shard_p: AxisPlacement, st: StageShape, part: DpPart
) -> CollectiveCall:
    """DeepSpeed 0.3's regather of the persistent parameters at the end of every optimizer step: one list
    all_gather, then the host unflattens it a parameter and a rank at a time (core/comm/persistent.py), one launch
    gap per tensor operation, with the device idle until the step returns."""
    zero3 = lay.zero == ZeroStage.PARAMETERS  # type: ignore[attr-defined]
    regather = persistent_regather(
        model, work.framework, dense_layers=st.dense_layers, moe_layers=st.moe_layers, head=bool(st.head),
        group=part.shard_group,
    )  # fmt: skip
    size = regather.elements * gather_bytes(work.precision)
    return _call(
        part.strategy,
        Collective.ALL_GATHER,
        shard_p,
        cl,
        phase="step",
        size=size,
        per_micro_batch=False,
        count=part.issued * where(zero3 & (part.shard_group > 1), 1, 0),
        host_s=listed_host_s(part, size=size, passes=0) + regather.host_ops * part.rank_op_s,
        group=part.shard_group,
        inner=part.shard_inner,
    )


def dp_calls(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], st: StageShape
) -> list[CollectiveCall]:
    """Gradient and parameter traffic of data parallelism and ZeRO, for dense and expert parameters.

    PyTorch-native training replaces the whole-model volumes of ZeRO-0 (DDP's buckets) and ZeRO-3 (FSDP2's
    units) with torch_calls.py's exact ones.
    """
    native = PATTERNS[work.framework].torch_native
    calls: list[CollectiveCall] = []
    for part in _parts(model, lay, work, cl, pl, st):
        calls += _gradient_calls(part, lay, work, cl, pl, m=st.micro_batches, native=native)
        calls += _parameter_calls(part, lay, work, cl, pl, m=st.micro_batches, native=native)
        if part.strategy == "dp" and work.conditions.zero3_unit is Zero3Unit.PARAMETER and not native:
            calls.append(_persistent_call(model, lay, work, cl, pl["dp_shard"], st, part))
    if native:
        shard_p, rep_p, cp_p = pl["dp_shard"], pl["dp_replicate"], pl["cp"]
        shard, shard_inner = shard_p.size * cp_p.size, shard_p.inner * cp_p.inner
        full, full_inner = shard * rep_p.size, shard_inner * rep_p.inner
        inner = minimum(shard_inner, shard)
        calls += torch_calls.fsdp_calls(model, lay, work, cl, shard_p, st, group=shard, inner=inner)
        calls += torch_calls.ddp_calls(model, lay, work, cl, shard_p, st, group=full, inner=minimum(full_inner, full))
    return calls
