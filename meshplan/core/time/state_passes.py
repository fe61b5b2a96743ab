"""The step's passes over this GPU's weights and state outside the layers' kernels: the optimizer step, streamed
at HBM speed, and the separate gradient-accumulation pass when the weight-gradient GEMM does not accumulate."""

from __future__ import annotations

from meshplan.core.comm import StageShape
from meshplan.core.memory.bill import moment_bytes_per_param, shard_degrees
from meshplan.core.memory.stage_params import StageParams
from meshplan.core.num import Num, where
from meshplan.spec.cluster import Cluster
from meshplan.spec.layout import LayoutLike, ZeroStage
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Framework, Workload

GRAD_ACCUMULATION_PASSES = 3
"""Autograd's AccumulateGrad adds a micro-batch's weight gradient into ``.grad`` in place: read both, write one."""


def grad_accumulation_s(shape: StageShape, work: Workload, cluster: Cluster, *, m: Num) -> Num:
    """Per micro-batch (averaged over the step), the separate pass that adds each micro-batch's weight gradients
    after the first into the parameters' ``.grad`` when Megatron's weight-gradient GEMM does not accumulate
    them itself (``Conditions.grad_accum_fusion`` off): 3 passes over this GPU's trained weights of the stage in
    the parameters' dtype, at the kind's share of HBM bandwidth, m - 1 times a step. Fused (Megatron-Core's
    default) the GEMM reads and writes the accumulator in place of writing a fresh gradient, inside its own
    compute-bound time: nothing more is counted."""
    if work.framework is not Framework.MEGATRON or work.conditions.grad_accum_fusion:
        return 0.0
    gpu = cluster.gpu
    weights = shape.trained_dense_params + shape.trained_expert_params
    one_pass = GRAD_ACCUMULATION_PASSES * work.precision.weight_bytes * weights
    return (m - 1) / m * one_pass / (gpu.hbm_bandwidth_bytes_per_s * gpu.calibration.hbm_efficiency)


def optimizer_time(model: ModelSpec, lay: LayoutLike, work: Workload, cluster: Cluster, held: StageParams) -> Num:
    """The optimizer step over this GPU's shard, streamed at HBM speed.

    Per parameter: gradients read three times (overflow check, global norm,
    update) and zeroed once; master weights read, written and read again to
    refresh the 16-bit weights, which are written; moments read and written.
    """
    prec = work.precision
    shard, expert_shard = shard_degrees(dp_shard=lay.dp_shard, cp=lay.cp, ep=lay.ep, tp=lay.tp, etp=lay.etp)
    on = lay.zero >= ZeroStage.OPTIMIZER
    n = held.dense / where(on, shard, 1) + held.experts / where(on, expert_shard, 1)
    master = prec.master_bytes if prec.master is not None else prec.weight_bytes
    per_param = 4 * prec.grad_bytes + 3 * master + 2 * moment_bytes_per_param(model, work) + prec.weight_bytes
    gpu = cluster.gpu
    return n * per_param / (gpu.hbm_bandwidth_bytes_per_s * gpu.calibration.hbm_efficiency)
