"""Step time = compute (at least the host's pace: host.py) + exposed communication + bubble + optimizer + host.

Per micro-batch, a pipeline stage spends forward and backward compute
(compute.py) plus the TP, CP and EP collectives that compute cannot hide:
forward TP traffic is on the critical path unless TP overlap is on; the
backward all-reduce of input gradients hides behind the weight-gradient
matmul; ring CP hides each K/V block behind attention; EP all-to-alls are
exposed unless overlapped. The pipeline runs m micro-batches plus a bubble:
(p-1)(t_f + t_b) for GPipe and 1F1B, divided by v when interleaved
(Narayanan et al. 2021 Sec. 2.2), (p-1) t_f for ZB-H1 and (p/2-1)(t_f+t_b)
for DualPipe (DeepSeek-V3 Table 2, with W = t_b/2). Data-parallel traffic
hides behind the last micro-batch's backward (ZeRO-0/1), every backward
(ZeRO-2/3 reduce-scatters), and every forward (ZeRO-3 prefetch), up to the
compute it overlaps. The optimizer step streams the sharded state at HBM speed.
The host's step overhead is the cluster's own (``Cluster.step_overhead_s``: 0
unless a fitted profile sets it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from meshplan.core import finetune, pipeline
from meshplan.core.comm import CollectiveCall, StageShape, dp_calls, model_parallel_calls
from meshplan.core.comm.cost import Collective
from meshplan.core.groups import DATA_PARALLEL_SPLIT, model_parallel_groups, spread, take_rows
from meshplan.core.memory.bill import candidates, stage_training
from meshplan.core.memory.stage_params import StageParams, layout_stage_params
from meshplan.core.num import Num, like, maximum, minimum, to_float, where
from meshplan.core.params import ParamCount
from meshplan.core.placement import AxisPlacement
from meshplan.core.time.flops import (
    attention_flops_per_token,
    executed_attention_flops_per_token,
    matmul_flops_per_token,
    model_flops_per_token,
)
from meshplan.core.time.stage_time import StageTimes, fsdp_shards, stage_times
from meshplan.core.time.state_passes import grad_accumulation_s, optimizer_time
from meshplan.spec.cluster import Cluster
from meshplan.spec.layout import LayoutLike, Recompute, Schedule
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Framework, Workload
from meshplan.units import DTYPE_BYTES, DType


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTime:
    """Where the time of one optimizer step goes, and what it buys."""

    compute_s: Num
    exposed_comm_s: Num
    bubble_s: Num
    optimizer_s: Num
    host_s: Num
    """Host-side time per step no GPU term prices (``Cluster.step_overhead_s``)."""
    exposed_tp_s: Num
    exposed_cp_s: Num
    exposed_ep_s: Num
    exposed_pp_s: Num
    exposed_dp_s: Num
    model_flops_per_step: Num
    """6 N + the causal attention per token, no recompute (``flops.MFU_CONVENTION``)."""
    hardware_flops_per_step: Num
    """What the kernels execute: recompute included, the attention as the kernel runs it."""
    tokens_per_step: Num
    num_gpus: Num
    bf16_peak_flops: float
    """The GPU's dense bf16 peak: MFU's and HFU's denominator whatever the matmuls' dtype."""
    fp8_peak_flops: float | None = None
    """The GPU's dense FP8 peak, for a run with FP8 matmuls (None otherwise)."""
    host_layer_s: Num = 0.0
    """Host seconds to issue a layer's kernels, one micro-batch, all passes (core/time/host.py; in ``compute_s``)."""
    gpu_layer_s: Num = 0.0
    """GPU seconds of that layer's work, before the floor: the step is host-bound where the host's are the more."""

    @property
    def step_time_s(self) -> Num:
        return self.compute_s + self.exposed_comm_s + self.bubble_s + self.optimizer_s + self.host_s

    @property
    def mfu(self) -> Num:
        """Model FLOPs per second (6N plus causal attention, no recompute) over the fleet's dense bf16 peak."""
        return self.model_flops_per_step / (self.step_time_s * self.num_gpus * self.bf16_peak_flops)

    @property
    def hfu(self) -> Num:
        """Hardware FLOPs (recompute included, attention as executed) per second over the fleet's dense bf16 peak."""
        return self.hardware_flops_per_step / (self.step_time_s * self.num_gpus * self.bf16_peak_flops)

    @property
    def mfu_fp8_peak(self) -> Num | None:
        """Model FLOPs per second over the fleet's dense FP8 peak, for FP8 matmuls (None otherwise)."""
        if self.fp8_peak_flops is None:
            return None
        return self.model_flops_per_step / (self.step_time_s * self.num_gpus * self.fp8_peak_flops)

    @property
    def tokens_per_s_per_gpu(self) -> Num:
        return self.tokens_per_step / (self.step_time_s * self.num_gpus)


