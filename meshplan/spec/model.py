"""ModelSpec: the shape of a transformer, and nothing else.

Architecture differences (GQA, MLA, MoE, sliding windows, gated MLPs) are
fields here, never ``if family == ...`` branches in the formulas.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class MlpKind(StrEnum):
    """Shape of the feed-forward block."""

    GATED = "gated"
    """SwiGLU / GeGLU: gate and up projections, then down (three matrices)."""
    PLAIN = "plain"
    """GELU MLP of GPT and Megatron: up, then down (two matrices)."""


class NormKind(StrEnum):
    """Normalization layer: decides whether a norm has a bias vector."""

    RMSNORM = "rmsnorm"
    """RMSNorm: one scale vector."""
    LAYERNORM = "layernorm"
    """LayerNorm: a scale and a bias vector."""


# Physical bounds: each is far above any model built (Llama 3.1 405B: 126 layers, hidden 16,384, vocab 128,256;
# DeepSeek-V3: 256 experts) and low enough that no product of them overflows int64 in the vectorized core.
MAX_LAYERS = 4_096
MAX_WIDTH = 1 << 20
"""Hidden size, FFN width, head dimension and latent ranks."""
MAX_HEADS = 1 << 14
MAX_VOCAB = 1 << 24
MAX_EXPERTS = 1 << 14
MAX_POSITIONS = 1 << 30
"""Context lengths, sliding windows and learned position tables, in tokens."""
MAX_PARAMS = 10**15
"""A million billion parameters: about 2,500 times Llama 3.1 405B."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _bounded(limit: int, *, low: int = 1, **values: int) -> None:
    """Each value an integer in [low, limit]; the message names the field and shows both sides."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        if low == 1:
            _require(value > 0, f"{name} must be a positive integer, got {value!r}")
        else:
            _require(value >= low, f"{name} must be >= {low}, got {value!r}")
        _require(value <= limit, f"{name}={value} is above the limit of {limit:,}")


def _positive(**values: int) -> None:
    _bounded(MAX_WIDTH, **values)


@dataclass(frozen=True, slots=True, kw_only=True)
class MoESpec:
    """Mixture-of-experts feed-forward layers."""

    num_experts: int
    """Routed experts per MoE layer."""
    experts_per_token: int
    """Routed experts each token visits (top-k)."""
    expert_ffn_hidden: int
    """Intermediate size of one routed expert."""
    num_shared_experts: int = 0
    """Experts every token visits (DeepSeek, Qwen2-MoE)."""
    shared_ffn_hidden: int = 0
    """Intermediate size of one shared expert (0: same as a routed expert)."""
    num_dense_layers: int = 0
    """Leading layers that keep a dense MLP (DeepSeek-V3: the first 3)."""
    router_bias: bool = False
    """A per-expert bias on the router scores (DeepSeek-V3's correction bias)."""
    shared_expert_gate: bool = False
    """A sigmoid gate (hidden -> 1) on the shared expert (Qwen2-MoE)."""
    max_nodes_per_token: int = 0
    """Node-limited routing: each token reaches experts on at most this many nodes, sent once per node and
    forwarded over NVLink inside it (DeepSeek-V3: 4, Sec. 2.1.2 and 3.2.2); 0: unlimited."""

    def __post_init__(self) -> None:
        _bounded(MAX_EXPERTS, num_experts=self.num_experts)
        _positive(
            experts_per_token=self.experts_per_token,
            expert_ffn_hidden=self.expert_ffn_hidden,
        )
        _require(
            self.experts_per_token <= self.num_experts,
            f"experts_per_token={self.experts_per_token} must not exceed num_experts={self.num_experts}",
        )
        _bounded(MAX_EXPERTS, low=0, num_shared_experts=self.num_shared_experts)
        _bounded(MAX_LAYERS, low=0, num_dense_layers=self.num_dense_layers)
        _bounded(MAX_WIDTH, low=0, shared_ffn_hidden=self.shared_ffn_hidden)

    @property
    def shared_hidden(self) -> int:
        """Intermediate size of one shared expert, resolved."""
        return self.shared_ffn_hidden or self.expert_ffn_hidden


@dataclass(frozen=True, slots=True, kw_only=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank Q and a compressed KV cache."""

    kv_lora_rank: int
    """Width of the compressed KV latent c_KV (the cache stores it)."""
    qk_rope_head_dim: int
    """Width of the decoupled RoPE key, shared by all heads (also cached)."""
    qk_nope_head_dim: int
    """Per-head query/key width without RoPE."""
    v_head_dim: int
    """Per-head value width."""
    q_lora_rank: int = 0
    """Width of the compressed query latent (0: a direct query projection)."""

    def __post_init__(self) -> None:
        _positive(
            kv_lora_rank=self.kv_lora_rank,
            qk_rope_head_dim=self.qk_rope_head_dim,
            qk_nope_head_dim=self.qk_nope_head_dim,
            v_head_dim=self.v_head_dim,
        )
        _bounded(MAX_WIDTH, low=0, q_lora_rank=self.q_lora_rank)

    @property
    def qk_head_dim(self) -> int:
        """Query/key width per head: the no-RoPE part plus the RoPE part."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer, by its shapes.

    Symbols (docs/notation.md): L = num_layers, h = hidden, a = num_heads,
    k = num_kv_heads, d = head_dim, f = ffn_hidden, V = vocab_size.
    """

    name: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden: int
    vocab_size: int
    mlp: MlpKind = MlpKind.GATED
    norm: NormKind = NormKind.RMSNORM
    tied_embeddings: bool = False
    learned_positions: int = 0
    """Rows of a learned position-embedding table (0: rotary, no table)."""
    qkv_bias: bool = False
    out_bias: bool = False
    """Bias on the attention output projection."""
    mlp_bias: bool = False
    qk_norm: bool = False
    """Per-head RMSNorm on queries and keys (Qwen3)."""
    attention_sinks: bool = False
    """A learned logit per query head that joins every softmax's denominator without a value (gpt-oss's sinks):
    a parameters per layer, split over TP with the heads; their FLOPs are nothing beside the scores'."""
    dropout: bool = False
    """Dropout layers in training (GPT-3 / Megatron models); adds 1-byte masks to activations."""
    sliding_window: int = 0
    """Window of the sliding-window attention layers, in tokens (0: none)."""
    num_sliding_layers: int = 0
    """How many layers use the sliding window (the rest attend to the full context)."""
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    mtp_layers: int = 0
    """Multi-token-prediction modules (DeepSeek-V3: 1); counted apart from the main model."""
    max_seq_len: int = 0
    """Longest context the model was trained for (informative; 0 if unknown)."""

    def __post_init__(self) -> None:
        _require(bool(self.name), "a model needs a name")
        _bounded(MAX_LAYERS, num_layers=self.num_layers)
        _bounded(MAX_HEADS, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads)
        _bounded(MAX_VOCAB, vocab_size=self.vocab_size)
        _positive(hidden=self.hidden, head_dim=self.head_dim, ffn_hidden=self.ffn_hidden)
        _bounded(
            MAX_POSITIONS,
            low=0,
            sliding_window=self.sliding_window,
            learned_positions=self.learned_positions,
            max_seq_len=self.max_seq_len,
        )
        _bounded(MAX_LAYERS, low=0, num_sliding_layers=self.num_sliding_layers, mtp_layers=self.mtp_layers)
        _require(
            self.num_heads % self.num_kv_heads == 0,
            f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}",
        )
        _require(
            0 <= self.num_sliding_layers <= self.num_layers,
            f"num_sliding_layers={self.num_sliding_layers} must be within 0..num_layers={self.num_layers}",
        )
        _require(
            (self.sliding_window > 0) == (self.num_sliding_layers > 0),
            f"sliding_window={self.sliding_window} and num_sliding_layers={self.num_sliding_layers} "
            "must be both zero or both positive",
        )
        if self.moe is not None:
            _require(
                self.moe.num_dense_layers <= self.num_layers,
                f"moe.num_dense_layers={self.moe.num_dense_layers} exceeds num_layers={self.num_layers}",
            )
        rough = self._rough_params()
        _require(rough <= MAX_PARAMS, f"about {rough:.3g} parameters, above the limit of {MAX_PARAMS:.0e}")

    def _rough_params(self) -> int:
        """An upper estimate of the parameter count, in Python integers (a bound, not the count)."""
        experts = 1 if self.moe is None else self.moe.num_experts + self.moe.num_shared_experts + 1
        width = max(self.ffn_hidden, 0 if self.moe is None else max(self.moe.expert_ffn_hidden, self.moe.shared_hidden))
        attn = self.hidden * (self.q_width + 2 * self.num_kv_heads * self.head_dim + self.attn_out_width)
        if self.mla is not None:
            attn += self.hidden * (self.mla.kv_lora_rank + self.mla.q_lora_rank) * 4
        per_layer = attn + 3 * self.hidden * width * experts
        tables = 2 * (self.vocab_size + self.learned_positions) * self.hidden
        return (self.num_layers + self.mtp_layers) * per_layer + tables

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts."""
        return 0 if self.moe is None else self.num_layers - self.moe.num_dense_layers

    @property
    def num_dense_mlp_layers(self) -> int:
        """Layers with a dense MLP."""
        return self.num_layers - self.num_moe_layers

    @property
    def sliding_share(self) -> float:
        """Share of the layers with a sliding window."""
        return self.num_sliding_layers / self.num_layers

    @property
    def q_width(self) -> int:
        """Width of all query heads together (a * d, or a * (d_nope + d_rope) under MLA)."""
        if self.mla is not None:
            return self.num_heads * self.mla.qk_head_dim
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of one of K or V across the KV heads (k * d); MLA expands to a * d_v for V."""
        return self.num_kv_heads * self.head_dim

    @property
    def score_value_width(self) -> int:
        """Per head, the query-key width plus the value width: what QK^T and AV multiply over (2 d; d_qk + d_v)."""
        if self.mla is not None:
            return self.mla.qk_head_dim + self.mla.v_head_dim
        return 2 * self.head_dim

    @property
    def attn_out_width(self) -> int:
        """Input width of the attention output projection (a * d, or a * d_v under MLA)."""
        if self.mla is not None:
            return self.num_heads * self.mla.v_head_dim
        return self.num_heads * self.head_dim

    @property
    def norm_params(self) -> int:
        """Parameters of one norm layer over the hidden size."""
        return self.hidden * (2 if self.norm is NormKind.LAYERNORM else 1)
