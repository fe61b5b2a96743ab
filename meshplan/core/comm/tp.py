"""Tensor parallelism: two all-reduces per layer forward and two backward (Shoeybi et al. 2019, Sec. 3); with
sequence parallelism an all-gather and a reduce-scatter in their place (Korthikanti et al. 2022, Sec. 4.2.2);
full recompute repeats the forward ones, torchtitan's selective policies the ones they do not save."""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.core.comm.call import CollectiveCall, StageShape
from meshplan.core.comm.call import make_call as _call
from meshplan.core.comm.cost import Collective
from meshplan.core.comm.patterns import PATTERNS
from meshplan.core.num import Num, where
from meshplan.core.placement import AxisPlacement
from meshplan.core.pytorch import collectives as torch_calls
from meshplan.spec.cluster import Cluster
from meshplan.spec.conditions import Fp8Recipe, Selective
from meshplan.spec.layout import Recompute
from meshplan.spec.model import MlpKind, ModelSpec
from meshplan.spec.workload import Framework, Workload
from meshplan.units import DType


def column_parallel_inputs(model: ModelSpec, framework: Framework) -> int:
    """Input gradients TP all-reduces per layer in backward (reduce-scatters under SP with Megatron)."""
    if PATTERNS[framework].fused_column_inputs:
        return 2
    attention = 2 if model.mla is not None else 3  # MLA: wq (or wq_b) and wkv_b
    return attention + (2 if model.mlp is MlpKind.GATED else 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class TpCounts:
    """What every TP collective of one step shares: its buffer and how many of each kind a GPU issues."""

    size: Num
    """b s h activations of one micro-batch, in the activation dtype (the SP-gathered buffer)."""
    gather_size: Num
    """The same buffer as the forward's all-gathers move it (FP8 under torchao's Float8 tensorwise TP)."""
    per_step: Num
    """Layers x micro-batches."""
    forward: Num
    """Forward collectives of one kind: 2 per layer, 4 with full recompute, x micro-batches."""
    inputs: int
    """Column-parallel inputs per layer whose gradients backward reduces."""
    regather: int
    """Backward re-gathers of SP-sharded inputs per layer (for the weight gradients)."""
    replayed: Num
    """Forward all-gathers (all-reduces without SP) a selective policy runs again in backward, per step."""
    replayed_scatters: Num
    """Forward reduce-scatters a selective policy runs again in backward, per step."""


def gather_bytes_per_element(work: Workload) -> float:
    """Bytes per element the forward's SP all-gathers move: 1 where torchtitan's Float8 tensorwise TP casts the
    input to FP8 before gathering it (torchao Float8ColwiseParallel and PrepareFloat8ModuleInput, applied for
    every per-tensor recipe, never rowwise), else the activation dtype's."""
    cond = work.conditions
    per_tensor = cond.fp8_recipe not in (Fp8Recipe.ROWWISE, Fp8Recipe.MXFP8)
    if PATTERNS[work.framework].torch_native and work.precision.compute is DType.FP8 and per_tensor:
        return 1.0
    return work.precision.activation_bytes


def selective_replays(lay: object, work: Workload) -> tuple[Num, Num]:
    """(all-gathers, reduce-scatters) of one layer's forward that ``--recompute selective`` runs again in
    backward, per micro-batch; without SP the first is the forward all-reduces.

    torchtitan's per-op policy saves the reduce-scatter outputs (on its save list) but not the all-gathered
    inputs of wq, wk, wv and w1, w3, which the weight gradients need: both all-gathers run again (2, 0).
    Without SP its backward runs the attention output's all-reduce again, whose sum the MLP norm's recomputed
    input needs; the MLP's, the block output, is not needed (1, 0). Its per-layer policy recomputes every
    second layer whole (1, 1). Megatron's selective and module recompute repeat no TP collective. Measured by
    ``meshplan check`` (tp_sac_op, sp_sac_op)."""
    recompute, sp = lay.recompute, lay.sp  # type: ignore[attr-defined]
    selective = recompute == Recompute.SELECTIVE
    policy = work.conditions.selective
    if not PATTERNS[work.framework].torch_native or policy not in (Selective.OP, Selective.LAYER):
        return 0.0, 0.0
    if policy is Selective.LAYER:
        return where(selective, 1.0, 0.0), where(selective, 1.0, 0.0)
    return where(selective, where(sp, 2.0, 1.0), 0.0), 0.0


def _no_sp_calls(k: TpCounts, p: AxisPlacement, cl: Cluster, work: Workload, off: Num) -> list[CollectiveCall]:
    """Without SP: the row-parallel outputs' all-reduces forward, the column-parallel inputs' backward."""
    return [
        _call("tp", Collective.ALL_REDUCE, p, cl, phase="forward", size=k.size, count=off * k.forward,
              overlappable=work.overlap.tp),
        _call("tp", Collective.ALL_REDUCE, p, cl, phase="backward", size=k.size, count=off * k.inputs * k.per_step,
              overlappable=work.overlap.tp_backward),
        _call("tp", Collective.ALL_REDUCE, p, cl, phase="backward", size=k.size, count=off * k.replayed,
              overlappable=work.overlap.tp),
    ]  # fmt: skip


def _sp_calls(k: TpCounts, p: AxisPlacement, cl: Cluster, work: Workload, on: Num) -> list[CollectiveCall]:
    """With SP: all-gathers before and reduce-scatters after each matmul pair, forward and backward. The
    row-parallel output gradient's all-gather overlaps its dgrad GEMM only under comm-GEMM overlap (Transformer
    Engine's userbuffers ring exchange for proj_dgrad and fc2_dgrad, module/base.py initialize_ub; PyTorch's
    async TP); Megatron's plain SP path gathers it before the GEMM."""
    with_gemm, behind_wgrad = work.overlap.tp, work.overlap.tp_backward

    def call(op: Collective, phase: str, count: Num, overlappable: bool, size: Num | None = None) -> CollectiveCall:
        size = k.size if size is None else size
        return _call("sp", op, p, cl, phase=phase, size=size, count=on * count, overlappable=overlappable)

    return [
        call(Collective.ALL_GATHER, "forward", k.forward, with_gemm, k.gather_size),
        call(Collective.REDUCE_SCATTER, "forward", k.forward, with_gemm),
        call(Collective.ALL_GATHER, "backward", 2 * k.per_step, with_gemm),  # the row-parallel output gradient
        call(Collective.ALL_GATHER, "backward", k.regather * k.per_step, behind_wgrad),
        call(Collective.REDUCE_SCATTER, "backward", 2 * k.per_step, behind_wgrad),
        call(Collective.ALL_GATHER, "backward", k.replayed, with_gemm, k.gather_size),  # before their matmuls
        call(Collective.REDUCE_SCATTER, "backward", k.replayed_scatters, with_gemm),
    ]


def tp_calls(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], st: StageShape
) -> list[CollectiveCall]:
    """TP per layer and micro-batch (Megatron's pattern; ``PATTERNS`` for the others).

    Without SP: two all-reduces forward (after the attention and MLP
    row-parallel matmuls) and two backward (input gradients of the two
    column-parallel matmuls, overlapped with the weight gradients). With SP:
    forward all-gathers before the column-parallel and reduce-scatters after
    the row-parallel matmuls; backward, the row-parallel side all-gathers its
    output gradient (blocking unless comm-GEMM overlap is on), and the column-parallel side all-gathers its
    input again for the weight gradient and reduce-scatters the input
    gradient (both overlapped). Full recompute repeats the forward ones.
    """
    sp, recompute = lay.sp, lay.recompute  # type: ignore[attr-defined]
    pattern = PATTERNS[work.framework]
    per_step = (st.dense_layers + st.moe_layers) * st.micro_batches
    replayed, replayed_scatters = selective_replays(lay, work)
    counts = TpCounts(
        size=st.tokens * model.hidden * work.precision.activation_bytes,
        gather_size=st.tokens * model.hidden * gather_bytes_per_element(work),
        per_step=per_step,
        forward=(2 + where(recompute == Recompute.FULL, 2, 0)) * per_step,
        inputs=column_parallel_inputs(model, work.framework),
        regather=2 if pattern.sp_regathers_inputs else 0,
        replayed=replayed * per_step,
        replayed_scatters=replayed_scatters * per_step,
    )
    p = pl["tp"]
    calls = _no_sp_calls(counts, p, cl, work, where(sp, 0, 1)) + _sp_calls(counts, p, cl, work, where(sp, 1, 0))
    if pattern.torch_native:
        calls += torch_calls.tp_edge_calls(model, lay, work, cl, pl, st)
        calls += torch_calls.partial_norm_calls(model, lay, work, cl, pl, st)
    return calls
