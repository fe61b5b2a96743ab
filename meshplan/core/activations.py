"""Activations saved for backward, per token and per layer, on one GPU.

The accounting follows Korthikanti et al. 2022 (arXiv:2205.05198), Sec. 4 and
Table 2, which for a GPT layer without parallelism gives sbh(34 + 5as/h)
bytes, and is extended tensor by tensor to GQA, MLA, gated MLPs, fused
(flash) attention, context parallelism and routed experts:

    attention: norm input, QKV input, Q, K, V, attention output (the output
               projection's input), and either the fp32 log-sum-exp rows
               (flash) or the score matrix, its softmax and dropout (eager)
    mlp:       norm input, MLP input, the up/gate outputs and the
               down-projection input (four f-wide tensors for a gated MLP
               run eagerly: gate, up, act(gate) and act(gate) * up)
    moe:       router logits and probabilities (fp32), the dispatched token
               copies and expert outputs (k per token), expert internals
    dropout:   a 1-byte mask per dropout layer

Tensors inside the TP region are split over t; the rest (norm inputs,
dropout masks, the QKV/MLP inputs) are split over t only under sequence
parallelism. Context parallelism splits the tokens over cp, and each local
query still meets all s keys.
"""

from __future__ import annotations

from meshplan.core.num import Num, maximum, where
from meshplan.spec.layout import Recompute
from meshplan.spec.model import MlpKind, ModelSpec
from meshplan.spec.workload import Attention, Kernels

GATED_SAVED_TENSORS = {Kernels.EAGER: 4, Kernels.FUSED: 3}
"""f-wide tensors a gated MLP keeps: gate out, up out and act(gate) * up; run eagerly, act(gate) too."""
PLAIN_SAVED_TENSORS = 2
"""f-wide tensors a GELU MLP keeps: the up output (GELU input) and the GELU output."""
FP32_BYTES = 4


def _mlp_tensors(model: ModelSpec, kernels: Kernels) -> int:
    return GATED_SAVED_TENSORS[kernels] if model.mlp is MlpKind.GATED else PLAIN_SAVED_TENSORS


def attention_bytes_per_token(
    model: ModelSpec, *, seq_len: Num, tp: Num, sp: Num, attention: Attention, act_bytes: float, keep_scores: Num
) -> Num:
    """Bytes one attention block keeps per local token (norm included)."""
    rep = where(sp, 1.0 / tp, 1.0)
    beta, h, mask = act_bytes, model.hidden, 1.0 if model.dropout else 0.0
    replicated = (2 * beta + mask) * h * rep
    if model.mla is not None:
        mla = model.mla
        replicated = replicated + beta * (2 * mla.q_lora_rank + 2 * mla.kv_lora_rank + mla.qk_rope_head_dim)
        qkv = beta * model.num_heads * (2 * mla.qk_head_dim + mla.v_head_dim) / tp
    else:
        kv_per_rank = maximum(model.num_kv_heads / tp, 1.0) * model.head_dim
        qkv = beta * (model.q_width / tp + 2 * kv_per_rank)
    out = beta * model.attn_out_width / tp
    heads = model.num_heads / tp
    if attention is Attention.FLASH:
        core = FP32_BYTES * heads
    else:
        # softmax output (beta), and with dropout its 1-byte mask and beta-wide output; one row of s keys per query
        core = keep_scores * heads * seq_len * (beta + (1.0 + beta) * mask)
    return replicated + qkv + out + core


def mlp_bytes_per_token(
    model: ModelSpec, *, tp: Num, sp: Num, act_bytes: float, moe_layer: bool, kernels: Kernels = Kernels.FUSED
) -> Num:
    """Bytes one MLP (or MoE) block keeps per local token (norm included)."""
    rep = where(sp, 1.0 / tp, 1.0)
    beta, h, mask = act_bytes, model.hidden, 1.0 if model.dropout else 0.0
    replicated = (2 * beta + mask) * h * rep
    n = _mlp_tensors(model, kernels)
    if not moe_layer or model.moe is None:
        return replicated + n * beta * model.ffn_hidden / tp
    moe = model.moe
    k = moe.experts_per_token
    router = 2 * FP32_BYTES * moe.num_experts * rep
    routed = k * (2 * beta * h + n * beta * moe.expert_ffn_hidden / tp)
    shared = moe.num_shared_experts * n * beta * moe.shared_hidden / tp
    return replicated + router + routed + shared


def layer_input_bytes_per_token(model: ModelSpec, *, tp: Num, sp: Num, act_bytes: float) -> Num:
    """Bytes of a layer's input: all that full recomputation keeps (2sbh, or 2sbh/t with SP)."""
    return act_bytes * model.hidden * where(sp, 1.0 / tp, 1.0)


def layer_bytes(
    model: ModelSpec,
    *,
    seq_len: Num,
    micro_batch: Num,
    tp: Num,
    sp: Num,
    cp: Num,
    recompute: Num,
    attention: Attention,
    act_bytes: float,
    moe_layer: bool,
    kernels: Kernels = Kernels.FUSED,
) -> Num:
    """Bytes one layer keeps for one micro-batch under the given recompute policy."""
    tokens = seq_len / cp * micro_batch
    keep_scores = where(recompute == Recompute.NONE, 1.0, 0.0)
    kept = attention_bytes_per_token(
        model, seq_len=seq_len, tp=tp, sp=sp, attention=attention, act_bytes=act_bytes, keep_scores=keep_scores
    ) + mlp_bytes_per_token(model, tp=tp, sp=sp, act_bytes=act_bytes, moe_layer=moe_layer, kernels=kernels)
    full = layer_input_bytes_per_token(model, tp=tp, sp=sp, act_bytes=act_bytes)
    return tokens * where(recompute == Recompute.FULL, full, kept)


def korthikanti_layer_bytes(*, s: Num, b: Num, h: Num, a: Num, t: Num, sp: bool, selective: bool) -> Num:
    """Korthikanti et al. 2022 Table 2 for a GPT layer (16-bit activations, eager attention, dropout).

    sbh(10 + 24/t + 5as/(ht)) with TP; sbh(34/t + 5as/(ht)) with TP + SP;
    selective recomputation drops the 5as/(ht) term. Kept beside the
    tensor-by-tensor accounting above, which reduces to it for that block.
    """
    quadratic = 0.0 if selective else 5 * a * s / (h * t)
    linear = 34 / t if sp else 10 + 24 / t
    return s * b * h * (linear + quadratic)
