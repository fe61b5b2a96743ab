"""Compute time of one layer on one GPU: matmuls on a roofline, memory-bound ops at HBM speed.

A matmul takes max(FLOPs / (peak * e), bytes / (HBM * e_hbm)) where
e = e_max * prod over M, N, K of d / (d + d_half): large GEMMs reach the GPU
kind's measured maximum achievable matmul throughput, thin ones (attention's
per-head products, small experts) fall off, and skinny ones become memory
bound. Fused attention runs at the share of peak its kernel (FlashAttention-2,
cuDNN, FlashAttention-3) was published to reach at that sequence length, head
dim and mask on that GPU generation (core/time/attention_kernels.py). Norms,
activations, residual adds, dropout, rotary, softmax, FP8 casts and the MoE
permutation move bytes at HBM speed. Every kernel also pays a launch gap.
The constants are per GPU kind (catalog calibration), never per run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from meshplan.core.num import Num, maximum, minimum, where
from meshplan.core.pytorch.overheads import (
    keep_gemm_share,
    op_sac_share,
)
from meshplan.core.pytorch.ring_merge import ring_merge_time
from meshplan.core.time.adapters import adapter_time
from meshplan.core.time.attention_kernels import BACKWARD_FLOPS_RATIO, attention_shares
from meshplan.core.time.casts import fp8_cast_time
from meshplan.core.time.flops import Gemm, attention_core_flops, attention_gemms, mlp_gemms, windowed_keys_share
from meshplan.core.time.gemm import gemm_time
from meshplan.core.time.te_ring import te_ring_time
from meshplan.spec.cluster import AttentionKernel, GpuCalibration
from meshplan.spec.conditions import LossKind
from meshplan.spec.finetune import Finetune
from meshplan.spec.model import MlpKind, ModelSpec, NormKind
from meshplan.spec.workload import Attention, Framework, Kernels, Workload

EAGER_SCORE_BYTES_FWD = 13.0
"""Bytes moved per attention-score element in an unfused forward: QK^T output, scale-mask-softmax read and
write, dropout read, write and mask, AV input (2 + 4 + 5 + 2)."""
EAGER_SCORE_BYTES_BWD = 17.0
"""Bytes per score element in the unfused backward: dropout backward (grad, mask, out: 5), softmax backward
(probs, grad, out: 6), the score gradient written and read by the two products, probs read for dV (6)."""
KERNELS_PER_LAYER = {Kernels.FUSED: 20, Kernels.EAGER: 38}
"""Kernels one layer's forward launches, counted item by item, not measured. Fused (Transformer Engine,
torch.compile): 2 norms, 4 GEMMs (QKV, output, gate/up, down), 2 rotary, 1 attention, 2 bias-dropout-add, 1
gated activation, 2-4 TP collectives, and the casts and amax updates around them. Eager PyTorch (torchtitan's
Llama without torch.compile): 2 RMSNorms of 8 ops each (upcast, pow, mean, add, rsqrt, mul, downcast, weight),
7 GEMMs (q, k, v, output, w1, w3, w2), rotary on q and k (3 each: upcast to complex, multiply, downcast),
3 layout copies around SDPA, SDPA and its output copy (2), 2 residual adds, SiLU and the gate product (2)."""


EXPERT_GEMMS = ("expert_up", "expert_down")
"""The routed experts' matmuls (``flops.mlp_gemms``): one per local expert, on the tokens routed to it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerTime:
    """Forward time of one layer for one micro-batch on one GPU, by kind of work."""

    gemm_s: Num
    mlp_gemm_s: Num
    """The MLP's (or the experts') share of ``gemm_s``."""
    attention_s: Num
    """The attention core: fused kernel, or unfused products plus softmax and dropout traffic."""
    memory_s: Num
    """Norms, activations, residual adds, dropout, rotary and MoE permutes."""
    backward_s: Num
    """Backward of the whole layer (weight and input gradients, attention backward, memory ops)."""
    attention_core_fwd_s: Num
    """The attention core alone, forward (what selective recompute repeats)."""
    attention_core_bwd_s: Num
    weight_grad_s: Num
    """The weight-gradient matmuls of backward (the adapters' alone when the base is frozen)."""
    op_sac_gemm_s: Num
    """The matmuls torchtitan's per-op selective checkpointing recomputes (``pytorch.overheads.op_sac_share``)."""
    keep_gemm_s: Num = 0.0
    """The matmuls whose outputs ``--recompute-keep`` saves (``pytorch.overheads.keep_gemm_share``): what its
    recompute does not repeat."""
    mla_up_gemm_s: Num = 0.0
    """MLA's query and key/value up-projections (q_up, kv_up), of ``gemm_s``: what Megatron's selective
    recompute of ``mla_up_proj`` repeats."""
    shared_gemm_s: Num = 0.0
    """The shared experts' matmuls, of ``mlp_gemm_s`` (MoE layers): what recompute of ``shared_experts`` repeats."""
    tail_gemm_s: Num = 0.0
    """The layer's last matmul, the dense MLP's down projection, of ``mlp_gemm_s``: what full recompute with
    PyTorch's non-reentrant early stop does not repeat (``Conditions.recompute_early_stop``); 0 in MoE layers."""
    shard_copy_fwd_s: Num = 0.0
    """FSDP2's copies on the compute stream around the layer's forward (``shard_copy_bytes``), not recomputed."""
    shard_copy_bwd_s: Num = 0.0
    tp_copy_fwd_s: Num = 0.0
    """PyTorch's copies around the layer's sequence-parallel collectives (``tp_copy_bytes``), forward."""
    tp_copy_bwd_s: Num = 0.0
    """The same in backward, with what recompute repeats of them."""

    @property
    def forward_s(self) -> Num:
        return self.gemm_s + self.attention_s + self.memory_s


