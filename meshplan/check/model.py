"""A tiny Llama-style decoder (and its mixture-of-experts variant) in plain torch.

Module names follow torchtitan (``tok_embeddings``, ``layers.N.attention.wq``, ``feed_forward.w1`` ...) so that
the parallel plans in ``layouts.py`` read like the ones real training code uses. Shapes in comments:
b = micro-batch, s = sequence, h = hidden, a = heads, k = KV heads, d = head dim, f = FFN hidden, V = vocab,
E = experts, t = experts per token.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from meshplan.check.shapes import TinyConfig

# attention_fn(q, k, v) with q: (b, a, s, d), k and v: (b, k, s, d) -> (b, a, s, d)
AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# moe_fn(moe_module, x: (T, h), expert_ids: (T, t), gate_weights: (T, t)) -> (T, h)
MoEFn = Callable[["MoE", torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal grouped-query attention through the fused SDPA kernel."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])


def rotary_tables(cfg: TinyConfig, *, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (s, d) (rotate-half convention)."""
    pos = torch.arange(cfg.seq_len, dtype=torch.float32) if positions is None else positions.float()
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim)
    angles = torch.outer(pos, inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (b, s, heads, d); cos, sin: (s, d)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Attention(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(cfg.hidden, cfg.num_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.hidden, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.hidden, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden, bias=False)
        self.attention_fn: AttentionFn = sdpa_attention

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        # -1 heads: under tensor parallelism each rank holds a/tp query and k/tp KV heads
        q = apply_rotary(self.wq(x).view(b, s, -1, self.head_dim), cos, sin)
        k = apply_rotary(self.wk(x).view(b, s, -1, self.head_dim), cos, sin)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        out = self.attention_fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        projected: torch.Tensor = self.wo(out.transpose(1, 2).reshape(b, s, -1))
        return projected


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, hidden: int, ffn_hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn_hidden, bias=False)
        self.w2 = nn.Linear(ffn_hidden, hidden, bias=False)
        self.w3 = nn.Linear(hidden, ffn_hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return out


def local_moe(moe: MoE, x: torch.Tensor, expert_ids: torch.Tensor, gate_weights: torch.Tensor) -> torch.Tensor:
    """Every expert on this rank: route the (token, choice) pairs to their expert and sum the weighted outputs."""
    flat_ids = expert_ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    tokens = x[order // expert_ids.shape[1]]  # (T*t, h), grouped by expert
    counts = torch.bincount(flat_ids, minlength=moe.num_experts).tolist()
    out = moe.run_experts(tokens, counts)
    weighted = out * gate_weights.reshape(-1)[order, None]
    return torch.zeros_like(x).index_add(0, order // expert_ids.shape[1], weighted)


class MoE(nn.Module):
    """Top-t softmax router over E SwiGLU experts; experts stored as (E, ...) weights so EP can slice dim 0."""

    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.num_experts = cfg.num_experts
        self.top_k = cfg.experts_per_token
        self.router = nn.Linear(cfg.hidden, cfg.num_experts, bias=False)
        scale = cfg.hidden**-0.5
        self.w1 = nn.Parameter(torch.randn(cfg.num_experts, cfg.hidden, cfg.expert_ffn_hidden) * scale)
        self.w3 = nn.Parameter(torch.randn(cfg.num_experts, cfg.hidden, cfg.expert_ffn_hidden) * scale)
        self.w2 = nn.Parameter(torch.randn(cfg.num_experts, cfg.expert_ffn_hidden, cfg.hidden) * scale)
        self.dispatch: MoEFn = local_moe

    def run_experts(self, tokens: torch.Tensor, counts: list[int]) -> torch.Tensor:
        # tokens: (sum(counts), h), rows grouped by local expert; counts[e] rows for local expert e
        outs = []
        for e, chunk in enumerate(tokens.split(counts)):  # type: ignore[no-untyped-call]
            outs.append((F.silu(chunk @ self.w1[e]) * (chunk @ self.w3[e])) @ self.w2[e])
        return torch.cat(outs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        flat = x.reshape(b * s, h)
        scores = F.softmax(self.router(flat), dim=-1)
        gate_weights, expert_ids = scores.topk(self.top_k, dim=-1)
        return self.dispatch(self, flat, expert_ids, gate_weights).view(b, s, h)


class Block(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.feed_forward: nn.Module = MoE(cfg) if cfg.num_experts else FeedForward(cfg.hidden, cfg.ffn_hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        out: torch.Tensor = x + self.feed_forward(self.ffn_norm(x))
        return out


class TinyLlama(nn.Module):
    """Embedding, L blocks, final norm, untied output projection.

    Pipeline stages delete the modules they do not own (set them to None, drop layers from the ModuleDict),
    as torchtitan does, so ``forward`` takes token ids on the first stage and hidden states elsewhere.
    """

    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings: nn.Module | None = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.num_layers)})
        self.norm: nn.Module | None = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.output: nn.Module | None = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        cos, sin = rotary_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def set_positions(self, positions: torch.Tensor) -> None:
        """Rotary tables for a slice of the sequence (context parallelism keeps s/cp positions per rank)."""
        self.rope_cos, self.rope_sin = rotary_tables(self.cfg, positions=positions)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.rope_cos, self.rope_sin)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token loss; logits (b, s, V), targets (b, s)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
