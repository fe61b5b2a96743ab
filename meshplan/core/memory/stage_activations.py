"""Activations one GPU of a pipeline stage holds at its peak: per layer and token as each recompute policy keeps
them (Korthikanti et al. 2022 through activations.py; selective by policy, by module or per op; frozen prefixes),
times the micro-batches in flight (pipeline.py), plus the logits and loss workspace on the last stage. Every
function broadcasts over numpy arrays of layouts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from meshplan.core import finetune, pipeline
from meshplan.core.memory import activations as act
from meshplan.core.memory.recompute_keep import keep_per_token, module_savings_per_token, op_checkpoint_per_token
from meshplan.core.memory.stage_params import StageParams, layout_stage_params
from meshplan.core.num import Num, maximum, minimum, where
from meshplan.core.params import ParamCount
from meshplan.core.stages import stage_row
from meshplan.spec.conditions import (
    BF16_LOSS_BYTES,
    COMPILED_LOSS_BYTES,
    FUSED_LOSS_CHUNKS,
    PARALLEL_UPCAST_LOSS_BYTES,
    UPCAST_LOSS_BYTES,
    Fp8Recipe,
    LossKind,
    Selective,
)
from meshplan.spec.layout import LayoutLike, Recompute, Schedule
from meshplan.spec.model import MlpKind, ModelSpec
from meshplan.spec.workload import Framework, Kernels, Workload
from meshplan.units import FP32_BYTES, DType

FP8_SAVED_SCALE_BYTES = {Fp8Recipe.MXFP8: 1 / 32}
"""Scale bytes per element of a saved FP8 input: MXFP8's E8M0 byte per 32 elements of its one (column-wise) copy;
a per-tensor scale (tensorwise, delayed) is none."""
DEEPSEEK_SAVED_SCALE_BYTES = FP32_BYTES / 128
"""The same under DeepSeek-V3's recipe (``--precision deepseek-fp8``): an fp32 scale per 1 x 128 tile."""


def linear_inputs(workload: Workload) -> act.LinearInputs:
    """What a linear layer of this workload keeps of its input for its weight gradient.

    Under FP8 matmuls Megatron-Core's Transformer Engine layers (and DeepSeek-V3's framework, Sec. 3.3) keep the
    FP8 copy their forward cast, 1 byte an element and its scales; PyTorch-native stacks (torchao's Float8Linear
    saves ``input_hp``) keep the bf16 input. Under delayed scaling Megatron does not ask the output projection
    and the shared experts to keep their bf16 original, so each also keeps its FP8 copy."""
    beta = workload.precision.activation_bytes
    if workload.precision.compute is not DType.FP8 or workload.framework is not Framework.MEGATRON:
        return act.LinearInputs.plain(beta)
    recipe = workload.conditions.fp8_recipe
    scale = FP8_SAVED_SCALE_BYTES.get(recipe, 0.0) if recipe is not None else 0.0
    if workload.precision.name == "deepseek-fp8":
        scale = DEEPSEEK_SAVED_SCALE_BYTES
    own = 1.0 + scale
    return act.LinearInputs(own_bytes=own, copy_bytes=own if recipe is Fp8Recipe.DELAYED else 0.0)


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
    lin = linear_inputs(workload)
    own, block_in = lin.own_bytes, lin.block_input_bytes(beta, moe_layer=expert_inputs > 0)
    inputs = model.hidden * (own * (split * qkv + expert_inputs * mlp_in) + block_in * split * mlp_in)
    dropped = inputs + own * down * ffn / lay.tp + norms
    return finetune.adapter_saved_per_token(model, ft, moe_layer=moe_layer, act_bytes=beta) - dropped