EAGER_NORM_PASSES = 18
"""An eager RMSNorm's traffic in 2-byte passes over its input (torchtitan's ``_norm(x.float()).type_as(x) * w``):
upcast (read 2, write 4), square (4, 4), mean (4), scale (4, 4), downcast (4, 2), weight (2, 2): 36 bytes.
LayerNorm is one PyTorch kernel even in eager mode: 2 passes."""
EAGER_ROTARY_PASSES = 10
"""Eager rotary embedding per q and k element (torchtitan's complex multiply): upcast (read 2, write 4), complex
product with the frequencies (4, 4), downcast (4, 2): 20 bytes, 10 passes of 2 (fused: one read, one write)."""


def _memory_bytes_per_token(
    model: ModelSpec,
    *,
    tp: Num,
    sp: Num,
    moe_layer: bool,
    act_bytes: float,
    kernels: Kernels,
    repeat_kv: bool = False,
    sorted_rows: Num = 0.0,
) -> Num:
    """Bytes memory-bound ops of one layer's forward move per local token.

    Hidden-size work (two norms, read + write; two residual adds, read 2 +
    write 1; with dropout, fused into the add, one more 1-byte mask each) is
    split over tp only with SP; the MLP activation (gated:
    act and product, 5 f-wide passes; GELU: 2) and rotary (read+write of Q
    and K) are split over tp. A MoE layer's permutation (the dispatch and
    combine copies, read + write of k rows of h each way) runs on the tokens
    its rank dispatches: s/t of them with SP, as its all-to-all does
    (core/comm/ep.py). ``sorted_rows``: the rows the all-to-all dispatcher sorts by local expert after the
    exchange and back before the combine, per row dispatched (Megatron-Core's ``sort_chunks_by_idxs`` where a
    rank holds more than one expert: the received rows, gathered over the expert-TP group; 0 with DeepEP,
    whose one permutation is the one above). ``repeat_kv``: K and V are copied to one head
    per query head before the attention (read the grouped, write the
    repeated; backward sums the repeated gradients back).
    """
    rep = where(sp, 1.0 / tp, 1.0)
    eager = kernels is Kernels.EAGER
    # eager LayerNorm is one PyTorch kernel (read, write); eager RMSNorm is a chain of them
    norm_passes = EAGER_NORM_PASSES if eager and model.norm is NormKind.RMSNORM else 2
    hidden_passes = 2 * norm_passes + 2 * 3 + (1 if model.dropout else 0)
    act_passes = (5 if eager else 3) if model.mlp is MlpKind.GATED else 2
    if moe_layer and model.moe is not None:
        moe = model.moe
        ffn = moe.experts_per_token * moe.expert_ffn_hidden + moe.num_shared_experts * moe.shared_hidden
        permute = 4 * moe.experts_per_token * model.hidden  # dispatch and combine copies, read + write
    else:
        ffn, permute = model.ffn_hidden, 0
    rotary_passes = EAGER_ROTARY_PASSES if eager else 2
    rotary = 0 if model.learned_positions else rotary_passes * (model.q_width + model.kv_width) / tp
    groups = model.num_heads / model.num_kv_heads
    repeat = 2 * model.kv_width * (1 + groups) / tp if repeat_kv and model.mla is None and groups > 1 else 0.0
    permute = permute * rep * (1 + sorted_rows)
    return act_bytes * (hidden_passes * model.hidden * rep + act_passes * ffn / tp + rotary + permute + repeat)


