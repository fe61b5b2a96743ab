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

from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np

from meshplan.core import activations as act
from meshplan.core import finetune, pipeline
from meshplan.core.num import Num, gcd, maximum, minimum, to_float, where
from meshplan.core.params import LayerParams, ParamCount
from meshplan.core.pytorch import shards
from meshplan.core.stages import candidate_stages, stage_row, vocab_params_per_rank
from meshplan.spec.cluster import GpuCalibration
from meshplan.spec.conditions import EVEN_SPLIT, FUSED_LOSS_CHUNKS, UPCAST_LOSS_BYTES, LossKind, Selective, StageSplit
from meshplan.spec.layout import LayoutLike, Recompute, Schedule, ZeroStage
from meshplan.spec.model import MlpKind, ModelSpec
from meshplan.spec.workload import Framework, Kernels, OptimizerKind, Workload
from meshplan.units import DTYPE_BYTES, FP32_BYTES, DType


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBill:
    """What one GPU holds at its peak, by disjoint term (bytes)."""

    weights_bytes: Num
    adapter_weights_bytes: Num
    gradients_bytes: Num
    master_weights_bytes: Num
    optimizer_moments_bytes: Num
    activations_bytes: Num
    logits_bytes: Num
    activation_workspace_bytes: Num
    dequant_workspace_bytes: Num
    comm_buffers_bytes: Num
    framework_bytes: Num
    fragmentation_bytes: Num
    runtime_reserve_bytes: Num

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

    @property
    def reserved_bytes(self) -> Num:
        """What the caching allocator holds at the peak (torch.cuda.max_memory_reserved): the total less what
        lives outside the allocator (CUDA context and workspaces, the runtime's reserve)."""
        return self.total_bytes - self.framework_bytes - self.runtime_reserve_bytes

    @property
    def allocated_bytes(self) -> Num:
        """Bytes of live tensors at the peak (torch.cuda.max_memory_allocated): reserved less fragmentation."""
        return self.reserved_bytes - self.fragmentation_bytes

    def as_dict(self) -> dict[str, Num]:
        """Every term, the optimizer subtotal, the allocator's allocated and reserved peaks and the total."""
        out = {name: getattr(self, name) for name in TERMS}
        out["optimizer_bytes"] = self.optimizer_bytes
        out["allocated_bytes"] = self.allocated_bytes
        out["reserved_bytes"] = self.reserved_bytes
        out["total_bytes"] = self.total_bytes
        return out


TERMS: tuple[str, ...] = tuple(f.name for f in fields(MemoryBill))


def _layer_rank_params(lp: LayerParams, model: ModelSpec, *, tp: Num, ep: Num, etp: Num = None) -> tuple[Num, Num]:
    """(dense, expert) parameters of one layer on one rank: dense ones split by TP, routed experts by EP x
    expert TP (``etp``, None: tp)."""
    sharded = lp.attention - lp.kv - lp.attention_replicated + lp.mlp - lp.mlp_replicated + lp.shared_experts
    kv_split = minimum(tp, model.num_kv_heads)
    dense = sharded / tp + lp.kv / kv_split + lp.attention_replicated + lp.mlp_replicated + lp.router + lp.norms
    return dense, lp.routed_experts / (ep * (tp if etp is None else etp))


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
    params: ParamCount,
    model: ModelSpec,
    *,
    tp: Num,
    pp: Num,
    ep: Num,
    stage: Num,
    copies: Num = 1,
    split: StageSplit = EVEN_SPLIT,
    etp: Num = None,
) -> StageParams:
    """Parameters on one GPU of pipeline stage ``stage`` (``copies`` = 2 under DualPipe; ``etp``: expert TP,
    None: tp)."""
    row = stage_row(model, pp=pp, stage=stage, split=split)
    dense_layers, moe_layers = row.dense_layers, row.moe_layers
    d_dense, _ = _layer_rank_params(params.dense_layer, model, tp=tp, ep=ep, etp=etp)
    m_dense, m_expert = _layer_rank_params(params.moe_layer, model, tp=tp, ep=ep, etp=etp)
    dense = dense_layers * d_dense + moe_layers * m_dense
    experts = moe_layers * m_expert
    is_first, is_last = row.embedding == 1, row.head == 1
    vocab_rows = vocab_params_per_rank(model, tp=tp)
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


