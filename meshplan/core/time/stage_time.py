"""Per-stage compute of one micro-batch: each kind of layer timed once (compute.py), summed over the stage's
layers with what recompute repeats (full, selective by policy or by module, PyTorch's early stop), the output head
on the last stage, and the per-term maxima over the stages (the slowest stage's forward, backward, weight-gradient
and attention times, which step_time.py hides traffic behind)."""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.core import finetune
from meshplan.core.comm.patterns import PATTERNS
from meshplan.core.comm.tp import gather_bytes_per_element, selective_replays
from meshplan.core.memory.activations import vocab_parallel_loss
from meshplan.core.num import Num, maximum, minimum, where
from meshplan.core.pytorch.overheads import fsdp2_copy_bytes, tp_chunk_cat_bytes
from meshplan.core.pytorch.shards import gather_bytes
from meshplan.core.stages import StageRow, stage_row
from meshplan.core.time.compute import LOSS_BYTES, MEGATRON_CE_BYTES, ComputeSetup, LayerTime, head_time, layer_time
from meshplan.core.time.flops import Gemm
from meshplan.core.time.host import HostLayer, host_layer, host_stall_s, launch_of
from meshplan.spec.cluster import Cluster
from meshplan.spec.conditions import EpDispatch, Fp8Recipe, LossKind, Selective
from meshplan.spec.layout import ContextParallel, LayoutLike, Recompute, Schedule, ZeroStage
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Framework, Workload
from meshplan.units import DType


@dataclass(frozen=True, slots=True, kw_only=True)
class StageTimes:
    """One micro-batch through the slowest pipeline stage (per-term maxima over the stages)."""

    fwd_compute_s: Num
    bwd_compute_s: Num
    """Backward compute, recompute included."""
    weight_grad_s: Num
    """The weight-gradient matmuls of backward: what backward TP traffic can hide behind."""
    attention_fwd_s: Num
    attention_bwd_s: Num
    dense_layers: Num
    moe_layers: Num
    host_layer_s: Num = 0.0
    """Host seconds to issue one layer's kernels for one micro-batch (forward, backward, recompute), the stage's
    costliest kind of layer (``core/time/host.py``)."""
    gpu_layer_s: Num = 0.0
    """GPU seconds of the same layer's work, before the host floor."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerKinds:
    """The times of the kinds of layer a stage holds, and of the output head on the last stage."""

    dense: LayerTime
    moe: LayerTime
    frozen_dense: LayerTime
    """A dense layer of a frozen prefix (no weight gradients)."""
    head_fwd_s: Num
    head_bwd_s: Num
    host_dense: HostLayer
    """Host seconds to issue a dense layer's kernels (core/time/host.py)."""
    host_moe: HostLayer
    mtp_extra_fwd_s: Num = 0.0
    """One multi-token-prediction module beyond its transformer layer: the projection of the joined hidden
    state and next-token embedding (2h -> h) and the shared output head with its loss, again."""
    mtp_extra_bwd_s: Num = 0.0