def attention_kernel(
    attention: Attention, kernels: Kernels, cal: GpuCalibration, *, sdpa: bool = False
) -> AttentionKernel:
    """The fused kernel a run uses: the one named, or the stack's. ``sdpa`` (a PyTorch-native stack) or eager
    kernels: PyTorch SDPA's flash backend, FlashAttention-2, compiled or not (torch.compile keeps SDPA's backend
    order, flash first on Hopper through PyTorch 2.10); otherwise Transformer Engine's choice, the GPU kind's
    fused kernel (cuDNN on Hopper: TE disables FlashAttention 'to give FusedAttention preference on Hopper+';
    FA2 on Ampere)."""
    if attention is not Attention.FLASH:
        return AttentionKernel(attention.value)
    if sdpa or kernels is Kernels.EAGER:
        return AttentionKernel.FA2
    return AttentionKernel(cal.fused_attention_kernel)


def resolved_attention(work: Workload, cal: GpuCalibration) -> str:
    """The attention kernel a run's step time assumes: fa2, fa3, cudnn, or eager (unfused)."""
    if not work.attention.fused:
        return Attention.EAGER.value
    return attention_kernel(work.attention, work.kernels, cal, sdpa=work.framework is Framework.TORCH).value


def _flash_time(
    model: ModelSpec,
    *,
    tokens: Num,
    seq_len: Num,
    kernel_keys: Num,
    tp: Num,
    kernel: AttentionKernel,
    peak: float,
    cal: GpuCalibration,
) -> tuple[Num, Num]:
    """(forward, backward) of the fused attention core at the published share of peak of its kernel, averaged
    over the layers.

    The tables' square blocks are looked up at ``kernel_keys``, the keys one kernel call walks per query tile
    (its inner loop): the sequence, or under ring CP the local block of s / cp (one block per ring step). A
    sliding-window layer reaches at most W keys a query (``windowed_keys_share`` of a full layer's work), its
    kernel walking at most W of them.
    """
    flops = attention_core_flops(model, tokens=tokens, seq_len=seq_len, tp=tp, causal_skip=True)

    def at(work: Num, keys: Num) -> tuple[Num, Num]:
        fwd_share, bwd_share = attention_shares(
            seq_len=keys,
            head_dim=model.score_value_width / 2,
            causal=True,
            kernel=kernel,
            generation=cal.attention_generation,
        )
        fwd = work / (peak * minimum(fwd_share * cal.attention_scale, 1.0))
        return fwd, BACKWARD_FLOPS_RATIO * work / (peak * minimum(bwd_share * cal.attention_scale, 1.0))

    full_fwd, full_bwd = at(flops, kernel_keys)
    if not model.sliding_window:
        return full_fwd, full_bwd
    window = model.sliding_window
    win_fwd, win_bwd = at(flops * windowed_keys_share(seq_len=seq_len, window=window), minimum(kernel_keys, window))
    share = model.sliding_share
    return (1 - share) * full_fwd + share * win_fwd, (1 - share) * full_bwd + share * win_bwd