def layout_stage_params(
    params: ParamCount, model: ModelSpec, lay: LayoutLike, workload: Workload, *, stage: Num
) -> StageParams:
    """``stage_params`` of pipeline stage ``stage`` of a layout (or a batch of them), its stages split as the
    workload's conditions say and its model chunks as its schedule holds them."""
    return stage_params(
        params,
        model,
        tp=lay.tp,
        pp=lay.pp,
        ep=lay.ep,
        stage=stage,
        copies=pipeline.stage_copies(lay.schedule),
        split=workload.conditions.stage_split,
        etp=lay.etp,
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


def shard_degrees(*, dp_shard: Num, cp: Num, ep: Num, tp: Num = 1, etp: Num = 1) -> tuple[Num, Num]:
    """(dense, expert) ZeRO shard-group sizes.

    Dense state is sharded over dp_shard * cp (FSDP's and the distributed
    optimizer's group); expert state over the part of the experts' own data
    group outside the expert-parallel group: with the TP ranks an expert does
    not split (tp / etp) counted as data ranks of the experts (MoE parallel
    folding, whose expert-data-parallel group is tp cp dp / (ep etp)),
    g / gcd(g, ep) with g = dp_shard * cp * tp / etp.
    """
    group = dp_shard * cp
    expert_group = group * tp // etp  # whole: ep * etp divides tp * cp * dp
    return group, expert_group // gcd(expert_group, ep)


def state_bytes_per_param(model: ModelSpec, workload: Workload) -> float:
    """Weights, gradients, master copy and optimizer moments per trained parameter, before any sharding: the
    back-of-envelope figure (16 bytes under bf16 mixed precision with Adam; ZeRO paper Sec. 3.1)."""
    prec = workload.precision
    return prec.weight_bytes + prec.grad_bytes + prec.master_bytes + moment_bytes_per_param(model, workload)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageTraining:
    """Parameters of one GPU's stage split by what happens to them in training."""

    base_dense: Num
    base_experts: Num
    """The model's own parameters (frozen under LoRA / QLoRA)."""
    adapter_dense: Num
    adapter_experts: Num
    """LoRA adapters (0 in full training)."""
    train_dense: Num
    train_experts: Num
    """What gets gradients and optimizer state: the adapters, or the parameters not frozen."""
    quantized: Num
    """Base matmul weights stored in NF4 (QLoRA), 0 otherwise."""


def stage_training(
    model: ModelSpec, params: ParamCount, lay: LayoutLike, workload: Workload, *, stage: Num, held: StageParams
) -> StageTraining:
    """Split one GPU's stage parameters into base, adapters and trainable (fine-tuning aware)."""
    ft = workload.finetune
    if ft.adapted:
        dense_a, exp_a = finetune.adapter_split(model, ft, moe_layer=False, tp=lay.tp, ep=lay.ep)
        dense_m, exp_m = finetune.adapter_split(model, ft, moe_layer=True, tp=lay.tp, ep=lay.ep)
        ad = held.dense_layers * dense_a + held.moe_layers * dense_m
        ae = held.dense_layers * exp_a + held.moe_layers * exp_m
        quantized: Num = 0.0
        if finetune.quantized_base(ft):
            # kept in bf16: the embedding, the output head (its own copy unless tied on one stage), final norm
            vocab, last = vocab_params_per_rank(model, tp=lay.tp), stage == lay.pp - 1
            head = where((lay.pp > 1) | (not model.tied_embeddings), vocab, 0.0)
            edges = where(stage == 0, vocab + params.position_embedding, 0) + where(last, head + model.norm_params, 0)
            quantized = finetune.quantizable_params(
                model,
                dense=held.dense,
                experts=held.experts,
                layers=held.dense_layers + held.moe_layers,
                edges=edges,
            )
        edges_trained: Num = 0.0
        if ft.train_embeddings:  # the embedding and the output head train beside the adapters
            vocab = vocab_params_per_rank(model, tp=lay.tp)
            head = where((lay.pp > 1) | (not model.tied_embeddings), vocab, 0.0)
            edges_trained = where(stage == 0, vocab, 0) + where(stage == lay.pp - 1, head, 0)
        return StageTraining(
            base_dense=held.dense,
            base_experts=held.experts,
            adapter_dense=ad,
            adapter_experts=ae,
            train_dense=ad + edges_trained,
            train_experts=ae,
            quantized=quantized,
        )
    frozen_dense: Num = 0.0
    frozen_experts: Num = 0.0
    if ft.freeze_embeddings:
        frozen_dense = where(stage == 0, vocab_params_per_rank(model, tp=lay.tp) + params.position_embedding, 0)
    if ft.freeze_layers:
        first = stage_row(model, pp=lay.pp, stage=stage, split=workload.conditions.stage_split).first_layer
        n = finetune.frozen_leading_layers(ft, first=first, layers=held.dense_layers + held.moe_layers)
        layer = params.dense_layer if params.num_dense_layers >= ft.freeze_layers else params.moe_layer
        d, e = _layer_rank_params(layer, model, tp=lay.tp, ep=lay.ep, etp=lay.etp)
        frozen_dense, frozen_experts = frozen_dense + n * d, n * e
    return StageTraining(
        base_dense=held.dense,
        base_experts=held.experts,
        adapter_dense=0.0,
        adapter_experts=0.0,
        train_dense=held.dense - frozen_dense,
        train_experts=held.experts - frozen_experts,
        quantized=0.0,
    )


def _model_state(
    model: ModelSpec, lay: LayoutLike, workload: Workload, tr: StageTraining
) -> tuple[Num, Num, Num, Num, Num]:
    """(weights, adapter weights, gradients, master weights, moments) bytes of one GPU, after ZeRO sharding.

    The base is kept in the weight dtype (NF4 for QLoRA's matmul weights); gradients and optimizer state
    exist only for what trains. QLoRA's adapters are bf16 and updated in place by a 32-bit AdamW, with no fp32
    master copy (the QLoRA reference training script).
    """
    shard, expert_shard = shard_degrees(dp_shard=lay.dp_shard, cp=lay.cp, ep=lay.ep, tp=lay.tp, etp=lay.etp)
    divisors: dict[ZeroStage, tuple[Num, Num]] = {}

    def sharded(dense: Num, experts: Num, from_stage: ZeroStage) -> Num:
        if from_stage not in divisors:  # each stage's divisors once (a search's arrays are long)
            on = lay.zero >= from_stage
            divisors[from_stage] = where(on, shard, 1), where(on, expert_shard, 1)
        d, e = divisors[from_stage]
        return dense / d + experts / e

    prec = workload.precision
    ft = workload.finetune
    base = sharded(tr.base_dense, tr.base_experts, ZeroStage.PARAMETERS)
    if finetune.quantized_base(ft):
        nf4 = finetune.nf4_bytes_per_param(double_quant=ft.double_quant)
        share = tr.quantized / maximum(tr.base_dense + tr.base_experts, 1.0)
        weights = base * (share * nf4 + (1 - share) * DTYPE_BYTES[DType.BF16])
    else:
        weights = base * prec.weight_bytes
    optimizer_held = sharded(tr.train_dense, tr.train_experts, ZeroStage.OPTIMIZER)
    return (
        weights,
        sharded(tr.adapter_dense, tr.adapter_experts, ZeroStage.PARAMETERS) * prec.weight_bytes,
        sharded(tr.train_dense, tr.train_experts, ZeroStage.GRADIENTS) * prec.grad_bytes,
        optimizer_held * (0.0 if finetune.quantized_base(ft) else prec.master_bytes),
        optimizer_held * moment_bytes_per_param(model, workload),
    )


def state_bytes(model: ModelSpec, params: ParamCount, lay: LayoutLike, workload: Workload, *, stage: Num) -> Num:
    """Model-state bytes of one GPU of ``stage`` (Megatron-style accounting): a lower bound of its whole bill,
    which the planner uses to drop hopeless layouts before it computes activations."""
    held = layout_stage_params(params, model, lay, workload, stage=stage)
    if workload.framework is Framework.TORCH:
        return 0.0 * held.dense  # PyTorch-native state is billed tensor by tensor: no shortcut
    tr = stage_training(model, params, lay, workload, stage=stage, held=held)
    return sum(_model_state(model, lay, workload, tr))


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerActivations:
    """Bytes one layer keeps for one micro-batch, by layer kind and recompute policy (stage-independent)."""

    dense: Num
    moe: Num
    dense_none: Num
    moe_none: Num
    dense_selective: Num
    moe_selective: Num
    dense_full: Num = 0.0
    moe_full: Num = 0.0


def _frozen_delta_per_token(model: ModelSpec, lay: LayoutLike, workload: Workload, *, moe_layer: bool) -> Num:
    """Bytes per token a LoRA layer keeps beyond (or short of) full training: frozen matmuls drop the inputs
    only their weight gradients needed, frozen norms what only their scale's gradient needed; each adapter
    keeps its r-wide A x."""
    ft = workload.finetune
    if not ft.adapted:
        return 0.0
    beta, fw = workload.precision.activation_bytes, workload.framework
    qkv, mlp_in, down = finetune.saved_input_savings(model, ft, moe_layer=moe_layer)
    split = act.input_split(lay.tp, lay.sp, fw)
    ffn, expert_inputs = model.ffn_hidden, 0
    if moe_layer and model.moe is not None:
        ffn = model.moe.expert_ffn_hidden * model.moe.experts_per_token
        expert_inputs = model.moe.experts_per_token  # each routed copy of the MLP input
    norms = 2 * act.norm_weight_grad_bytes_per_token(model, act_bytes=beta, framework=fw) * where(lay.sp, 1 / lay.tp, 1)
    dropped = beta * (model.hidden * (split * (qkv + mlp_in) + expert_inputs * mlp_in) + down * ffn / lay.tp) + norms
    return finetune.adapter_saved_per_token(model, ft, moe_layer=moe_layer, act_bytes=beta) - dropped


def _first_layer_dead_per_token(model: ModelSpec, lay: LayoutLike, workload: Workload, *, moe_layer: bool) -> Num:
    """What the first layer's LoRA accounting keeps per token upstream of its first adapter.

    Behind a frozen embedding nothing before the first trainable tensor needs a gradient, so autograd keeps
    nothing there: the first norm always; the whole attention block when no q, k, v adapter sits in it; the
    MLP's internals too when only down is adapted. Later layers keep everything, since gradients must flow
    through them to the adapters below.
    """
    ft, beta, fw = workload.finetune, workload.precision.activation_bytes, workload.framework
    targets, rep = set(ft.lora_targets), where(lay.sp, 1 / lay.tp, 1)
    norm = act.norm_bytes_per_token(model, act_bytes=beta, framework=fw, frozen_weight=True) * rep
    if targets & {"q", "k", "v"}:
        return norm
    weight_grad = act.norm_weight_grad_bytes_per_token(model, act_bytes=beta, framework=fw) * rep
    split, h = act.input_split(lay.tp, lay.sp, fw), model.hidden
    attention = act.attention_bytes_per_token(
        model,
        seq_len=workload.seq_len,
        tp=lay.tp,
        sp=lay.sp,
        attention=workload.attention,
        act_bytes=beta,
        keep_scores=where(lay.recompute == Recompute.NONE, 1.0, 0.0),
        framework=fw,
    ) - (weight_grad + beta * h * split)  # frozen norm scale; no q, k, v adapter needs the QKV input
    if "o" in targets:
        return attention - beta * model.attn_out_width / lay.tp  # o's adapter needs its input
    dead = attention + norm
    ffn = model.moe.expert_ffn_hidden * model.moe.experts_per_token if moe_layer and model.moe else model.ffn_hidden
    if targets & {"gate", "up"}:
        if model.mlp is MlpKind.GATED and workload.kernels is Kernels.EAGER and len(targets & {"gate", "up"}) == 1:
            # one frozen branch of act(gate) * up: adapted up alone frees gate's output and up's output,
            # adapted gate alone frees act(gate)
            dead = dead + (2 if "up" in targets else 1) * beta * ffn / lay.tp
        return dead
    mlp = act.mlp_bytes_per_token(
        model, tp=lay.tp, sp=lay.sp, act_bytes=beta, moe_layer=moe_layer, kernels=workload.kernels, framework=fw
    ) - (weight_grad + norm + beta * h * split)  # the norm is counted above; no gate or up adapter
    return dead + mlp - beta * ffn / lay.tp  # down's adapter needs its input


def _module_savings_per_token(model: ModelSpec, lay: LayoutLike, workload: Workload, *, moe_layer: bool) -> Num:
    """Bytes per token a layer no longer keeps when Megatron recomputes the listed modules (core_attn apart).

    layernorm: the two norm outputs (the QKV and MLP inputs, beta h each, 1/t under SP); mlp: a dense MLP's
    input and internals (beta h split + n beta f / t); moe: the same for the MoE block with the routed experts'
    internals; moe_act: the experts' activation output (beta f_e / t per routed copy); shared_experts: their
    internals; mla_up_proj: MLA's up-projected queries, keys and values (beta (q + k + v) / t).
    """
    mods = set(workload.conditions.recompute_modules)
    beta, tp, h = workload.precision.activation_bytes, lay.tp, model.hidden
    split = act.input_split(tp, lay.sp, workload.framework)
    n = act.GATED_SAVED_TENSORS[workload.kernels] if model.mlp is MlpKind.GATED else act.PLAIN_SAVED_TENSORS
    out: Num = 0.0
    if "layernorm" in mods:
        out = out + 2 * beta * h * split
    moe = model.moe if moe_layer else None
    if "mlp" in mods and moe is None:
        out = out + beta * h * split * ("layernorm" not in mods) + n * beta * model.ffn_hidden / tp
    if moe is not None:
        copies = moe.experts_per_token * where(lay.sp, lay.etp / tp, 1.0)  # as act.mlp_bytes_per_token
        routed = copies * n * beta * moe.expert_ffn_hidden / lay.etp
        shared = moe.num_shared_experts * n * beta * moe.shared_hidden / tp
        if "moe" in mods:
            out = out + beta * h * split * ("layernorm" not in mods) + routed + shared
        else:
            if "moe_act" in mods:
                out = out + copies * beta * moe.expert_ffn_hidden / lay.etp
            if "shared_experts" in mods:
                out = out + shared
    if "mla_up_proj" in mods and model.mla is not None:
        out = out + beta * (model.q_width + 2 * model.num_heads * model.mla.v_head_dim) / tp
    return out


def _op_checkpoint_per_token(model: ModelSpec, lay: LayoutLike, workload: Workload, *, moe_layer: bool) -> Num:
    """Bytes per token a layer keeps under torchtitan's per-op selective checkpointing.

    Its policy (torchtitan ``_apply_op_sac``) counts a block's matmuls and recomputes every second one: of
    wq, wk, wv, wo, w1, w3, w2 it saves the outputs of the 1st, 3rd, 5th and 7th, wq (q), wv (kv), w1 (f) and w2
    (h); it also saves the attention kernel's output and log-sum-exp, and keeps the layer input to rebuild the
    rest: beta (h/t_sp + (attention out)/t + (q + kv + f + h) / t) + 4 fp32 log-sum-exp per head, with f the
    MLP width of the layer (top-k experts' under MoE, taken as one MLP of that width). Measured by
    ``meshplan check`` (fsdp_sac_op) at f = 2h and f = 3h.
    """
    beta, tp = workload.precision.activation_bytes, lay.tp
    ffn = model.ffn_hidden
    if moe_layer and model.moe is not None:
        ffn = model.moe.expert_ffn_hidden * model.moe.experts_per_token
    saved_matmuls = model.q_width + model.kv_width + ffn + model.hidden
    layer_input = model.hidden * where(lay.sp, 1.0 / tp, 1.0)
    lse = FP32_BYTES * model.num_heads / tp
    return beta * (layer_input + model.attn_out_width / tp + saved_matmuls / tp) + lse


def _selective_keeps(
    model: ModelSpec,
    lay: LayoutLike,
    workload: Workload,
    both: Callable[[Num], tuple[Num, Num]],
    *,
    none: tuple[Num, Num],
    full: tuple[Num, Num],
    deltas: tuple[Num, Num],
) -> tuple[Num, Num]:
    """(dense, MoE) bytes a layer keeps under ``--recompute selective``, as the stack's selective policy means it;
    ``both(recompute)`` bills a policy of the core's, ``none`` and ``full`` are its two ends."""
    tokens = workload.seq_len / lay.cp * lay.micro_batch
    policy = workload.conditions.selective
    if policy is Selective.LAYER:  # every second layer fully recomputed
        return (none[0] + full[0]) / 2, (none[1] + full[1]) / 2
    if policy is Selective.MODULES:
        core_dense, core_moe = both(Recompute.SELECTIVE)  # what recomputing core attention alone keeps
        dense_sel = none[0] - tokens * _module_savings_per_token(model, lay, workload, moe_layer=False)
        moe_sel = none[1] - tokens * _module_savings_per_token(model, lay, workload, moe_layer=True)
        if "core_attn" in workload.conditions.recompute_modules:
            dense_sel, moe_sel = dense_sel - (none[0] - core_dense), moe_sel - (none[1] - core_moe)
        return dense_sel, moe_sel
    if policy is Selective.OP:
        dense_op = tokens * _op_checkpoint_per_token(model, lay, workload, moe_layer=False) + deltas[0]
        return dense_op, tokens * _op_checkpoint_per_token(model, lay, workload, moe_layer=True) + deltas[1]
    return both(Recompute.SELECTIVE)


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
        routing_imbalance=where(lay.ep > 1, workload.conditions.routing_imbalance, 1.0),
        etp=lay.etp,
    )

    tokens = workload.seq_len / lay.cp * lay.micro_batch
    delta_dense = tokens * _frozen_delta_per_token(model, lay, workload, moe_layer=False)
    delta_moe = tokens * _frozen_delta_per_token(model, lay, workload, moe_layer=True)

    def both(recompute: Num) -> tuple[Num, Num]:
        dense = act.layer_bytes(model, recompute=recompute, moe_layer=False, **common)
        moe = act.layer_bytes(model, recompute=recompute, moe_layer=True, **common) if model.moe else dense
        kept = where(recompute == Recompute.FULL, 0.0, 1.0)  # full recompute keeps only the layer input
        return dense + kept * delta_dense, moe + kept * (delta_moe if model.moe else delta_dense)

    dense_none, moe_none = both(Recompute.NONE)
    dense_full, moe_full = both(Recompute.FULL)
    dense_sel, moe_sel = _selective_keeps(
        model,
        lay,
        workload,
        both,
        none=(dense_none, moe_none),
        full=(dense_full, moe_full),
        deltas=(delta_dense, delta_moe),
    )
    pick = {Recompute.NONE: (dense_none, moe_none), Recompute.FULL: (dense_full, moe_full)}
    dense = where(
        lay.recompute == Recompute.NONE,
        pick[Recompute.NONE][0],
        where(lay.recompute == Recompute.FULL, pick[Recompute.FULL][0], dense_sel),
    )
    moe = where(
        lay.recompute == Recompute.NONE,
        pick[Recompute.NONE][1],
        where(lay.recompute == Recompute.FULL, pick[Recompute.FULL][1], moe_sel),
    )
    return LayerActivations(
        dense=dense,
        moe=moe,
        dense_none=dense_none,
        moe_none=moe_none,
        dense_selective=dense_sel,
        moe_selective=moe_sel,
        dense_full=dense_full,
        moe_full=moe_full,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class StageActivations:
    """What one GPU of a stage holds for its micro-batches (bytes): none of it reads the ZeRO stage or the split of
    the data-parallel ranks, so a batch of layouts may bill it once per group of layouts alike in the rest."""

    saved: Num
    logits: Num
    workspace: Num


def stage_activations(
    model: ModelSpec,
    params: ParamCount,
    lay: LayoutLike,
    workload: Workload,
    *,
    stage: Num,
    layer_acts: LayerActivations | None = None,
    held: StageParams | None = None,
) -> StageActivations:
    """Saved activations, logits and recompute workspace of one GPU on pipeline stage ``stage`` (``held``: its
    parameters when known)."""
    held = held or layout_stage_params(params, model, lay, workload, stage=stage)
    saved, logits, workspace = _stage_activations(
        model,
        lay,
        workload,
        stage=stage,
        held=held,
        la=layer_acts or layer_activations(model, lay, workload),
        frozen=_frozen_activation_layers(model, lay, workload, stage=stage, held=held),
    )
    return StageActivations(saved=saved, logits=logits, workspace=workspace)


def stage_bill(
    model: ModelSpec,
    params: ParamCount,
    layout: LayoutLike,
    workload: Workload,
    *,
    calibration: GpuCalibration,
    stage: Num,
    layer_acts: LayerActivations | None = None,
    activations: StageActivations | None = None,
    held: StageParams | None = None,
) -> MemoryBill:
    """The bill of one GPU on pipeline stage ``stage``; ``layout`` is a Layout or a batch of them.

    ``activations`` and ``held``: the stage's activations (``stage_activations``) and parameters
    (``stage_params``) when already known, else found here.
    """
    lay = layout
    held = held or layout_stage_params(params, model, lay, workload, stage=stage)
    st = _stage_state(model, params, lay, workload, stage=stage, held=held)
    dequant = where(finetune.quantized_base(workload.finetune), 2.0 * finetune.largest_matrix(model, tp=lay.tp), 0.0)
    a = activations or stage_activations(model, params, lay, workload, stage=stage, layer_acts=layer_acts, held=held)
    acts, logits, workspace = a.saved, a.logits, a.workspace
    dynamic = acts + logits + workspace + dequant + st.gathered
    return MemoryBill(
        weights_bytes=to_float(st.weights),
        adapter_weights_bytes=to_float(st.adapters + 0 * dynamic),
        gradients_bytes=to_float(st.grads),
        master_weights_bytes=to_float(st.master),
        optimizer_moments_bytes=to_float(st.moments),
        activations_bytes=to_float(acts),
        logits_bytes=to_float(logits),
        activation_workspace_bytes=to_float(workspace),
        dequant_workspace_bytes=to_float(dequant + 0 * dynamic),
        comm_buffers_bytes=to_float(st.gathered),
        framework_bytes=to_float(calibration.framework_bytes + 0 * dynamic),
        fragmentation_bytes=to_float(calibration.fragmentation * dynamic),
        runtime_reserve_bytes=to_float(workload.conditions.runtime_reserve_bytes + 0 * dynamic),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _StateBytes:
    """One GPU's model state and gathered parameters (bytes)."""

    weights: Num
    adapters: Num
    grads: Num
    master: Num
    moments: Num
    gathered: Num


def _stage_state(
    model: ModelSpec, params: ParamCount, lay: LayoutLike, workload: Workload, *, stage: Num, held: StageParams
) -> _StateBytes:
    """Model state of one GPU on ``stage`` (Megatron-style, or PyTorch-native tensor by tensor) and the
    parameters ZeRO-3 / FSDP holds gathered, after gradient accumulation and resharding."""
    tr = stage_training(model, params, lay, workload, stage=stage, held=held)
    weights, adapters, grads, master, moments = _model_state(model, lay, workload, tr)
    prec = workload.precision
    shard, _ = shard_degrees(dp_shard=lay.dp_shard, cp=lay.cp, ep=lay.ep)
    gathered = where(
        (lay.zero >= ZeroStage.PARAMETERS) & (shard > 1),
        held.largest_layer * (2 * shards.gather_bytes(prec, fp8=workload.conditions.fp8_all_gather) + prec.grad_bytes),
        0,
    )
    if workload.framework is Framework.TORCH and not workload.finetune.adapted:
        weights, grads, master, moments, gathered = _torch_native_state(model, lay, workload, stage=stage)
    elif workload.framework is Framework.TORCH:
        # torch.optim's 0-dim fp32 step per trained tensor: thousands of small adapter tensors
        ft, step = workload.finetune, shards.OPTIMIZER_STEP_BYTES.get(workload.optimizer.kind, 0.0)
        per_layer = [finetune.adapter_tensors(model, ft, moe_layer=moe, ep=lay.ep) for moe in (False, True)]
        moments = moments + step * (held.dense_layers * per_layer[0] + held.moe_layers * per_layer[1])
    grads, gathered = _accumulation_state(model, lay, workload, tr=tr, held=held, grads=grads, gathered=gathered)
    return _StateBytes(
        weights=weights, adapters=adapters, grads=grads, master=master, moments=moments, gathered=gathered
    )


def _torch_native_state(
    model: ModelSpec, lay: LayoutLike, workload: Workload, *, stage: Num
) -> tuple[Num, Num, Num, Num, Num]:
    """(weights, gradients, master, moments, gathered) of PyTorch-native training, tensor by tensor
    (``pytorch.shards``): FSDP2 over dp_shard x cp from ZeRO-3, DDP's buckets below it."""
    zero, cp = lay.zero, lay.cp
    fsdp = where(zero >= ZeroStage.PARAMETERS, lay.dp_shard * cp, 1)
    state = shards.torch_state(
        model,
        shards.RankCoords(tp=lay.tp, ep=lay.ep, fsdp=fsdp, etp=lay.etp),
        stage_row(model, pp=lay.pp, stage=stage, split=workload.conditions.stage_split),
        zero=zero,
        ddp_ranks=lay.dp_replicate * lay.dp_shard * cp,
        precision=workload.precision,
        optimizer=workload.optimizer.kind,
        moment_bytes=moment_bytes_per_param(model, workload),
        fp8_all_gather=workload.conditions.fp8_all_gather,
    )
    gathered = state.ddp_bucket_bytes + state.gathered_root_bytes + state.fsdp_transient_bytes
    moments = state.optimizer_bytes - state.master_bytes
    return state.params_storage_bytes, state.grads_storage_bytes, state.master_bytes, moments, gathered


def _accumulation_state(
    model: ModelSpec,
    lay: LayoutLike,
    workload: Workload,
    *,
    tr: StageTraining,
    held: StageParams,
    grads: Num,
    gathered: Num,
) -> tuple[Num, Num]:
    """(gradients, gathered parameters) once gradient accumulation and FSDP resharding are accounted for.

    Accumulating without sync (``no_sync`` / ``set_requires_gradient_sync(False)``) holds the unsharded
    gradient in the gradient dtype on every rank until the last micro-batch; with reshard-after-forward off,
    FSDP / ZeRO-3 keeps every layer of the stage gathered between forward and backward. PyTorch's pipeline
    schedules do both under FSDP whenever pp > 1 (torchtitan: parameters and fp32 gradients stay unsharded
    across the micro-batches of a step).
    """
    cond, prec = workload.conditions, workload.precision
    m = pipeline.micro_batches(workload.global_batch, micro_batch=lay.micro_batch, dp=lay.dp_replicate * lay.dp_shard)
    torch_pp = (lay.pp > 1) if workload.framework is Framework.TORCH else False
    shard, _ = shard_degrees(dp_shard=lay.dp_shard, cp=lay.cp, ep=lay.ep)
    no_sync = ((not cond.grad_sync) | torch_pp) & (m > 1) & (lay.zero >= ZeroStage.GRADIENTS) & (shard > 1)
    unsharded_grads = (tr.train_dense + tr.train_experts) * prec.grad_bytes
    grads = where(no_sync, maximum(grads, unsharded_grads), grads)
    keep = ((not cond.reshard_after_forward) | torch_pp) & (lay.zero >= ZeroStage.PARAMETERS) & (shard > 1)
    stage_gathered = (held.dense + held.experts) * shards.gather_bytes(prec, fp8=cond.fp8_all_gather)
    gathered = where(keep, maximum(gathered, stage_gathered + held.largest_layer * prec.grad_bytes), gathered)
    return grads, gathered


def loss_peak_bytes(model: ModelSpec, *, tokens: Num, tp: Num, workload: Workload) -> Num:
    """The loss's peak for one micro-batch on the last stage, by the loss the run uses.

    framework: the framework's own (Megatron: fp32 softmax of the vocab-parallel logits, 4sbV/t; PyTorch as
    ``check`` measures it, 4sbV). upcast: ``cross_entropy(logits.float())``, 14 bytes per token and vocabulary
    entry at its backward (conditions.UPCAST_LOSS_BYTES); fused: the same on one of 8 token chunks. Under
    loss parallelism the vocabulary is split over the TP group.
    """
    cond, fw = workload.conditions, workload.framework
    own = act.SAVED_TENSORS[fw].vocab_parallel_loss
    split = where(own if cond.loss_parallel is None else cond.loss_parallel, tp, 1)
    if cond.loss is LossKind.FRAMEWORK:
        scalar = act.SAVED_TENSORS[fw].loss_scalar_bytes
        return FP32_BYTES * tokens * model.vocab_size / split + scalar
    chunks = FUSED_LOSS_CHUNKS if cond.loss is LossKind.FUSED else 1
    return UPCAST_LOSS_BYTES * tokens * model.vocab_size / split / chunks


def _frozen_activation_layers(
    model: ModelSpec, lay: LayoutLike, workload: Workload, *, stage: Num, held: StageParams
) -> Num:
    """Layers of this stage that keep nothing for backward: a frozen prefix behind a frozen embedding."""
    ft = workload.finetune
    if not (ft.freeze_embeddings and ft.freeze_layers):
        return 0.0
    first = stage_row(model, pp=lay.pp, stage=stage, split=workload.conditions.stage_split).first_layer
    return finetune.frozen_leading_layers(ft, first=first, layers=held.dense_layers + held.moe_layers)


def _stage_activations(
    model: ModelSpec,
    lay: LayoutLike,
    workload: Workload,
    *,
    stage: Num,
    held: StageParams,
    la: LayerActivations,
    frozen: Num = 0.0,
) -> tuple[Num, Num, Num]:
    """(saved activations, logits, recompute workspace) of one GPU on ``stage``."""
    pp, recompute = lay.pp, lay.recompute
    tokens = workload.seq_len / lay.cp * lay.micro_batch
    per_layers = _saved_per_microbatch(held, la, frozen=frozen, recompute=recompute, workload=workload)
    per_mb = _edge_bytes(model, lay, workload, stage=stage, held=held, tokens=tokens)
    outputs = act.stage_output_bytes(
        model,
        tokens=tokens,
        act_bytes=workload.precision.activation_bytes,
        last=stage == pp - 1,
        framework=workload.framework,
    )
    flight, layer_flight, head_flight = _flight(lay, workload, stage=stage, layers=held.dense_layers + held.moe_layers)
    copies = pipeline.stage_copies(lay.schedule)
    saved = (layer_flight * per_layers + flight * per_mb + head_flight * where(pp > 1, outputs, 0)) / copies

    loss = loss_peak_bytes(model, tokens=tokens, tp=lay.tp, workload=workload) * (
        head_flight if workload.framework is Framework.TORCH else 1
    )
    logits = where(stage == pp - 1, loss, 0)
    has_dense, has_moe = held.dense_layers > 0, held.moe_layers > 0
    rebuilt = maximum(where(has_dense, la.dense_none, 0), where(has_moe, la.moe_none, 0))
    kept_selective = maximum(where(has_dense, la.dense_selective, 0), where(has_moe, la.moe_selective, 0))
    workspace = where(
        recompute == Recompute.FULL, rebuilt, where(recompute == Recompute.SELECTIVE, rebuilt - kept_selective, 0)
    )
    return saved, logits, workspace


def _saved_per_microbatch(
    held: StageParams, la: LayerActivations, *, frozen: Num, recompute: Num, workload: Workload
) -> Num:
    """What the stage's layers keep for one micro-batch: nothing for a frozen prefix (dense layers come first);
    with --offload-layers k, k layers' share on the host but for one in transit (layers of a stage taken as
    alike); with --recompute-layers k under full recompute, the first k layers keep their input only and the
    rest everything (Megatron's block method)."""
    frozen_dense = minimum(frozen, held.dense_layers)
    dense, moe = held.dense_layers - frozen_dense, held.moe_layers - (frozen - frozen_dense)
    per_layers = dense * la.dense + moe * la.moe
    off = workload.conditions.offload_layers
    if off:  # k layers' activations on the host, one of them on its way (the offload handler's double buffer)
        held_layers = held.dense_layers + held.moe_layers - frozen
        per_layers = per_layers * (1 - maximum(minimum(off, held_layers) - 1, 0) / maximum(held_layers, 1))
    k = workload.conditions.recompute_layers
    if k is None:
        return per_layers
    held_layers = held.dense_layers + held.moe_layers - frozen
    share = minimum(k, held_layers) / maximum(held_layers, 1)
    full, none = dense * la.dense_full + moe * la.moe_full, dense * la.dense_none + moe * la.moe_none
    return where(recompute == Recompute.FULL, share * full + (1 - share) * none, per_layers)


def _edge_bytes(
    model: ModelSpec, lay: LayoutLike, workload: Workload, *, stage: Num, held: StageParams, tokens: Num
) -> Num:
    """Per micro-batch bytes outside the layers: the embedding's dropout mask on stage 0 (less what LoRA's first
    layer keeps for nothing behind a frozen embedding), the final norm and head input on the last stage."""
    tp, sp, beta = lay.tp, lay.sp, workload.precision.activation_bytes
    mask = 1.0 if model.dropout else 0.0
    per_mb = where(stage == 0, tokens * mask * model.hidden * where(sp, 1.0 / tp, 1.0), 0)
    ft = workload.finetune
    if ft.adapted and not ft.train_embeddings:  # behind a trained embedding every layer keeps all it saves
        dead = where(
            held.dense_layers > 0,  # dense layers come first
            _first_layer_dead_per_token(model, lay, workload, moe_layer=False),
            _first_layer_dead_per_token(model, lay, workload, moe_layer=True),
        )
        per_mb = per_mb - where((stage == 0) & (lay.recompute != Recompute.FULL), tokens * dead, 0)
    head = act.head_bytes(
        model,
        tokens=tokens,
        tp=tp,
        sp=sp,
        act_bytes=beta,
        framework=workload.framework,
        frozen_head=(ft.adapted and not ft.train_embeddings) or ft.freeze_embeddings,
        frozen_norm=ft.adapted,
    )
    return per_mb + where(stage == lay.pp - 1, head, 0)


def _flight(lay: LayoutLike, workload: Workload, *, stage: Num, layers: Num) -> tuple[Num, Num, Num]:
    """Micro-batches in flight on ``stage`` at its peak: of its whole layer set, per layer (interleaved: counted
    chunk by chunk), and of its last chunk (where the head, its logits and the loss live)."""
    pp = lay.pp
    m = pipeline.micro_batches(workload.global_batch, micro_batch=lay.micro_batch, dp=lay.dp_replicate * lay.dp_shard)
    flight = pipeline.in_flight(schedule=lay.schedule, pp=pp, vpp=lay.vpp, m=m, stage=stage)
    group = minimum(workload.conditions.microbatch_group or pp, m)
    interleaved = lay.schedule == Schedule.INTERLEAVED
    chunk_args = dict(pp=pp, vpp=lay.vpp, m=m, stage=stage, group=group)
    layer_flight = _on_rows(
        interleaved,
        lambda **a: pipeline.interleaved_layer_microbatches(**a) / maximum(a["layers"], 1),
        flight,
        **chunk_args,
        layers=layers,
    )
    head_flight = _on_rows(
        interleaved & (stage == pp - 1),
        lambda **a: pipeline.interleaved_chunk_forwards(**a, chunk=a["vpp"] - 1),
        flight,
        **chunk_args,
    )
    return flight, layer_flight, head_flight


def _on_rows(mask: Num, fn: Callable[..., Num], fill: Num, **args: Num) -> Num:
    """``fn(**args)`` where ``mask`` holds and ``fill`` elsewhere; on a batch, ``fn`` runs on the masked rows only
    (the interleaved schedule's chunk counts, for instance, on the interleaved layouts)."""
    if np.ndim(mask) == 0:
        return fn(**args) if mask else fill
    idx = np.flatnonzero(mask)
    out = np.array(np.broadcast_to(fill, np.shape(mask)), dtype=np.float64)
    if len(idx):
        out[idx] = fn(**{k: (v[idx] if np.ndim(v) else v) for k, v in args.items()})
    return out


def candidates(model: ModelSpec, lay: LayoutLike, workload: Workload) -> tuple[Num, ...]:
    """The stages of ``lay`` that hold the maximum of every term (``stages.candidate_stages``)."""
    frozen = workload.finetune.freeze_layers if not workload.finetune.adapted else 0
    return candidate_stages(
        model, pp=lay.pp, boundaries=(frozen,) if frozen else (), split=workload.conditions.stage_split
    )