def _bubble(schedule: Num, *, pp: Num, vpp: Num, t_f: Num, t_b: Num) -> Num:
    """Idle time of the slowest stage: (p-1)(t_f + t_b), over v when interleaved, (p-1) t_f for ZB-H1."""
    slot = t_f + t_b
    one_f_one_b = (pp - 1) * slot
    out = where(schedule == Schedule.INTERLEAVED, one_f_one_b / vpp, one_f_one_b)
    out = where(schedule == Schedule.ZERO_BUBBLE, (pp - 1) * t_f, out)
    return where(schedule == Schedule.DUALPIPE, maximum(pp / 2 - 1, 0) * slot, out)


def _hidden(comm: Num, behind: Num, on: bool, efficiency: float) -> Num:
    """Exposed part of ``comm`` run beside ``behind`` seconds of compute (all of it when off).

    What exceeds the compute is exposed, and of the overlapped part a share
    (1 - efficiency) still shows: communication kernels slow the matmuls.
    """
    if not on:
        return comm
    return maximum(comm - behind, 0.0) + (1 - efficiency) * minimum(comm, behind)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageStep:
    """The slowest stage's share of a step: per micro-batch times and per-step exposed traffic."""

    fwd_s: Num
    bwd_s: Num
    compute_s: Num
    tp_s: Num
    cp_s: Num
    ep_s: Num
    pp_s: Num
    dp_s: Num
    optimizer_s: Num
    calls: list[CollectiveCall]
    host_layer_s: Num = 0.0
    gpu_layer_s: Num = 0.0
    exposed: dict[str, Num] = dataclasses.field(default_factory=dict)
    """Per micro-batch exposed TP, CP and EP by phase (``tp_f``, ``tp_b``, ...), inside ``fwd_s`` and ``bwd_s``."""
    chunk_s: Num = 0.0
    """Per micro-batch, the host sync after each pipeline send, inside each of ``fwd_s`` and ``bwd_s``."""


def _stage_shape(
    model: ModelSpec,
    params: ParamCount,
    lay: LayoutLike,
    work: Workload,
    *,
    stages: tuple[Num, ...],
    times: StageTimes,
    copies: int,
    m: Num,
) -> StageShape:
    """What the collectives of the slowest stage move: its layers and the largest parameter counts over
    ``stages`` (an upper bound of the slowest stage when different stages set different terms)."""
    held = [layout_stage_params(params, model, lay, work, stage=s) for s in stages]
    training = [stage_training(model, params, lay, work, stage=s, held=h) for s, h in zip(stages, held, strict=True)]

    def most(name: str) -> Num:
        out = getattr(training[0], name)
        for tr in training[1:]:
            out = maximum(out, getattr(tr, name))
        return out

    ft = work.finetune
    return StageShape(
        tokens=work.seq_len / lay.cp * lay.micro_batch,
        dense_layers=times.dense_layers * copies,
        moe_layers=times.moe_layers * copies,
        micro_batches=m,
        dense_params=most("base_dense"),
        expert_params=most("base_experts"),
        trained_dense_params=most("train_dense"),
        trained_expert_params=most("train_experts"),
        base_gather_bytes=finetune.base_bytes_per_param(ft)
        if finetune.quantized_base(ft)
        else (DTYPE_BYTES[DType.FP8] if work.conditions.fp8_all_gather else None),
        embedding=True,  # the embedding's and the head's PyTorch-native collectives: an upper bound over stages
        head=True,
    )


