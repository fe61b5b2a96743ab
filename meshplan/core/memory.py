"""The training memory bill of one GPU, term by term, for any hybrid layout.

Model state follows the ZeRO paper (Rajbhandari et al. 2020, Sec. 3 and 5):
2 + 2 + 12 = 16 bytes per parameter under bf16 mixed precision with Adam,
each part divided by the data-parallel shard group from the ZeRO stage that
partitions it. Activations follow Korthikanti et al. 2022 (see activations.py)
times the micro-batches a pipeline stage holds in flight (see pipeline.py).

Every function here broadcasts: the layout's degrees may be ints or numpy
arrays of candidate layouts.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from meshplan.core import activations as act
from meshplan.core import pipeline, shards
from meshplan.core.num import Num, gcd, maximum, minimum, to_float, where
from meshplan.core.params import LayerParams, ParamCount
from meshplan.spec.cluster import GpuCalibration
from meshplan.spec.layout import LayoutLike, Recompute, ZeroStage
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Framework, OptimizerKind, Workload
from meshplan.units import DTYPE_BYTES, DType

FP32_BYTES = 4.0


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBill:
    """What one GPU holds at its peak, by disjoint term (bytes)."""

    weights_bytes: Num
    gradients_bytes: Num
    master_weights_bytes: Num
    optimizer_moments_bytes: Num
    activations_bytes: Num
    logits_bytes: Num
    activation_workspace_bytes: Num
    comm_buffers_bytes: Num
    framework_bytes: Num
    fragmentation_bytes: Num

    @property
    def optimizer_bytes(self) -> Num:
        """Master weights plus optimizer moments: the state the optimizer step owns."""
        return self.master_weights_bytes + self.optimizer_moments_bytes

    @property
    def model_state_bytes(self) -> Num:
        """Weights, gradients and optimizer state (the ZeRO paper's 'model states')."""
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> Num:
        return sum(getattr(self, name) for name in TERMS)

    def as_dict(self) -> dict[str, Num]:
        """Every term, the optimizer subtotal and the total, keyed by name."""
        out = {name: getattr(self, name) for name in TERMS}
        out["optimizer_bytes"] = self.optimizer_bytes
        out["total_bytes"] = self.total_bytes
        return out


TERMS: tuple[str, ...] = tuple(f.name for f in fields(MemoryBill))


def _layer_rank_params(lp: LayerParams, model: ModelSpec, *, tp: Num, ep: Num) -> tuple[Num, Num]:
    """(dense, expert) parameters of one layer on one TP x EP rank."""
    sharded = lp.attention - lp.kv - lp.attention_replicated + lp.mlp - lp.mlp_replicated + lp.shared_experts
    kv_split = minimum(tp, model.num_kv_heads)
    dense = sharded / tp + lp.kv / kv_split + lp.attention_replicated + lp.mlp_replicated + lp.router + lp.norms
    return dense, lp.routed_experts / (ep * tp)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageParams:
    """Parameters one GPU of a pipeline stage holds before any ZeRO sharding."""

    dense: Num
    """Parameters every expert-parallel rank holds alike."""
    experts: Num
    """This rank's share of the routed experts."""
    largest_layer: Num
    """The biggest single layer on the rank (dense + expert share): what FSDP gathers at once."""
    dense_layers: Num
    moe_layers: Num


def stage_params(
    params: ParamCount, model: ModelSpec, *, tp: Num, pp: Num, ep: Num, stage: Num, copies: Num = 1
) -> StageParams:
    """Parameters on one GPU of pipeline stage ``stage`` (``copies`` = 2 under DualPipe)."""
    layers = pipeline.stage_layers(model.num_layers, pp=pp, stage=stage)
    first = pipeline.stage_first_layer(model.num_layers, pp=pp, stage=stage)
    dense_layers = minimum(maximum(params.num_dense_layers - first, 0), layers)
    moe_layers = layers - dense_layers
    d_dense, _ = _layer_rank_params(params.dense_layer, model, tp=tp, ep=ep)
    m_dense, m_expert = _layer_rank_params(params.moe_layer, model, tp=tp, ep=ep)
    dense = dense_layers * d_dense + moe_layers * m_dense
    experts = moe_layers * m_expert
    is_first, is_last = stage == 0, stage == pp - 1
    vocab_rows = model.vocab_size * model.hidden / tp
    dense = dense + where(is_first, vocab_rows + params.position_embedding, 0)
    head = where(model.tied_embeddings & (pp == 1), 0, vocab_rows)  # tied and pp > 1: the last stage keeps a copy
    dense = dense + where(is_last, head + params.final_norm, 0)
    if model.mtp_layers:
        mtp_dense = model.mtp_layers * (m_dense + 2 * model.hidden**2 / tp + 3 * model.norm_params)
        dense = dense + where(is_last, mtp_dense, 0)
        experts = experts + where(is_last, model.mtp_layers * m_expert, 0)
    largest = maximum(where(dense_layers > 0, d_dense, 0), where(moe_layers > 0, m_dense + m_expert, 0))
    return StageParams(
        dense=dense * copies,
        experts=experts * copies,
        largest_layer=largest,
        dense_layers=dense_layers * copies,
        moe_layers=moe_layers * copies,
    )


def moment_bytes_per_param(model: ModelSpec, workload: Workload) -> float:
    """Optimizer-moment bytes per parameter (master weights excluded)."""
    opt = workload.optimizer
    if opt.state_bytes_per_param is not None:
        return opt.state_bytes_per_param
    if opt.kind is OptimizerKind.ADAFACTOR:
        # a row and a column vector of fp32 per matrix: (1/rows + 1/cols) per parameter
        return FP32_BYTES * (1 / model.hidden + 1 / model.ffn_hidden)
    return opt.num_moments * workload.precision.moment_bytes


def shard_degrees(*, dp_shard: Num, cp: Num, ep: Num) -> tuple[Num, Num]:
    """(dense, expert) ZeRO shard-group sizes.

    Dense state is sharded over dp_shard * cp (FSDP's and the distributed
    optimizer's group); expert state over the part of that group outside the
    expert-parallel group, (dp_shard * cp) / gcd(dp_shard * cp, ep).
    """
    group = dp_shard * cp
    return group, group // gcd(group, ep)


def _gather_bytes(workload: Workload) -> float:
    """Bytes per element of parameters gathered for compute (bf16 unless training in fp32)."""
    return DTYPE_BYTES[DType.FP32] if workload.precision.compute is DType.TF32 else DTYPE_BYTES[DType.BF16]


def _model_state(model: ModelSpec, lay: LayoutLike, workload: Workload, sp_: StageParams) -> tuple[Num, Num, Num, Num]:
    """(weights, gradients, master weights, moments) bytes of one GPU holding ``sp_``, after ZeRO sharding."""
    shard, expert_shard = shard_degrees(dp_shard=lay.dp_shard, cp=lay.cp, ep=lay.ep)

    def sharded(bytes_per_param: float, from_stage: ZeroStage) -> Num:
        on = lay.zero >= from_stage
        return bytes_per_param * (sp_.dense / where(on, shard, 1) + sp_.experts / where(on, expert_shard, 1))

    prec = workload.precision
    return (
        sharded(prec.weight_bytes, ZeroStage.PARAMETERS),
        sharded(prec.grad_bytes, ZeroStage.GRADIENTS),
        sharded(prec.master_bytes, ZeroStage.OPTIMIZER),
        sharded(moment_bytes_per_param(model, workload), ZeroStage.OPTIMIZER),
    )


def state_bytes(model: ModelSpec, params: ParamCount, lay: LayoutLike, workload: Workload, *, stage: Num) -> Num:
    """Model-state bytes of one GPU of ``stage`` (Megatron-style accounting): a lower bound of its whole bill,
    which the planner uses to drop hopeless layouts before it computes activations."""
    sp_ = stage_params(
        params, model, tp=lay.tp, pp=lay.pp, ep=lay.ep, stage=stage, copies=pipeline.stage_copies(lay.schedule)
    )
    if workload.framework is Framework.TORCH:
        return 0.0 * sp_.dense  # PyTorch-native state is billed tensor by tensor: no shortcut
    return sum(_model_state(model, lay, workload, sp_))


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerActivations:
    """Bytes one layer keeps for one micro-batch, by layer kind and recompute policy (stage-independent)."""

    dense: Num
    moe: Num
    dense_none: Num
    moe_none: Num
    dense_selective: Num
    moe_selective: Num


def layer_activations(model: ModelSpec, lay: LayoutLike, workload: Workload) -> LayerActivations:
    """Per-layer activation bytes of a layout (or batch), computed once and shared by every stage."""
    common = dict(
        seq_len=workload.seq_len,
        micro_batch=lay.micro_batch,
        tp=lay.tp,
        sp=lay.sp,
        cp=lay.cp,
        attention=workload.attention,
        act_bytes=workload.precision.activation_bytes,
        kernels=workload.kernels,
        framework=workload.framework,
    )

    def both(recompute: Num) -> tuple[Num, Num]:
        dense = act.layer_bytes(model, recompute=recompute, moe_layer=False, **common)
        moe = act.layer_bytes(model, recompute=recompute, moe_layer=True, **common) if model.moe else dense
        return dense, moe

    dense, moe = both(lay.recompute)
    dense_none, moe_none = both(Recompute.NONE)
    dense_sel, moe_sel = both(Recompute.SELECTIVE)
    return LayerActivations(
        dense=dense,
        moe=moe,
        dense_none=dense_none,
        moe_none=moe_none,
        dense_selective=dense_sel,
        moe_selective=moe_sel,
    )


def stage_bill(
    model: ModelSpec,
    params: ParamCount,
    layout: LayoutLike,
    workload: Workload,
    *,
    calibration: GpuCalibration,
    stage: Num,
    layer_acts: LayerActivations | None = None,
) -> MemoryBill:
    """The bill of one GPU on pipeline stage ``stage``; ``layout`` is a Layout or a batch of them."""
    lay = layout
    tp, pp, ep, cp = lay.tp, lay.pp, lay.ep, lay.cp
    zero, schedule = lay.zero, lay.schedule
    copies = pipeline.stage_copies(schedule)
    sp_ = stage_params(params, model, tp=tp, pp=pp, ep=ep, stage=stage, copies=copies)
    shard, _ = shard_degrees(dp_shard=lay.dp_shard, cp=cp, ep=ep)
    weights, grads, master, moments = _model_state(model, lay, workload, sp_)
    prec = workload.precision

    layer_acts = layer_acts or layer_activations(model, lay, workload)
    acts, logits, workspace = _stage_activations(model, lay, workload, stage=stage, sp_=sp_, la=layer_acts)
    gathered = where(
        (zero >= ZeroStage.PARAMETERS) & (shard > 1),
        sp_.largest_layer * (2 * _gather_bytes(workload) + prec.grad_bytes),
        0,
    )
    if workload.framework is Framework.TORCH:
        fsdp = where(zero >= ZeroStage.PARAMETERS, lay.dp_shard * cp, 1)
        state = shards.torch_state(
            model,
            shards.RankCoords(tp=tp, ep=ep, fsdp=fsdp),
            shards.stage_units(model, pp=pp, stage=stage),
            zero=zero,
            ddp_ranks=lay.dp_replicate * lay.dp_shard * cp,
            precision=prec,
            optimizer=workload.optimizer.kind,
            moment_bytes=moment_bytes_per_param(model, workload),
        )
        weights, grads = state.params_storage_bytes, state.grads_storage_bytes
        master, moments = state.master_bytes, state.optimizer_bytes - state.master_bytes
        gathered = state.ddp_bucket_bytes + state.gathered_root_bytes + state.fsdp_transient_bytes
    dynamic = acts + logits + workspace + gathered
    return MemoryBill(
        weights_bytes=to_float(weights),
        gradients_bytes=to_float(grads),
        master_weights_bytes=to_float(master),
        optimizer_moments_bytes=to_float(moments),
        activations_bytes=to_float(acts),
        logits_bytes=to_float(logits),
        activation_workspace_bytes=to_float(workspace),
        comm_buffers_bytes=to_float(gathered),
        framework_bytes=to_float(calibration.framework_bytes + 0 * dynamic),
        fragmentation_bytes=to_float(calibration.fragmentation * dynamic),
    )


def _stage_activations(
    model: ModelSpec, lay: LayoutLike, workload: Workload, *, stage: Num, sp_: StageParams, la: LayerActivations
) -> tuple[Num, Num, Num]:
    """(saved activations, logits, recompute workspace) of one GPU on ``stage``."""
    tp, pp, cp, sp = lay.tp, lay.pp, lay.cp, lay.sp
    b, recompute = lay.micro_batch, lay.recompute
    s, beta = workload.seq_len, workload.precision.activation_bytes
    per_mb = sp_.dense_layers * la.dense + sp_.moe_layers * la.moe
    tokens = s / cp * b
    rep = where(sp, 1.0 / tp, 1.0)
    mask = 1.0 if model.dropout else 0.0
    per_mb = per_mb + where(stage == 0, tokens * mask * model.hidden * rep, 0)  # embedding dropout mask
    fw = workload.framework
    head = act.head_bytes(model, tokens=tokens, tp=tp, sp=sp, act_bytes=beta, framework=fw)
    per_mb = per_mb + where(stage == pp - 1, head, 0)  # final norm + head input
    held = act.stage_output_bytes(model, tokens=tokens, act_bytes=beta, last=stage == pp - 1, framework=fw)

    m = pipeline.micro_batches(workload.global_batch, micro_batch=b, dp=lay.dp_replicate * lay.dp_shard)
    flight = pipeline.in_flight(schedule=lay.schedule, pp=pp, vpp=lay.vpp, m=m, stage=stage)
    saved = flight * (per_mb + where(pp > 1, held, 0)) / pipeline.stage_copies(lay.schedule)

    loss = act.loss_bytes(model, tokens=tokens, tp=tp, framework=fw) * (flight if fw is Framework.TORCH else 1)
    logits = where(stage == pp - 1, loss, 0)
    has_dense, has_moe = sp_.dense_layers > 0, sp_.moe_layers > 0
    rebuilt = maximum(where(has_dense, la.dense_none, 0), where(has_moe, la.moe_none, 0))
    kept_selective = maximum(where(has_dense, la.dense_selective, 0), where(has_moe, la.moe_selective, 0))
    workspace = where(
        recompute == Recompute.FULL, rebuilt, where(recompute == Recompute.SELECTIVE, rebuilt - kept_selective, 0)
    )
    return saved, logits, workspace


def heaviest_stages(pp: Num) -> tuple[Num, ...]:
    """The stages that can hold the most: the first two (most in flight, embedding) and the last (head, logits)."""
    return (0, minimum(1, pp - 1), pp - 1)