def layer_kinds(model: ModelSpec, lay: LayoutLike, work: Workload, cluster: Cluster) -> LayerKinds:
    """Every layer of a kind takes the same time: each kind is computed once per layout."""
    gpu = cluster.gpu
    peak = gpu.peak(work.precision.compute)
    fp8 = work.precision.compute is DType.FP8
    mx = work.conditions.fp8_recipe is Fp8Recipe.MXFP8
    if mx and not gpu.block_scaled_mma:
        raise ValueError(
            f"--fp8-recipe mxfp8 needs tensor cores that scale blocks inside the matmul (Blackwell: b200, gb200); "
            f"{gpu.name} has none"
        )
    tokens = work.seq_len / lay.cp * lay.micro_batch
    setup = ComputeSetup(
        peak_flops=peak,
        bf16_peak_flops=gpu.peak(DType.BF16),
        hbm_bytes_per_s=gpu.hbm_bandwidth_bytes_per_s,
        cal=gpu.calibration,
        act_bytes=work.precision.activation_bytes,
        kernels=work.kernels,
        attention=work.attention,
        fp8=fp8,
        # PyTorch-native stacks run FP8 through torchao's Float8Linear, whose scales are dynamic (not delayed)
        fp8_dynamic=fp8 and work.framework is Framework.TORCH and work.conditions.fp8_recipe is not Fp8Recipe.DELAYED,
        fp8_weights_gathered=work.conditions.fp8_all_gather,
        fp8_block_scaled=mx,
        fp8_rowwise=work.conditions.fp8_recipe is Fp8Recipe.ROWWISE,
        repeat_kv=work.conditions.repeat_kv,
        ring_merge=work.framework is Framework.TORCH,
        sdpa=work.framework is Framework.TORCH,
        te_ring=work.framework is Framework.MEGATRON,
        recompute_keep=work.conditions.recompute_keep if work.conditions.selective is Selective.KEEP else (),
        sorted_dispatch=work.conditions.ep_dispatch is EpDispatch.ALLTOALL,
        accumulate_bytes=2 * work.precision.grad_bytes
        if work.framework is Framework.MEGATRON and work.conditions.grad_accum_fusion
        else None,
    )
    span = work.attention_span  # the sequence, or its document when packed documents attend within themselves
    common = dict(
        setup=setup,
        tokens=tokens,
        seq_len=span,
        tp=lay.tp,
        sp=lay.sp,
        ep=lay.ep,
        etp=lay.etp,
        # ring CP: one s/cp block of keys per step; all-gathered K/V: the whole sequence (Llama 3 Sec. 3.3.2);
        # packed documents: a query's keys end with its document, and so does each variable-length kernel call
        kernel_keys=minimum(
            where(lay.cp_kind == ContextParallel.ALL_GATHER, work.seq_len, work.seq_len / lay.cp), span
        ),
        cp=lay.cp,
        ring_cp=where(lay.cp_kind == ContextParallel.ALL_GATHER, 1, lay.cp),
        finetune=work.finetune,
        shard_copy_bytes=_shard_copy_bytes(lay, work),
        tp_copy_bytes=_tp_copy_bytes(model, lay, work),
    )
    dense = layer_time(model, moe_layer=False, **common)
    head_f, head_b = head_time(
        model,
        tokens=tokens,
        tp=lay.tp,
        peak_flops=gpu.peak(DType.BF16) if fp8 else peak,
        hbm_bytes_per_s=gpu.hbm_bandwidth_bytes_per_s,
        cal=gpu.calibration,
        act_bytes=work.precision.activation_bytes,
        loss_bytes=MEGATRON_CE_BYTES if _unfused_megatron_loss(work) else LOSS_BYTES[work.conditions.loss],
        loss_split=where(vocab_parallel_loss(work), lay.tp, 1),
    )
    # DeepSeek-V3 Sec. 2.2: each MTP module is a transformer layer (a MoE one), a projection M of [h; emb] from 2h
    # to h, and the shared output head; Megatron-Core trains it on the last pipeline stage
    proj = setup.gemm_s(Gemm(name="mtp_proj", m=tokens, n=model.hidden / lay.tp, k=2 * model.hidden), linear=True)
    launch = launch_of(work.conditions.launch, kernels=work.kernels, framework=work.framework)
    host = dict(
        kernels=work.kernels, launch=launch, framework=work.framework, tp=lay.tp, sp=lay.sp, speed=cluster.host_speed
    )
    return LayerKinds(
        host_dense=host_layer(model, moe_layer=False, **host),
        host_moe=host_layer(
            model, moe_layer=True, local_experts=model.moe.num_experts / lay.ep if model.moe else 1, **host
        ),
        mtp_extra_fwd_s=proj + head_f,
        mtp_extra_bwd_s=2 * proj + head_b,
        dense=dense,
        moe=layer_time(model, moe_layer=True, **common),
        # full fine-tuning with a frozen prefix: those layers skip their weight gradients
        frozen_dense=layer_time(model, moe_layer=False, frozen=True, **common)
        if work.finetune.freeze_layers
        else dense,
        head_fwd_s=head_f,
        head_bwd_s=head_b,
    )


def _shard_copy_bytes(lay: LayoutLike, work: Workload) -> tuple[Num, Num]:
    """FSDP2's per-layer copies (``--fsdp-copies`` with ZeRO-3 over more than one rank), or none."""
    if not work.conditions.fsdp_copies:
        return 0.0, 0.0
    prec = work.precision
    fwd, bwd = fsdp2_copy_bytes(
        gathered=gather_bytes(prec, fp8=work.conditions.fp8_all_gather),
        act_bytes=prec.activation_bytes,
        grad_bytes=prec.grad_bytes,
    )
    on = fsdp_shards(lay)
    return where(on, fwd, 0.0), where(on, bwd, 0.0)


def _tp_copy_bytes(model: ModelSpec, lay: LayoutLike, work: Workload) -> tuple[Num, Num]:
    """PyTorch's copies around sequence-parallel collectives (``pytorch.overheads.tp_chunk_cat_bytes``), or none."""
    if not PATTERNS[work.framework].torch_native:
        return 0.0, 0.0
    gathers, scatters = selective_replays(lay, work)
    fwd, bwd = tp_chunk_cat_bytes(
        width_bytes=model.hidden * work.precision.activation_bytes,
        gather_width_bytes=model.hidden * gather_bytes_per_element(work),
        micro_batch=lay.micro_batch,
        replayed_gathers=gathers,
        replayed_scatters=scatters,
        full=where(lay.recompute == Recompute.FULL, 1.0, 0.0),
        fused=work.overlap.tp,
    )
    on = lay.sp & (lay.tp > 1)
    return where(on, fwd, 0.0), where(on, bwd, 0.0)