def _exposed_per_micro_batch(
    calls: list[CollectiveCall],
    times: StageTimes,
    *,
    copies: int,
    m: Num,
    cluster: Cluster,
    work: Workload,
    lay: LayoutLike,
) -> dict[str, Num]:
    """Per micro-batch TP, CP and EP traffic left exposed by the compute each hides behind, by phase.

    Forward TP traffic hides behind half the weight-gradient time, backward behind all of it; CP's block sends
    behind the attention core (the recomputed forward's too under full recompute), PyTorch's all-gathered K/V
    behind the first of the cp blocks alone; EP behind the whole forward or backward.
    """
    cal = cluster.gpu.calibration
    eff = cal.overlap_efficiency

    def per_mb(strategies: tuple[str, ...], phase: str, overlappable: bool, ops: tuple[Collective, ...] = ()) -> Num:
        total: Num = 0.0
        for c in calls:
            if c.strategy in strategies and c.phase == phase and (not ops or c.op in ops):
                total = total + where(c.overlappable == overlappable, c.time_s, 0.0)
        return total / m

    def exposed(strategies: tuple[str, ...], phase: str, behind: Num, efficiency: float = eff) -> Num:
        return per_mb(strategies, phase, False) + _hidden(per_mb(strategies, phase, True), behind, True, efficiency)

    def cp_exposed(phase: str, attention: Num) -> Num:
        sends = per_mb(("cp",), phase, True, (Collective.SEND_RECV,))
        gathers = per_mb(("cp",), phase, True, (Collective.ALL_GATHER,))
        first_block = attention / maximum(lay.cp, 1)
        hidden = _hidden(sends, attention, True, eff) + _hidden(gathers, first_block, True, eff)
        return per_mb(("cp",), phase, False) + hidden

    forwards = where(lay.recompute == Recompute.FULL, 2, 1)  # the recomputed forward exchanges K/V again

    wgrad = times.weight_grad_s * copies
    tp_eff = cal.tp_overlap_efficiency if work.overlap.tp else eff
    return {
        "tp_f": exposed(("tp", "sp"), "forward", wgrad / 2, tp_eff),
        "tp_b": exposed(("tp", "sp"), "backward", wgrad, tp_eff),
        "cp_f": cp_exposed("forward", times.attention_fwd_s * copies * forwards),
        "cp_b": cp_exposed("backward", times.attention_bwd_s * copies),
        # the experts' TP gathers sit on the dispatch path
        "ep_f": exposed(("ep", "etp"), "forward", times.fwd_compute_s * copies),
        "ep_b": exposed(("ep", "etp"), "backward", times.bwd_compute_s * copies),
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class _ModelParallelStep:
    """The slowest stage's micro-batch with its TP, CP, EP and PP traffic: all a step needs but the data-parallel
    part (which alone reads the ZeRO stage and the split of the data-parallel ranks)."""

    times: StageTimes
    shape: StageShape
    calls: list[CollectiveCall]
    exposed: dict[str, Num]
    fwd_s: Num
    bwd_s: Num
    pp_s: Num
    chunk_s: Num = 0.0
    accumulate_s: Num = 0.0
    """Per micro-batch, the separate gradient-accumulation pass (in ``bwd_s``; state_passes.py)."""


def _model_parallel_step(
    model: ModelSpec,
    params: ParamCount,
    lay: LayoutLike,
    work: Workload,
    cluster: Cluster,
    placement: dict[str, AxisPlacement],
) -> _ModelParallelStep:
    """Per micro-batch compute of the slowest stage, its exposed TP, CP and EP traffic, and its pipeline sends.

    Each term takes its maximum over the stages, found on the stage table's candidates (``memory.candidates``).
    """
    m = pipeline.micro_batches(work.global_batch, micro_batch=lay.micro_batch, dp=lay.dp_replicate * lay.dp_shard)
    copies = pipeline.stage_copies(lay.schedule)
    stages = candidates(model, lay, work)
    times = stage_times(model, lay, work, cluster, stages=stages)
    shape = _stage_shape(model, params, lay, work, stages=stages, times=times, copies=copies, m=m)
    calls = model_parallel_calls(model, lay, work, cluster, placement, shape)
    x = _exposed_per_micro_batch(calls, times, copies=copies, m=m, cluster=cluster, work=work, lay=lay)
    fwd_c, bwd_c = times.fwd_compute_s * copies, times.bwd_compute_s * copies
    cal = cluster.gpu.calibration
    # the fixed chunk cost is the host synchronize after each send (Megatron-LM's batch_isend_irecv path)
    synced = np.logical_or(_sends_block(lay, ov_pp=work.overlap.pp), work.conditions.pp_host_sync)
    chunk = where((lay.pp > 1) & synced, lay.vpp * cal.pipeline_step_overhead_s, 0.0)
    pp_s = _pp_exposed(calls, lay=lay, m=m, ov_pp=work.overlap.pp, efficiency=cal.overlap_efficiency)
    pp_s = pp_s + sum((c.time_s for c in calls if c.strategy == "pp" and c.op is Collective.ALL_REDUCE), 0.0)
    accumulate = copies * grad_accumulation_s(shape, work, cluster, m=m)
    return _ModelParallelStep(
        times=times,
        shape=shape,
        calls=calls,
        exposed=x,
        fwd_s=fwd_c + x["tp_f"] + x["cp_f"] + x["ep_f"] + chunk,
        bwd_s=bwd_c + accumulate + x["tp_b"] + x["cp_b"] + x["ep_b"] + chunk,
        pp_s=pp_s + 2 * m * chunk,
        chunk_s=chunk,
        accumulate_s=accumulate,
    )


def _grouped_model_parallel_step(
    model: ModelSpec,
    params: ParamCount,
    lay: LayoutLike,
    work: Workload,
    cluster: Cluster,
    placement: dict[str, AxisPlacement],
    *,
    calls: bool,
) -> _ModelParallelStep:
    """``_model_parallel_step``, on a large batch once per group of layouts equal in every field it reads (all
    but the ZeRO stage and the split of the data-parallel ranks, with the placement of every other axis)."""
    read = [p for axis, p in placement.items() if axis not in DATA_PARALLEL_SPLIT]
    extra = [getattr(p, k) for p in read for k in ("size", "stride", "inner", "outer")]
    if work.framework is Framework.TORCH or work.conditions.fsdp_copies:
        extra.append(fsdp_shards(lay))  # the Partial norm gradients' all-reduces and FSDP2's copies ask it
    groups = model_parallel_groups(lay, extra)
    if groups is None:
        return _model_parallel_step(model, params, lay, work, cluster, placement)
    n = int(np.size(lay.tp))
    one = take_rows(lay, groups.first, n)
    step = _model_parallel_step(model, params, one, work, cluster, take_rows(placement, groups.first, n))
    if not calls:  # their times are in the step's terms already: copying them back is for reports only
        step = dataclasses.replace(step, calls=[])
    return spread(step, groups)  # type: ignore[no-any-return]


def stage_step(
    model: ModelSpec,
    params: ParamCount,
    lay: LayoutLike,
    work: Workload,
    cluster: Cluster,
    placement: dict[str, AxisPlacement],
    *,
    m: Num,
    calls: bool,
) -> StageStep:
    """Per micro-batch compute and exposed traffic of the slowest stage, and its per-step traffic (``calls``:
    with the collectives; without, ``StageStep.calls`` is empty)."""
    mp = _grouped_model_parallel_step(model, params, lay, work, cluster, placement, calls=calls)
    shape, x = mp.shape, mp.exposed
    data = dp_calls(model, lay, work, cluster, placement, shape)
    sharded = StageParams(
        dense=shape.trained_dense_params,
        experts=shape.trained_expert_params,
        largest_layer=0,
        dense_layers=0,
        moe_layers=0,
    )
    eff = cluster.gpu.calibration.overlap_efficiency
    copies = pipeline.stage_copies(lay.schedule)
    return StageStep(
        fwd_s=mp.fwd_s,
        bwd_s=mp.bwd_s,
        compute_s=mp.times.fwd_compute_s * copies + mp.times.bwd_compute_s * copies + mp.accumulate_s,
        tp_s=x["tp_f"] + x["tp_b"],
        cp_s=x["cp_f"] + x["cp_b"],
        ep_s=x["ep_f"] + x["ep_b"],
        pp_s=mp.pp_s,
        dp_s=_dp_exposed(data, fwd_s=mp.fwd_s, bwd_s=mp.bwd_s, m=m, work=work, efficiency=eff),
        optimizer_s=optimizer_time(model, lay, work, cluster, sharded),
        calls=mp.calls + data if calls else [],
        host_layer_s=mp.times.host_layer_s,
        gpu_layer_s=mp.times.gpu_layer_s,
        exposed=x,
        chunk_s=mp.chunk_s,
    )


def _sends_block(lay: LayoutLike, *, ov_pp: bool) -> Num:
    """Whether pipeline sends block the schedule: all but the interleaved schedule with overlapped sends."""
    return np.logical_not((lay.schedule == Schedule.INTERLEAVED) & ov_pp)


def _pp_exposed(calls: list[CollectiveCall], *, lay: LayoutLike, m: Num, ov_pp: bool, efficiency: float) -> Num:
    """Pipeline sends on the critical path: every slot when blocking; when overlapped, fill and drain (one
    micro-batch's way through all pp x vpp chunks and back: 2 (pp vpp - 1) sends, tests/test_pipeline_schedule.py
    replays the interleaved schedule), and of the steady-state sends run beside compute the share
    (1 - efficiency) that shows, as for every overlapped call."""
    p2p = sum((c.call_s for c in calls if c.strategy == "pp" and c.phase == "forward"), 0.0)
    pp, vpp = lay.pp, lay.vpp
    blocking = 2 * (m * vpp + pp - 1) * p2p
    overlapped = 2 * (pp * vpp - 1) * p2p + (1 - efficiency) * 2 * maximum(m - pp + 1, 0) * vpp * p2p
    return where(pp > 1, where(_sends_block(lay, ov_pp=ov_pp), blocking, overlapped), 0.0)


def _dp_exposed(
    calls: list[CollectiveCall], *, fwd_s: Num, bwd_s: Num, m: Num, work: Workload, efficiency: float
) -> Num:
    """Data-parallel and ZeRO traffic left after hiding behind the compute it overlaps.

    Once-per-step gradient traffic hides behind the last micro-batch's backward, per-micro-batch reduce-scatters and
    ZeRO-3 backward gathers behind each backward, ZeRO-3 forward gathers behind each forward (prefetch), ZeRO-1/2's
    parameter gather behind the next forward unless run inside the optimizer step (``overlappable`` False: all shows).
    """
    ov = work.overlap

    def one_call(phase: str, per_mb: bool, overlappable: bool | None = None) -> Num:
        """Per step (once-per-step calls) or per micro-batch (every call of it: ZeRO-3 issues one per layer)."""
        total: Num = 0.0
        for c in calls:
            if c.strategy in ("dp", "dp-experts") and c.phase == phase and overlappable in (None, c.overlappable):
                issued = (c.count_per_step > 0) & (c.per_micro_batch == per_mb)
                total = total + where(issued, c.time_s / m if per_mb else c.call_s, 0.0)
        return total

    exposed = _hidden(one_call("backward", False), bwd_s, ov.dp, efficiency)
    exposed = exposed + m * _hidden(one_call("backward", True), bwd_s, ov.dp, efficiency)
    exposed = exposed + _hidden(one_call("step", False, True), fwd_s, ov.param_gather, efficiency)
    exposed = exposed + one_call("step", False, False)
    return exposed + m * _hidden(one_call("forward", True), fwd_s, ov.fsdp_prefetch, efficiency)


def _hardware_flops_per_token(model: ModelSpec, lay: LayoutLike, work: Workload) -> Num:
    """The FLOPs the kernels execute per trained token: the model's, with the attention as its kernel runs it
    (``executed_attention_flops_per_token``), plus what recompute repeats: full recompute a forward (the matmuls'
    2 N, less the dense MLPs' down projections under PyTorch's early stop, and the attention's; of the first k
    layers of each stage only under ``--recompute-layers k``), selective the attention's forward."""
    span = work.attention_span
    executed = executed_attention_flops_per_token(model, seq_len=span, fused=work.attention.fused)
    model_flops = model_flops_per_token(model, seq_len=span, finetune=work.finetune)
    base = model_flops - attention_flops_per_token(model, seq_len=span) + executed
    forward = matmul_flops_per_token(model) / 3 + executed / 3
    if work.conditions.recompute_early_stop:
        forward = forward - 2 * model.hidden * model.ffn_hidden * model.num_dense_mlp_layers
    k = work.conditions.recompute_layers
    if k is not None:
        per_stage = model.num_layers / lay.pp
        forward = forward * minimum(k, per_stage) / per_stage
    return base + where(
        lay.recompute == Recompute.FULL,
        forward,
        where(lay.recompute == Recompute.SELECTIVE, executed / 3, 0.0),
    )


def step_time(
    model: ModelSpec,
    params: ParamCount,
    lay: LayoutLike,
    work: Workload,
    cluster: Cluster,
    placement: dict[str, AxisPlacement],
    *,
    calls: bool = True,
) -> tuple[StepTime, list[CollectiveCall]]:
    """Step time of a layout (or a batch of layouts) and the collectives of its slowest stage's GPU (``calls``
    False: no collectives listed, for a search that needs only the times)."""
    pp = lay.pp
    dp = lay.dp_replicate * lay.dp_shard
    m = pipeline.micro_batches(work.global_batch, micro_batch=lay.micro_batch, dp=dp)
    st = stage_step(model, params, lay, work, cluster, placement, m=m, calls=calls)
    copies = pipeline.stage_copies(lay.schedule)
    bubble = _bubble(lay.schedule, pp=pp, vpp=lay.vpp, t_f=st.fwd_s / copies, t_b=st.bwd_s / copies)
    exposed = m * (st.tp_s + st.cp_s + st.ep_s) / copies + st.pp_s + st.dp_s
    tokens = work.seq_len * work.global_batch
    model_flops = model_flops_per_token(model, seq_len=work.attention_span, finetune=work.finetune) * tokens
    gpus = dp * lay.cp * lay.tp * pp
    step = StepTime(
        compute_s=to_float(m * st.compute_s / copies),
        exposed_comm_s=to_float(exposed),
        bubble_s=to_float(bubble),
        optimizer_s=to_float(st.optimizer_s),
        host_s=like(pp, cluster.step_overhead_s),
        exposed_tp_s=to_float(m * st.tp_s / copies),
        exposed_cp_s=to_float(m * st.cp_s / copies),
        exposed_ep_s=to_float(m * st.ep_s / copies),
        exposed_pp_s=to_float(st.pp_s),
        exposed_dp_s=to_float(st.dp_s),
        model_flops_per_step=model_flops,
        hardware_flops_per_step=to_float(_hardware_flops_per_token(model, lay, work) * tokens),
        tokens_per_step=tokens,
        num_gpus=gpus,
        bf16_peak_flops=cluster.gpu.peak(DType.BF16),
        fp8_peak_flops=cluster.gpu.peak(DType.FP8) if work.precision.compute is DType.FP8 else None,
        host_layer_s=to_float(st.host_layer_s),
        gpu_layer_s=to_float(st.gpu_layer_s),
    )
    return step, st.calls
