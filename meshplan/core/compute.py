"""Compute time of one layer on one GPU: matmuls on a roofline, memory-bound ops at HBM speed.

A matmul takes max(FLOPs / (peak * e), bytes / (HBM * e_hbm)) where
e = e_max * prod over M, N, K of d / (d + d_half): large GEMMs reach the GPU
kind's measured maximum achievable matmul throughput, thin ones (attention's
per-head products, small experts) fall off, and skinny ones become memory
bound. Norms, activations, residual adds, dropout, rotary, softmax and the
MoE permutation move bytes at HBM speed. Every kernel also pays a launch gap.
The constants are per GPU kind (catalog calibration), never per run.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.core.finetune import adapted_matrices, nf4_bytes_per_param
from meshplan.core.flops import Gemm, attention_core_flops, attention_gemms, mlp_gemms
from meshplan.core.num import Num, maximum, where
from meshplan.spec.cluster import GpuCalibration
from meshplan.spec.finetune import Finetune, FinetuneMode
from meshplan.spec.model import MlpKind, ModelSpec
from meshplan.spec.workload import Attention, Kernels

BACKWARD_FLASH_RATIO = 2.5
"""Backward FLOPs of fused attention over forward: 5 matmuls against 2 (Dao 2023, FlashAttention-2 Sec. 3)."""
BACKWARD_FLASH_EFFICIENCY = 0.8
"""Backward fused attention reaches this share of the forward kernel's efficiency (FlashAttention-2 Fig. 6-7)."""
EAGER_SCORE_BYTES_FWD = 13.0
"""Bytes moved per attention-score element in an unfused forward: QK^T output, scale-mask-softmax read and
write, dropout read, write and mask, AV input (2 + 4 + 5 + 2)."""
EAGER_SCORE_BYTES_BWD = 17.0
"""Bytes per score element in the unfused backward: dropout backward (grad, mask, out: 5), softmax backward
(probs, grad, out: 6), the score gradient written and read by the two products, probs read for dV (6)."""
KERNELS_PER_LAYER = 20
"""Kernels one layer's forward launches, counted item by item for a fused (Transformer Engine) layer, not
measured: 2 norms, 4 GEMMs (QKV, output, gate/up, down), 2 rotary, 1 attention, 2 bias-dropout-add, 1 gated
activation, 2-4 TP collectives, and the casts and amax updates around them; eager PyTorch launches more."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerTime:
    """Forward time of one layer for one micro-batch on one GPU, by kind of work."""

    gemm_s: Num
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

    @property
    def forward_s(self) -> Num:
        return self.gemm_s + self.attention_s + self.memory_s


FP8_CAST_BYTES_FWD = {False: 3.0, True: 0.0}
"""Bytes per input element an FP8 linear layer adds in forward (Transformer Engine), unfused (False): the bf16
input read and its FP8 copy written, amax fused in; fused kernels (True: LayerNormLinear, the fused activation)
write the FP8 copy in place of the bf16 one, at no extra cost. Weights are cast once per step, not counted."""
FP8_CAST_BYTES_BWD_GRAD = {False: 5.0, True: 4.0}
"""Per output-gradient element in backward: cast and transpose (read bf16, write the FP8 copy and its
transpose: 4 bytes fused in TE's cast_transpose, 3 + 2 as two kernels)."""
FP8_TRANSPOSE_BYTES_INPUT = 2.0
"""Per saved-input element in backward: the FP8 transpose the weight-gradient GEMM reads (read and write 1 byte)."""


def gemm_time(
    g: Gemm, *, peak_flops: float, hbm_bytes_per_s: float, cal: GpuCalibration, act_bytes: float, fp8: bool = False
) -> Num:
    """Roofline time of ``g`` with the size-dependent efficiency of the GPU kind (FP8: its FP8 share)."""
    d = cal.matmul_half_dim
    shape = (g.m / (g.m + d)) * (g.n / (g.n + d)) * (g.k / (g.k + d))
    e_max = cal.matmul_efficiency_max * (cal.fp8_matmul_ratio if fp8 else 1.0)
    compute = g.flops / (peak_flops * e_max * shape)
    traffic = act_bytes * (g.m * g.k + g.k * g.n + g.m * g.n) * g.count / (hbm_bytes_per_s * cal.hbm_efficiency)
    return maximum(compute, traffic)


def _memory_bytes_per_token(
    model: ModelSpec, *, tp: Num, sp: Num, moe_layer: bool, act_bytes: float, kernels: Kernels
) -> Num:
    """Bytes memory-bound ops of one layer's forward move per local token.

    Hidden-size work (two norms, read + write; two residual adds, read 2 +
    write 1; with dropout, fused into the add, one more 1-byte mask each) is
    split over tp only with SP; the MLP activation (gated:
    act and product, 5 f-wide passes; GELU: 2) and rotary (read+write of Q
    and K) are split over tp.
    """
    rep = where(sp, 1.0 / tp, 1.0)
    eager = kernels is Kernels.EAGER
    hidden_passes = 2 * (6 if eager else 2) + 2 * 3 + (1 if model.dropout else 0)
    act_passes = (5 if eager else 3) if model.mlp is MlpKind.GATED else 2
    if moe_layer and model.moe is not None:
        moe = model.moe
        ffn = moe.experts_per_token * moe.expert_ffn_hidden + moe.num_shared_experts * moe.shared_hidden
        permute = 4 * moe.experts_per_token * model.hidden  # dispatch and combine copies, read + write
    else:
        ffn, permute = model.ffn_hidden, 0
    rotary = 0 if model.learned_positions else 2 * (model.q_width + model.kv_width) / tp
    return act_bytes * (hidden_passes * model.hidden * rep + act_passes * ffn / tp + rotary + permute)


def layer_time(
    model: ModelSpec,
    *,
    tokens: Num,
    seq_len: Num,
    tp: Num,
    sp: Num,
    ep: Num,
    moe_layer: bool,
    attention: Attention,
    peak_flops: float,
    hbm_bytes_per_s: float,
    cal: GpuCalibration,
    act_bytes: float,
    kernels: Kernels = Kernels.FUSED,
    finetune: Finetune | None = None,
    frozen: bool = False,
    fp8: bool = False,
    bf16_peak_flops: float | None = None,
) -> LayerTime:
    """Forward and backward compute time of one layer for ``tokens`` local tokens on one GPU.

    A frozen base (LoRA, QLoRA, or a frozen layer) skips its weight-gradient matmuls: backward runs the
    input-gradient ones only. Adapters add skinny matmuls, memory bound: per adapted matrix and token, read
    x, write and read A x, write B A x and add it to the output. QLoRA dequantizes each NF4 matrix to bf16
    before every use (forward and backward): 4.127 bits read, 16 written and read again per weight.
    With ``fp8`` (Transformer Engine recipes), the linear layers run at the FP8 peak times the GPU kind's FP8
    share and pay the casts and transposes around them; attention runs at the bf16 peak.
    """
    hbm = hbm_bytes_per_s * cal.hbm_efficiency
    # FP8 runs the linear layers' GEMMs at FP8 (``peak_flops``); attention and its score products stay bf16
    bf16_peak = bf16_peak_flops if fp8 and bf16_peak_flops is not None else peak_flops

    def gemm_s_of(g: Gemm, linear: bool = False) -> Num:
        peak = peak_flops if linear else bf16_peak
        return gemm_time(
            g, peak_flops=peak, hbm_bytes_per_s=hbm_bytes_per_s, cal=cal, act_bytes=act_bytes, fp8=fp8 and linear
        )

    gemms = attention_gemms(model, tokens=tokens, tp=tp) + mlp_gemms(
        model, tokens=tokens, tp=tp, ep=ep, moe_layer=moe_layer
    )
    gemm_s = sum(gemm_s_of(g, linear=True) for g in gemms)
    cast_fwd: Num = 0.0
    cast_bwd: Num = 0.0
    if fp8:
        fused = kernels is Kernels.FUSED
        inputs = sum(g.m * g.k * g.count for g in gemms)
        outputs = sum(g.m * g.n * g.count for g in gemms)
        cast_fwd = inputs * FP8_CAST_BYTES_FWD[fused] / hbm
        cast_bwd = (outputs * FP8_CAST_BYTES_BWD_GRAD[fused] + inputs * FP8_TRANSPOSE_BYTES_INPUT) / hbm
    memory_s = (
        tokens
        * _memory_bytes_per_token(model, tp=tp, sp=sp, moe_layer=moe_layer, act_bytes=act_bytes, kernels=kernels)
        / hbm
    )
    if attention is Attention.FLASH:
        flops = attention_core_flops(model, tokens=tokens, seq_len=seq_len, tp=tp, causal_skip=True)
        attn_fwd = flops / (bf16_peak * cal.attention_efficiency)
        attn_bwd = BACKWARD_FLASH_RATIO * attn_fwd / BACKWARD_FLASH_EFFICIENCY
    else:
        heads = model.num_heads / tp
        d = model.mla.qk_head_dim if model.mla else model.head_dim
        scores = Gemm(name="scores", m=tokens, n=seq_len, k=d, count=heads)
        values = Gemm(name="values", m=tokens, n=d, k=seq_len, count=heads)
        products = gemm_s_of(scores) + gemm_s_of(values)
        traffic = EAGER_SCORE_BYTES_FWD * heads * tokens * seq_len / hbm
        attn_fwd = products + traffic
        attn_bwd = 2 * products + traffic * EAGER_SCORE_BYTES_BWD / EAGER_SCORE_BYTES_FWD
    launch = KERNELS_PER_LAYER * cal.kernel_overhead_s
    adapted = finetune is not None and finetune.adapted
    frozen_base = frozen or adapted
    adapter_fwd = 0.0
    if adapted and finetune is not None:
        adapter_fwd = tokens * act_bytes * _adapter_bytes_per_token(model, finetune, tp=tp, moe_layer=moe_layer) / hbm
        if finetune.mode is FinetuneMode.QLORA:
            weights = sum(g.n * g.k * g.count for g in gemms)
            dequant = weights * (nf4_bytes_per_param(double_quant=finetune.double_quant) + 4.0) / hbm
            gemm_s = gemm_s + dequant  # before the forward matmul; the backward matmul below pays it again
    weight_grad = 2 * adapter_fwd if frozen_base else gemm_s
    backward = gemm_s + weight_grad + 2 * adapter_fwd + attn_bwd + 2 * memory_s + 2 * launch + cast_bwd
    return LayerTime(
        gemm_s=gemm_s,
        attention_s=attn_fwd,
        memory_s=memory_s + launch + adapter_fwd + cast_fwd,
        backward_s=backward,
        weight_grad_s=weight_grad,
        attention_core_fwd_s=attn_fwd,
        attention_core_bwd_s=attn_bwd,
    )


def _adapter_bytes_per_token(model: ModelSpec, finetune: Finetune, *, tp: Num, moe_layer: bool) -> Num:
    """Elements one token's adapters move in forward (routed experts: the k experts it visits)."""
    total: Num = 0.0
    for m in adapted_matrices(model, moe_layer=moe_layer, targets=finetune.lora_targets):
        copies = model.moe.experts_per_token if m.routed and model.moe else m.count
        d_in, d_out = (m.d_in, m.d_out / tp) if m.column_parallel else (m.d_in / tp, m.d_out)
        total = total + copies * (d_in + 3 * d_out + 2 * finetune.lora_rank)
    return total


def head_time(
    model: ModelSpec,
    *,
    tokens: Num,
    tp: Num,
    peak_flops: float,
    hbm_bytes_per_s: float,
    cal: GpuCalibration,
    act_bytes: float,
) -> tuple[Num, Num]:
    """(forward, backward) time of the output head and the loss on the last stage."""
    g = Gemm(name="lm_head", m=tokens, n=model.vocab_size / tp, k=model.hidden)
    gemm = gemm_time(g, peak_flops=peak_flops, hbm_bytes_per_s=hbm_bytes_per_s, cal=cal, act_bytes=act_bytes)
    # fp32 upcast, log-softmax and its gradient: about four fp32 passes over the logits
    loss = 4 * 4.0 * tokens * model.vocab_size / tp / (hbm_bytes_per_s * cal.hbm_efficiency)
    return gemm + loss / 2, 2 * gemm + loss / 2