def _eager_attention_time(
    model: ModelSpec, *, tokens: Num, seq_len: Num, tp: Num, hbm: Num, gemm_s: Callable[[Gemm], Num]
) -> tuple[Num, Num]:
    """(forward, backward) of unfused attention: two batched products per head and the score traffic."""
    heads = model.num_heads / tp
    d = model.mla.qk_head_dim if model.mla else model.head_dim
    scores = Gemm(name="scores", m=tokens, n=seq_len, k=d, count=heads)
    values = Gemm(name="values", m=tokens, n=d, k=seq_len, count=heads)
    products = gemm_s(scores) + gemm_s(values)
    traffic = EAGER_SCORE_BYTES_FWD * heads * tokens * seq_len / hbm
    return products + traffic, 2 * products + traffic * EAGER_SCORE_BYTES_BWD / EAGER_SCORE_BYTES_FWD


def _attention_time(
    model: ModelSpec, setup: ComputeSetup, *, tokens: Num, seq_len: Num, kernel_keys: Num, tp: Num
) -> tuple[Num, Num]:
    """(forward, backward) of the attention core, fused or not."""
    if not setup.attention.fused:
        return _eager_attention_time(model, tokens=tokens, seq_len=seq_len, tp=tp, hbm=setup.hbm, gemm_s=setup.gemm_s)
    kernel = attention_kernel(setup.attention, setup.kernels, setup.cal, sdpa=setup.sdpa)
    return _flash_time(
        model,
        tokens=tokens,
        seq_len=seq_len,
        kernel_keys=kernel_keys,
        tp=tp,
        kernel=kernel,
        peak=setup.bf16_peak_flops if setup.fp8 else setup.peak_flops,
        cal=setup.cal,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeSetup:
    """The GPU a layer runs on and how the stack runs it: what every layer of a layout shares."""

    peak_flops: float
    """Dense peak of the compute dtype (FP8's for FP8 recipes)."""
    bf16_peak_flops: float
    """Dense bf16 peak: under FP8, attention and its products run at it."""
    hbm_bytes_per_s: float
    cal: GpuCalibration
    act_bytes: float
    kernels: Kernels = Kernels.FUSED
    attention: Attention = Attention.FLASH
    fp8: bool = False
    fp8_dynamic: bool = False
    """FP8 linear layers are torchao's Float8Linear with dynamic scales (``fp8_cast_time``)."""
    fp8_weights_gathered: bool = False
    """FSDP all-gathers the weights already in FP8 (torchao's enable_fsdp_float8_all_gather)."""
    fp8_block_scaled: bool = False
    """FP8 linear layers scale each block of 32 elements (``--fp8-recipe mxfp8``: ``fp8_cast_time``)."""
    fp8_rowwise: bool = False
    """FP8 linear layers scale each row of each operand (torchao's rowwise recipe: ``fp8_cast_time``)."""
    repeat_kv: bool = False
    """K and V are repeated to the query heads before the attention (``Conditions.repeat_kv``)."""
    ring_merge: bool = False
    """Context parallelism is PyTorch's ring attention, merging every block in eager fp32 (pytorch/ring_merge.py)."""
    sdpa: bool = False
    """Attention is PyTorch's ``scaled_dot_product_attention`` (a PyTorch-native stack): ``flash`` is its flash
    backend whatever the launch mode (``attention_kernel``)."""
    te_ring: bool = False
    """A ring over the CP ranks is Transformer Engine's (Megatron-Core), correcting each step's output and adding
    the gradients in bf16 (te_ring.py)."""
    recompute_keep: tuple[str, ...] = ()
    """The tensors ``--recompute-keep`` saves (``Conditions.recompute_keep``)."""
    accumulate_bytes: float | None = None
    """Bytes per element of a weight gradient its GEMM moves when it adds into the main gradient in place, a read
    and a write (Megatron's --gradient-accumulation-fusion); None: it writes a fresh gradient (``act_bytes``)."""
    sorted_dispatch: bool = False
    """The tokens reach the experts through an all-to-all that lands them by source rank (``--ep-dispatch
    alltoall``), sorted by local expert after it and back before the combine (``_memory_bytes_per_token``)."""

    def gemm_s(self, g: Gemm, *, linear: bool = False) -> Num:
        """A GEMM's time: the linear layers' at the compute dtype's peak, the others at bf16's."""
        fp8 = self.fp8 and linear
        peak = self.peak_flops if linear or not self.fp8 else self.bf16_peak_flops
        return gemm_time(
            g, peak_flops=peak, hbm_bytes_per_s=self.hbm_bytes_per_s, cal=self.cal, act_bytes=self.act_bytes, fp8=fp8
        )

    @property
    def hbm(self) -> float:
        """The bandwidth memory-bound kernels reach."""
        return self.hbm_bytes_per_s * self.cal.hbm_efficiency


def _layer_casts(gemms: list[Gemm], setup: ComputeSetup, *, frozen: bool = False) -> tuple[Num, Num]:
    """(forward, backward) HBM time of the FP8 casts around a layer's linear layers (none without FP8; ``frozen``:
    their weights take no gradient)."""
    if not setup.fp8:
        return 0.0, 0.0
    return fp8_cast_time(
        gemms,
        fused=setup.kernels is Kernels.FUSED,
        hbm=setup.hbm,
        dynamic=setup.fp8_dynamic,
        weights_cast=not setup.fp8_weights_gathered,
        block_scaled=setup.fp8_block_scaled,
        rowwise=setup.fp8_rowwise,
        frozen=frozen,
    )


def _core_attention_time(
    model: ModelSpec, setup: ComputeSetup, *, tokens: Num, seq_len: Num, keys: Num, tp: Num, cp: Num, ring_cp: Num
) -> tuple[Num, Num]:
    """(forward, backward) of the attention core, with the ring's own work where the stack does it: PyTorch's
    merging of every block under any CP, Transformer Engine's corrections where the CP ranks form a ring
    (``ring_cp``: the ring's ranks, 1 where K and V are all-gathered instead)."""
    fwd, bwd = _attention_time(model, setup, tokens=tokens, seq_len=seq_len, kernel_keys=keys, tp=tp)
    if model.mla is not None or not (setup.ring_merge or setup.te_ring):
        return fwd, bwd
    if setup.te_ring:
        te_fwd, te_bwd = te_ring_time(
            q_elements=tokens * model.q_width / tp, kv_elements=tokens * model.kv_width / tp, cp=ring_cp, hbm=setup.hbm
        )
        return fwd + te_fwd, bwd + te_bwd
    groups = model.num_heads / model.num_kv_heads if setup.repeat_kv else 1.0
    merge_fwd, merge_bwd = ring_merge_time(
        q_elements=tokens * model.q_width / tp, kv_elements=tokens * model.kv_width * groups / tp, cp=cp, hbm=setup.hbm
    )
    return fwd + merge_fwd, bwd + merge_bwd


def layer_time(
    model: ModelSpec,
    *,
    setup: ComputeSetup,
    tokens: Num,
    seq_len: Num,
    tp: Num,
    sp: Num,
    ep: Num,
    moe_layer: bool,
    etp: Num | None = None,
    finetune: Finetune | None = None,
    frozen: bool = False,
    kernel_keys: Num | None = None,
    cp: Num = 1,
    ring_cp: Num | None = None,
    shard_copy_bytes: tuple[Num, Num] = (0.0, 0.0),
    tp_copy_bytes: tuple[Num, Num] = (0.0, 0.0),
) -> LayerTime:
    """Forward and backward compute time of one layer for ``tokens`` local tokens on one GPU.

    A frozen base (LoRA, QLoRA, or a frozen layer) skips its weight-gradient matmuls; adapters add skinny,
    memory-bound ones. With ``setup.fp8`` (Transformer Engine recipes) the linear layers run at the FP8 peak
    times the kind's FP8 share and pay the casts around them. ``kernel_keys``: the keys a fused attention call
    walks (default ``seq_len``); ``ring_cp``: the CP ranks that form a ring (default ``cp``; 1 where K and V
    are all-gathered). ``shard_copy_bytes``: (forward, backward) bytes per weight element FSDP2 copies
    on the compute stream (``pytorch.overheads.fsdp2_copy_bytes``). ``tp_copy_bytes``: (forward, backward) bytes
    per token the functional collectives copy (``pytorch.overheads.tp_chunk_cat_bytes``).
    """
    cal, hbm, kernels = setup.cal, setup.hbm, setup.kernels
    mlp = mlp_gemms(model, tokens=tokens, tp=tp, ep=ep, moe_layer=moe_layer, etp=etp, sp=sp)
    gemms = attention_gemms(model, tokens=tokens, tp=tp) + mlp
    times = [setup.gemm_s(g, linear=True) for g in gemms]
    gemm_s = sum(times)
    op_sac = sum(t * op_sac_share(model, g, moe_layer=moe_layer) for g, t in zip(gemms, times, strict=True))
    keep = setup.recompute_keep
    kept = sum(t * keep_gemm_share(model, g, keep) for g, t in zip(gemms, times, strict=True)) if keep else 0.0
    weights = sum(g.n * g.k * g.count for g in gemms)
    adapted = finetune is not None and finetune.adapted
    cast_fwd, cast_bwd = _layer_casts(gemms, setup, frozen=frozen or adapted)
    sorted_rows: Num = 0.0
    if moe_layer and model.moe is not None and setup.sorted_dispatch:
        sorted_rows = where(model.moe.num_experts / ep > 1, tp if etp is None else etp, 0.0)
    bytes_per_token = _memory_bytes_per_token(
        model,
        tp=tp,
        sp=sp,
        moe_layer=moe_layer,
        act_bytes=setup.act_bytes,
        kernels=kernels,
        repeat_kv=setup.repeat_kv,
        sorted_rows=sorted_rows,
    )
    memory_s = tokens * bytes_per_token / hbm
    keys = seq_len if kernel_keys is None else kernel_keys
    ring = cp if ring_cp is None else ring_cp
    attn_fwd, attn_bwd = _core_attention_time(
        model, setup, tokens=tokens, seq_len=seq_len, keys=keys, tp=tp, cp=cp, ring_cp=ring
    )
    launch = KERNELS_PER_LAYER[kernels] * cal.kernel_overhead_s
    adapter_fwd: Num = 0.0
    adapter_wgrad: Num = 0.0
    adapter_dgrad: Num = 0.0
    if adapted and finetune is not None:
        adapters = adapter_time(
            model, finetune, gemms, tokens=tokens, tp=tp, moe_layer=moe_layer, act_bytes=setup.act_bytes, hbm=hbm
        )
        adapter_fwd, adapter_wgrad, adapter_dgrad = adapters.forward_s, adapters.weight_grad_s, adapters.input_grad_s
        gemm_s = gemm_s + adapters.dequant_s  # before the forward matmul; the backward matmul below pays it again
    # the routed experts' weight gradients contract over each expert's few tokens: their own, shallower shape,
    # and where the GEMM adds into the main gradient, that accumulator read and written at its own width
    acc = setup.act_bytes if setup.accumulate_bytes is None else setup.accumulate_bytes
    expert_wgrad = sum(
        (
            maximum(
                setup.gemm_s(Gemm(name=g.name, m=g.k, n=g.n, k=g.m, count=g.count), linear=True),
                (setup.act_bytes * (g.k * g.m + g.m * g.n) + acc * g.k * g.n) * g.count / hbm,
            )
            - t
            for g, t in zip(gemms, times, strict=True)
            if g.name in EXPERT_GEMMS
        ),
        0.0,
    )
    weight_grad = adapter_wgrad if (frozen or adapted) else gemm_s + expert_wgrad
    by_name = {g.name: t for g, t in zip(gemms, times, strict=True)}
    backward = gemm_s + weight_grad + adapter_dgrad + attn_bwd + 2 * memory_s + 2 * launch + cast_bwd
    return LayerTime(
        gemm_s=gemm_s,
        mlp_gemm_s=sum(times[len(gemms) - len(mlp) :]),  # the MLP's GEMMs come last
        attention_s=attn_fwd,
        memory_s=memory_s + launch + adapter_fwd + cast_fwd,
        backward_s=backward,
        weight_grad_s=weight_grad,
        op_sac_gemm_s=op_sac,
        keep_gemm_s=kept,
        mla_up_gemm_s=by_name.get("q_up", 0.0) + by_name.get("kv_up", 0.0),
        shared_gemm_s=by_name.get("shared_up", 0.0) + by_name.get("shared_down", 0.0),
        tail_gemm_s=by_name.get("mlp_down", 0.0),
        attention_core_fwd_s=attn_fwd,
        attention_core_bwd_s=attn_bwd,
        shard_copy_fwd_s=weights * shard_copy_bytes[0] / hbm,
        shard_copy_bwd_s=weights * shard_copy_bytes[1] / hbm,
        tp_copy_fwd_s=tokens * tp_copy_bytes[0] / hbm,
        tp_copy_bwd_s=tokens * tp_copy_bytes[1] / hbm,
    )


LOSS_BYTES = {
    LossKind.FRAMEWORK: (8.0, 8.0),
    LossKind.FUSED: (8.0, 8.0),
    LossKind.UPCAST: (22.0, 26.0),
    LossKind.BF16: (8.0, 10.0),
    LossKind.COMPILED: (2.0, 4.0),
}
"""(forward, backward) bytes per logit of the loss. A fused cross-entropy: about four fp32 passes over the logits,
half each way. ``cross_entropy(logits.float())`` in eager PyTorch, kernel by kernel: forward the upcast (read 2,
write 4) and log_softmax, whose rows of a 128K vocabulary fit no SM's shared memory, so it reads the row for the
maximum, again for the sum of exponentials and again to write the output (4 + 4 + 4 + 4): 22; backward
nll_loss's fp32 gradient written (4), log_softmax's backward reading it for the row sum (4), then it and the
saved output to write the input gradient (4 + 4 + 4), and the downcast to bf16 (4 + 2): 26. The same loss under
torch.compile: forward one read of the bf16 logits (Inductor's online softmax takes the maximum and the sum of
exponentials in one pass), backward that read again and the bf16 gradient written: 2 and 4. ``cross_entropy(logits)``
on bf16 logits, eager: log_softmax's three passes in bf16 (2 + 2 + 2 + 2) forward, 8; backward nll_loss's bf16
gradient (2) and log_softmax's backward (2 + 2 + 2 + 2), 10."""
MEGATRON_CE_BYTES = (38.0, 14.0)
"""Megatron-Core's unfused vocab-parallel cross-entropy (tensor_parallel/cross_entropy.py on ``logits.float()``,
language_module.py), pass by pass per logit element. Forward: the upcast (read 2, write 4), the max (read 4),
subtracting it (4, 4), exp in place (4, 4), the sum (4), the division in place (4, 4): 38. Backward: the
gradient scaled in place (4, 4) and cast back to bf16 (4, 2): 14."""


def head_time(
    model: ModelSpec,
    *,
    tokens: Num,
    tp: Num,
    peak_flops: float,
    hbm_bytes_per_s: float,
    cal: GpuCalibration,
    act_bytes: float,
    loss_bytes: tuple[float, float] = LOSS_BYTES[LossKind.FRAMEWORK],
    loss_split: Num | None = None,
) -> tuple[Num, Num]:
    """(forward, backward) time of the output head and the loss on the last stage (``loss_bytes``: what the
    loss moves per logit element in forward and backward; ``loss_split``: the ranks the loss's vocabulary is
    split over, ``tp`` by default, 1 where every TP rank runs it on the gathered logits)."""
    g = Gemm(name="lm_head", m=tokens, n=model.vocab_size / tp, k=model.hidden)
    gemm = gemm_time(g, peak_flops=peak_flops, hbm_bytes_per_s=hbm_bytes_per_s, cal=cal, act_bytes=act_bytes)
    split = tp if loss_split is None else loss_split
    logits_per_s = tokens * model.vocab_size / split / (hbm_bytes_per_s * cal.hbm_efficiency)
    return gemm + loss_bytes[0] * logits_per_s, 2 * gemm + loss_bytes[1] * logits_per_s