def fsdp_shards(lay: LayoutLike) -> Num:
    """ZeRO-3 / FSDP over more than one rank: what the per-layer copies and PyTorch's Partial norm gradients ask."""
    return (lay.zero >= ZeroStage.PARAMETERS) & (lay.dp_shard * lay.cp > 1)


def _unfused_megatron_loss(work: Workload) -> bool:
    """Megatron's own loss without --cross-entropy-loss-fusion: the pass-by-pass vocab-parallel cross-entropy."""
    cond = work.conditions
    return work.framework is Framework.MEGATRON and cond.loss is LossKind.FRAMEWORK and not cond.loss_fusion


def selective_redo_s(
    lt: LayerTime, policy: Selective, modules: tuple[str, ...], *, moe_layer: bool = False, keep: tuple[str, ...] = ()
) -> Num:
    """Forward time one layer repeats in backward under ``--recompute selective``, as each stack defines it.

    Megatron: the attention core (Korthikanti et al. 2022 Sec. 5), or its --recompute-modules, module by module
    as Megatron-Core's TransformerLayer and MLASelfAttention checkpoint them: core_attn the attention core;
    layernorm or moe_act the elementwise work, all of it (an upper bound); mlp a dense layer's MLP matmuls only
    (``recompute_mlp`` is set only where the layer's MLP is not a MoELayer); moe the MoE block's matmuls;
    shared_experts the shared experts' matmuls; mla_up_proj MLA's query and key/value up-projections
    (``qkv_up_proj_and_rope_apply``: linear_q_up_proj and linear_kv_up_proj, the rotary part elementwise and
    left out). torchtitan's per-op policy recomputes every second matmul (wk, wo, w3) and all the elementwise
    work but saves the attention output; its per-layer policy (ac_freq 2) recomputes every second layer whole.
    A save list (``--recompute-keep``) reruns the whole forward but the matmuls whose outputs it kept and, when it
    kept the attention output, the attention kernel: torch.utils.checkpoint replays the layer's forward, and each
    saved op hands back its output instead of running.
    """
    if policy is Selective.KEEP:
        return lt.forward_s - lt.keep_gemm_s - (lt.attention_core_fwd_s if "attn" in keep else 0.0)
    if policy is Selective.OP:
        return lt.op_sac_gemm_s + lt.memory_s
    if policy is Selective.LAYER:
        return lt.forward_s / 2
    if policy is Selective.MODULES:
        mods = set(modules)
        core = lt.attention_core_fwd_s if "core_attn" in mods else 0.0
        elementwise = lt.memory_s if {"layernorm", "moe_act"} & mods else 0.0
        block = "moe" if moe_layer else "mlp"
        mlp = lt.mlp_gemm_s if block in mods else (lt.shared_gemm_s if "shared_experts" in mods else 0.0)
        up = lt.mla_up_gemm_s if "mla_up_proj" in mods else 0.0
        return core + elementwise + mlp + up
    return lt.attention_core_fwd_s