def _first_layer_dead_per_token(model: ModelSpec, lay: LayoutLike, workload: Workload, *, moe_layer: bool) -> Num:
    """What the first layer's LoRA accounting keeps per token upstream of its first adapter.

    Behind a frozen embedding nothing before the first trainable tensor needs a gradient, so autograd keeps
    nothing there: the first norm always; the whole attention block when no q, k, v adapter sits in it; the
    MLP's internals too when only down is adapted. Later layers keep everything, since gradients must flow
    through them to the adapters below.
    """
    ft, beta, fw = workload.finetune, workload.precision.activation_bytes, workload.framework
    lin = linear_inputs(workload)
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
        inputs=lin,
    ) - (weight_grad + lin.own_bytes * h * split)  # frozen norm scale; no q, k, v adapter needs the QKV input
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
    block_in = lin.block_input_bytes(beta, moe_layer=moe_layer and model.moe is not None)
    mlp = act.mlp_bytes_per_token(
        model,
        tp=lay.tp,
        sp=lay.sp,
        act_bytes=beta,
        moe_layer=moe_layer,
        kernels=workload.kernels,
        framework=fw,
        inputs=lin,
    ) - (weight_grad + norm + block_in * h * split)  # the norm is counted above; no gate or up adapter
    return dead + mlp - lin.own_bytes * ffn / lay.tp  # down's adapter needs its input


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
        lin = linear_inputs(workload)
        dense_sel = none[0] - tokens * module_savings_per_token(model, lay, workload, moe_layer=False, lin=lin)
        moe_sel = none[1] - tokens * module_savings_per_token(model, lay, workload, moe_layer=True, lin=lin)
        if "core_attn" in workload.conditions.recompute_modules:
            dense_sel, moe_sel = dense_sel - (none[0] - core_dense), moe_sel - (none[1] - core_moe)
        return dense_sel, moe_sel
    if policy is Selective.OP:
        dense_op = tokens * op_checkpoint_per_token(model, lay, workload, moe_layer=False) + deltas[0]
        return dense_op, tokens * op_checkpoint_per_token(model, lay, workload, moe_layer=True) + deltas[1]
    if policy is Selective.KEEP:  # never more than keeping everything
        lin = linear_inputs(workload)
        dense_keep = tokens * keep_per_token(model, lay, workload, moe_layer=False, lin=lin) + deltas[0]
        moe_keep = tokens * keep_per_token(model, lay, workload, moe_layer=True, lin=lin) + deltas[1]
        return minimum(dense_keep, none[0]), minimum(moe_keep, none[1])
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
        routing_imbalance=act.busiest_rank_share(lay.ep, workload.conditions.routing_imbalance),
        etp=lay.etp,
        inputs=linear_inputs(workload),
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


def loss_peak_bytes(model: ModelSpec, *, tokens: Num, tp: Num, workload: Workload) -> Num:
    """The loss's peak for one micro-batch on the last stage, by the loss the run uses.

    framework: the framework's own (Megatron: fp32 softmax of the vocab-parallel logits, 4sbV/t; PyTorch as
    ``check`` measures it, 4sbV). upcast: ``cross_entropy(logits.float())``, 14 bytes per token and vocabulary
    entry at its backward (conditions.UPCAST_LOSS_BYTES), 16 on a PyTorch stack's loss-parallel DTensor logits
    (conditions.PARALLEL_UPCAST_LOSS_BYTES); bf16: without the upcast, 8 (conditions.BF16_LOSS_BYTES);
    fused: the upcast on one of 8 token chunks; compiled: the
    bf16 logits and their gradient, 4 bytes (conditions.COMPILED_LOSS_BYTES). Under
    loss parallelism the vocabulary is split over the TP group.
    """
    cond = workload.conditions
    split = where(act.vocab_parallel_loss(workload), tp, 1)
    if cond.loss is LossKind.FRAMEWORK:
        scalar = act.SAVED_TENSORS[workload.framework].loss_scalar_bytes
        return FP32_BYTES * tokens * model.vocab_size / split + scalar
    if cond.loss is LossKind.COMPILED:
        return COMPILED_LOSS_BYTES * tokens * model.vocab_size / split
    if cond.loss is LossKind.BF16:
        return BF16_LOSS_BYTES * tokens * model.vocab_size / split
    if cond.loss is LossKind.FUSED:
        return UPCAST_LOSS_BYTES * tokens * model.vocab_size / split / FUSED_LOSS_CHUNKS
    dtensor = (split > 1) & (workload.framework is Framework.TORCH)  # loss_parallel's decomposed backward
    return where(dtensor, PARALLEL_UPCAST_LOSS_BYTES, UPCAST_LOSS_BYTES) * tokens * model.vocab_size / split


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
