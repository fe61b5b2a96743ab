"""FLOPs: the matmuls of one layer on one GPU, and the model FLOPs that MFU counts.

Conventions: a matmul of (M x K) by (K x N) is 2MNK FLOPs; backward is
twice forward for weight matmuls (input and weight gradients). Model FLOPs
per token (for MFU) are 6 x the matmul parameters a token touches plus the
attention score and value products under the causal mask, 6 L a (d_qk + d_v) s / 2:
PaLM's count (Chowdhery et al. 2022, App. B: 6N + 12 L H Q T with d_qk = d_v = Q)
with each query reaching s / 2 keys on average, as Megatron-LM's
``num_floating_point_operations`` halves it. Over the whole context (no halving)
the count equals Korthikanti et al. 2022 Eq. 7 for GPT models,
72 B L s h^2 (1 + s/6h + V/(12 h L)), and torchtitan's logged MFU.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.core.finetune import trainable_params
from meshplan.core.num import Num, maximum, where
from meshplan.core.params import count_params
from meshplan.spec.finetune import Finetune
from meshplan.spec.model import MlpKind, ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Gemm:
    """One forward matmul on one GPU: ``count`` calls of (m x k) @ (k x n)."""

    name: str
    m: Num
    n: Num
    k: Num
    count: Num = 1

    @property
    def flops(self) -> Num:
        return 2 * self.m * self.n * self.k * self.count


def attention_gemms(model: ModelSpec, *, tokens: Num, tp: Num) -> list[Gemm]:
    """Q/K/V and output projections of one layer for ``tokens`` local tokens."""
    h, t = model.hidden, tp
    if model.mla is not None:
        mla, a = model.mla, model.num_heads
        gemms = [Gemm(name="kv_down", m=tokens, n=mla.kv_lora_rank + mla.qk_rope_head_dim, k=h)]
        if mla.q_lora_rank:
            gemms += [
                Gemm(name="q_down", m=tokens, n=mla.q_lora_rank, k=h),
                Gemm(name="q_up", m=tokens, n=a * mla.qk_head_dim / t, k=mla.q_lora_rank),
            ]
        else:
            gemms.append(Gemm(name="q", m=tokens, n=a * mla.qk_head_dim / t, k=h))
        gemms.append(
            Gemm(name="kv_up", m=tokens, n=a * (mla.qk_nope_head_dim + mla.v_head_dim) / t, k=mla.kv_lora_rank)
        )
    else:
        gemms = [Gemm(name="qkv", m=tokens, n=(model.q_width + 2 * model.kv_width) / t, k=h)]
    gemms.append(Gemm(name="attn_out", m=tokens, n=h, k=model.attn_out_width / t))
    return gemms


def mlp_gemms(
    model: ModelSpec, *, tokens: Num, tp: Num, ep: Num, moe_layer: bool, etp: Num | None = None, sp: Num = False
) -> list[Gemm]:
    """MLP, or routed plus shared experts, of one layer on one GPU.

    Routed experts: each GPU runs its E/ep experts over the tokens routed to
    them, tokens * k in total when routing is balanced (k copies per token
    spread over ep ranks that each received tokens from ep ranks), each expert
    split over the expert-TP group (``etp``, default ``tp``). Under MoE parallel
    folding (``etp`` below ``tp``, sequence parallel) each rank dispatches its
    own tokens / tp and the expert-TP group gathers etp ranks' rows: an expert
    sees tokens k etp / (tp E/ep) rows at its 1/etp width (Megatron-Core's
    TEGroupedMLP; arXiv:2504.14960 Sec. 3), the same FLOPs as etp = tp in other
    shapes.
    """
    h, t = model.hidden, tp
    up = 2 if model.mlp is MlpKind.GATED else 1
    if not moe_layer or model.moe is None:
        f = model.ffn_hidden
        return [Gemm(name="mlp_up", m=tokens, n=up * f / t, k=h), Gemm(name="mlp_down", m=tokens, n=h, k=f / t)]
    moe = model.moe
    e_t = tp if etp is None else etp
    local_experts = moe.num_experts / ep
    per_expert = tokens * moe.experts_per_token * where(sp, e_t / tp, 1.0) / local_experts
    fe = moe.expert_ffn_hidden
    gemms = [
        Gemm(name="router", m=tokens, n=moe.num_experts, k=h),
        Gemm(name="expert_up", m=per_expert, n=up * fe / e_t, k=h, count=local_experts),
        Gemm(name="expert_down", m=per_expert, n=h, k=fe / e_t, count=local_experts),
    ]
    if moe.num_shared_experts:
        fs = moe.shared_hidden * moe.num_shared_experts
        gemms += [
            Gemm(name="shared_up", m=tokens, n=up * fs / t, k=h),
            Gemm(name="shared_down", m=tokens, n=h, k=fs / t),
        ]
    return gemms


def attention_core_flops(model: ModelSpec, *, tokens: Num, seq_len: Num, tp: Num, causal_skip: bool) -> Num:
    """Forward FLOPs of QK^T and AV for ``tokens`` local queries against ``seq_len`` keys.

    ``causal_skip``: a fused kernel skips the masked upper triangle (half the
    work); an unfused one computes the whole s x s product.
    """
    full = 2 * tokens * seq_len * model.num_heads * model.score_value_width / tp
    return full * (0.5 if causal_skip else 1.0)


def sliding_keys(*, window: int, cached: Num, chunk: Num) -> Num:
    """Keys a query of a ``chunk``-token causal chunk after ``cached`` tokens reaches on average in a layer with a
    ``window``-token sliding window: c0 + T/2 while the chunk ends within the window, W once it starts past it,
    and [(W - c0)(c0 + W)/2 + (c0 + T - W) W] / T when it crosses W (queries up to W reach their position, the
    later ones W)."""
    w = window
    end = cached + chunk
    crossing = ((w - cached) * (cached + w) / 2 + (end - w) * w) / maximum(chunk, 1e-30)
    return where(end <= w, cached + chunk / 2, where(cached >= w, float(w), crossing))


def windowed_keys_share(*, seq_len: Num, window: int) -> Num:
    """Work of a causal sliding-window layer over that of a causal full layer on a whole sequence: the keys a query
    reaches on average (``sliding_keys`` from position 0), W - W^2 / 2s, over s / 2 (1 up to s = W)."""
    s = maximum(seq_len, 1)
    return sliding_keys(window=window, cached=0.0, chunk=s) / (s / 2)


MFU_CONVENTION = (
    "mfu: model FLOPs per step (6 x the matmul parameters a token touches + 6 L a (d_qk + d_v) s / 2 per token: the "
    "attention under the causal mask, no recompute; PaLM App. B with Megatron-LM's causal halving) over step time "
    "x GPUs x the dense bf16 peak, whatever the matmuls' dtype; hfu: the FLOPs the kernels execute (recompute "
    "included; a fused attention kernel skips the masked half, an unfused one computes the whole product) over the "
    "same bf16 peak; mfu_fp8_peak: mfu's FLOPs over the dense FP8 peak, for runs with FP8 matmuls (null otherwise)"
)
"""How the reports count MFU and HFU (their ``mfu_convention``)."""


def model_flops_per_token(
    model: ModelSpec, *, seq_len: int, finetune: Finetune | None = None, causal: bool = True
) -> float:
    """Model FLOPs per trained token: 6 N_matmul + 6 L a (d_qk + d_v) s / 2 (no recompute, causal attention;
    ``causal`` False: over the whole context, 6 L a (d_qk + d_v) s).

    Fine-tuning counts what the step must compute: a frozen matmul needs its forward and its input
    gradient (4 N), an adapter 6 N; a frozen prefix behind a frozen embedding needs its forward only (2 N).
    """
    attention = attention_flops_per_token(model, seq_len=seq_len, causal=causal)
    total = matmul_flops_per_token(model) + attention
    if finetune is None or (not finetune.adapted and not finetune.freeze_layers):
        return total
    matmul = (total - attention) / 6
    if finetune.adapted:
        adapters = trainable_params(model, finetune).adapters
        return total - 2 * matmul + 6 * adapters
    frozen = trainable_params(model, finetune).frozen - (
        count_params(model).embedding if finetune.freeze_embeddings else 0
    )
    spared = 4 if finetune.freeze_embeddings else 2  # no backward at all, or no weight gradient
    return total - spared * frozen


def attention_flops_per_token(model: ModelSpec, *, seq_len: int, causal: bool = True) -> float:
    """Attention score and value products per trained token, forward and backward: 6 L a (d_qk + d_v) s over the
    whole context, half of it under the causal mask (a query reaches s / 2 keys on average)."""
    full = 6.0 * model.num_layers * model.num_heads * model.score_value_width * seq_len
    return full / 2 if causal else full


def executed_attention_flops_per_token(model: ModelSpec, *, seq_len: int, fused: bool) -> float:
    """The attention FLOPs per trained token the kernels execute, forward and backward: a fused kernel skips the
    masked blocks (the causal half; a sliding-window layer's queries reach their window, ``windowed_keys_share``),
    an unfused one computes the whole s x s product (``attention_core_flops``)."""
    if not fused:
        return attention_flops_per_token(model, seq_len=seq_len, causal=False)
    causal = attention_flops_per_token(model, seq_len=seq_len, causal=True)
    if not model.sliding_window:
        return causal
    window = float(windowed_keys_share(seq_len=seq_len, window=model.sliding_window))
    return causal * (1 - model.sliding_share + model.sliding_share * window)


def matmul_flops_per_token(model: ModelSpec) -> float:
    """6 x the matmul parameters a trained token touches (the output head included, the input lookup and the
    norms not)."""
    p = count_params(model)
    matmul = p.active_per_token - p.embedding  # the input lookup does no math; the head (or tied table) does
    if model.tied_embeddings:
        matmul += model.vocab_size * model.hidden
    norms = p.dense_layer.norms * p.num_dense_layers + p.moe_layer.norms * p.num_moe_layers + p.final_norm
    matmul -= norms
    return 6.0 * matmul


def korthikanti_model_flops(*, batch: Num, layers: Num, seq: Num, hidden: Num, vocab: Num) -> Num:
    """Korthikanti et al. 2022 Eq. 7: model FLOPs per iteration of a GPT model."""
    return 72 * batch * layers * seq * hidden**2 * (1 + seq / (6 * hidden) + vocab / (12 * hidden * layers))


def narayanan_flops(*, batch: Num, layers: Num, seq: Num, hidden: Num, vocab: Num) -> Num:
    """Narayanan et al. 2021 Eq. 3: FLOPs per iteration with full recomputation (4 forward passes)."""
    return 96 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def megatron_flops(
    *,
    batch: Num,
    layers: Num,
    seq: Num,
    hidden: Num,
    vocab: Num,
    ffn_hidden: Num,
    kv_heads: Num,
    heads: Num,
    gated: bool,
) -> Num:
    """Megatron-LM's model FLOPs per iteration (``num_floating_point_operations`` in training.py, 2024).

    12 B s l h^2 ((1 + g/a + s/h) + (f/h) x 1.5 if gated + V / (2 l h)): QKV, output projection, full
    (non-causal) attention scores and values, the MLP and the logits, forward and backward, no recompute.
    """
    attention = 1 + kv_heads / heads + seq / hidden
    mlp = ffn_hidden / hidden * (1.5 if gated else 1.0)
    return 12 * batch * seq * layers * hidden**2 * (attention + mlp + vocab / (2 * layers * hidden))


def megatron_core_flops(model: ModelSpec, *, batch: Num, seq: Num) -> Num:
    """Megatron-Core's model FLOPs per iteration (``num_floating_point_operations`` in megatron/training/training.py,
    2025), the count behind the TFLOP/s per GPU it logs: B s times the sum, per token, of

    - attention, per layer 12 h q (1 + g/a + s / 2h) for a query width q = a d_head: QKV and the output projection,
      and the causal half of the score and value products;
    - MLP, per layer 12 h x the width a token passes through (x 1.5 gated): the dense MLP's, or on a MoE layer the
      routed experts' (expert width x top-k) and the shared experts';
    - the logits, 6 h V.

    No router, norms or recompute. MLA and MTP terms are not written out: a model with either is refused.
    """
    if model.mla is not None or model.mtp_layers:
        raise ValueError(f"{model.name}: Megatron-Core's count is written here for GQA models without MTP only")
    h = model.hidden
    gated = 1.5 if model.mlp is MlpKind.GATED else 1.0
    mlp = model.ffn_hidden * gated * (model.num_layers - model.num_moe_layers)
    if model.moe is not None:
        moe = model.moe
        width = moe.expert_ffn_hidden * moe.experts_per_token + moe.shared_hidden * moe.num_shared_experts
        mlp += width * gated * model.num_moe_layers
    q = model.num_heads * model.head_dim
    attention = 12 * model.num_layers * h * q * (1 + model.num_kv_heads / model.num_heads + seq / (2 * h))
    return batch * seq * (12 * h * mlp + attention + 6 * h * model.vocab_size)


def six_nd(params: float, tokens: float) -> float:
    """The back-of-envelope 6 N D training FLOPs (Kaplan et al. 2020)."""
    return 6.0 * params * tokens