def _stage_values(
    model: ModelSpec, kinds: LayerKinds, lay: LayoutLike, work: Workload, row: StageRow
) -> dict[str, Num]:
    """One stage's terms: its layers' times scaled by its layer counts, recompute and the head added."""
    dense, moe, ft, cond = kinds.dense, kinds.moe, work.finetune, work.conditions
    last = row.head == 1
    mtp = where(last, model.mtp_layers, 0)  # the MTP modules' layers run on the last stage, after the head
    n_dense, n_moe = row.dense_layers, row.moe_layers + mtp
    fwd = n_dense * dense.forward_s + n_moe * moe.forward_s
    copies = n_dense * dense.shard_copy_fwd_s + n_moe * moe.shard_copy_fwd_s  # before each forward, not recomputed
    attn_fwd = n_dense * dense.attention_core_fwd_s + n_moe * moe.attention_core_fwd_s
    # Megatron's block method: full recompute of the first k layers of the stage only
    full_share = (
        1.0 if cond.recompute_layers is None else minimum(cond.recompute_layers, row.layers) / maximum(row.layers, 1)
    )
    keep = cond.recompute_keep
    selective = n_dense * selective_redo_s(
        dense, cond.selective, cond.recompute_modules, keep=keep
    ) + n_moe * selective_redo_s(moe, cond.selective, cond.recompute_modules, moe_layer=True, keep=keep)
    # PyTorch's non-reentrant checkpoint stops before the block's last matmul (Conditions.recompute_early_stop)
    tail = n_dense * dense.tail_gemm_s + n_moe * moe.tail_gemm_s if cond.recompute_early_stop else 0.0
    recompute = lay.recompute
    redo = where(
        recompute == Recompute.FULL, full_share * (fwd - tail), where(recompute == Recompute.SELECTIVE, selective, 0.0)
    )
    bwd = n_dense * dense.backward_s + n_moe * moe.backward_s
    wgrad = n_dense * dense.weight_grad_s + n_moe * moe.weight_grad_s
    if ft.freeze_layers:  # behind a frozen embedding a frozen prefix needs no backward at all
        n_frozen = minimum(finetune.frozen_leading_layers(ft, first=row.first_layer, layers=row.layers), n_dense)
        kept = 0.0 if ft.freeze_embeddings else kinds.frozen_dense.backward_s
        bwd = bwd - n_frozen * (dense.backward_s - kept)
        wgrad = wgrad - n_frozen * dense.weight_grad_s
    copies = copies + n_dense * dense.tp_copy_fwd_s + n_moe * moe.tp_copy_fwd_s
    share = where(recompute == Recompute.FULL, full_share, 0.0)
    floors = [_host_floor(lt, h, share) for lt, h in ((dense, kinds.host_dense), (moe, kinds.host_moe))]
    (stall_f_d, stall_b_d, host_d, gpu_d), (stall_f_m, stall_b_m, host_m, gpu_m) = floors
    moe_kind = n_moe > 0
    return {
        "host_layer_s": where(moe_kind, host_m, host_d),
        "gpu_layer_s": where(moe_kind, gpu_m, gpu_d),
        "fwd_compute_s": fwd
        + copies
        + n_dense * stall_f_d
        + n_moe * stall_f_m
        + where(last, kinds.head_fwd_s, 0.0)
        + mtp * kinds.mtp_extra_fwd_s,
        "bwd_compute_s": n_dense * stall_b_d
        + n_moe * stall_b_m
        + bwd
        + n_dense * (dense.shard_copy_bwd_s + dense.tp_copy_bwd_s)
        + n_moe * (moe.shard_copy_bwd_s + moe.tp_copy_bwd_s)
        + redo
        + where(last, kinds.head_bwd_s, 0.0)
        + mtp * kinds.mtp_extra_bwd_s,
        "weight_grad_s": wgrad,
        "attention_fwd_s": attn_fwd,
        "attention_bwd_s": n_dense * dense.attention_core_bwd_s + n_moe * moe.attention_core_bwd_s,
        "dense_layers": n_dense,
        "moe_layers": n_moe,
    }


def _host_floor(lt: LayerTime, host: HostLayer, recomputed: Num) -> tuple[Num, Num, Num, Num]:
    """(forward stall, backward stall, host seconds, GPU seconds) of one layer and micro-batch under the host floor:
    each phase takes max(GPU, host), the backward phase with the ``recomputed`` share of the forward it repeats."""
    gpu_f = lt.forward_s + lt.shard_copy_fwd_s + lt.tp_copy_fwd_s
    gpu_b = lt.backward_s + lt.shard_copy_bwd_s + lt.tp_copy_bwd_s + recomputed * lt.forward_s
    host_b = host.backward_s + recomputed * host.forward_s
    stall_f = host_stall_s(host_s=host.forward_s, gpu_s=gpu_f)
    stall_b = host_stall_s(host_s=host_b, gpu_s=gpu_b)
    return stall_f, stall_b, host.forward_s + host_b, gpu_f + gpu_b


def stage_times(
    model: ModelSpec, lay: LayoutLike, work: Workload, cluster: Cluster, *, stages: tuple[Num, ...]
) -> StageTimes:
    """Compute time of one micro-batch on the slowest of ``stages`` (per-term maxima over them).

    A DualPipe rank holds two stages, i and p-1-i (DeepSeek-V3 Sec. 3.2.1), and runs half the micro-batches
    through each: its per-copy terms are the mean of the pair's (``pipeline.stage_copies`` counts the two).
    """
    kinds = layer_kinds(model, lay, work, cluster)
    split = work.conditions.stage_split
    dual = lay.schedule == Schedule.DUALPIPE
    worst: dict[str, Num] = {}
    for stage in stages:
        values = _stage_values(model, kinds, lay, work, stage_row(model, pp=lay.pp, stage=stage, split=split))
        mirror = _stage_values(
            model, kinds, lay, work, stage_row(model, pp=lay.pp, stage=lay.pp - 1 - stage, split=split)
        )
        values = {k: where(dual, (v + mirror[k]) / 2, v) for k, v in values.items()}
        worst = {k: maximum(worst[k], v) for k, v in values.items()} if worst else values
    return StageTimes(**worst)
