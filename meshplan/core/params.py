"""Exact parameter counts, by component and by how tensor parallelism shards them.

Every count is the number of elements in the tensors a Hugging Face checkpoint
of the model holds; tests hold them to the published totals exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshplan.spec.model import MlpKind, ModelSpec, NormKind


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerParams:
    """Parameters of one transformer layer, grouped by how a TP rank holds them."""

    attention: int
    """Q, K, V, O projections, their biases and any attention norms (all of them)."""
    kv: int
    """The K and V projections (with biases): split over min(tp, num_kv_heads) ranks, copied beyond."""
    attention_replicated: int
    """Attention parameters every TP rank keeps whole (MLA down-projections, latent norms, O bias, QK norms)."""
    mlp: int
    """Dense MLP (0 in MoE layers)."""
    mlp_replicated: int
    """Dense-MLP parameters every TP rank keeps whole (the down-projection bias)."""
    routed_experts: int
    """All routed experts of the layer: split over ep and tp."""
    shared_experts: int
    """Shared experts (and their gate): split over tp."""
    router: int
    """Router weights and bias: every rank keeps them whole."""
    norms: int
    """The two per-layer norms: every TP rank keeps them whole."""

    @property
    def total(self) -> int:
        return self.attention + self.mlp + self.routed_experts + self.shared_experts + self.router + self.norms


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamCount:
    """Parameters of a model, by component."""

    embedding: int
    """Token embedding plus any learned position table."""
    position_embedding: int
    """The learned position table alone (replicated across TP ranks)."""
    dense_layer: LayerParams
    """One layer with a dense MLP."""
    moe_layer: LayerParams
    """One MoE layer (equal to dense_layer when the model has no experts)."""
    num_dense_layers: int
    num_moe_layers: int
    final_norm: int
    lm_head: int
    """Output projection (0 when tied to the embedding)."""
    mtp: int
    """Multi-token-prediction modules, reported apart from the total."""
    experts_per_token: int
    num_experts: int

    @property
    def total(self) -> int:
        layers = self.num_dense_layers * self.dense_layer.total + self.num_moe_layers * self.moe_layer.total
        return self.embedding + layers + self.final_norm + self.lm_head

    @property
    def routed_expert_params(self) -> int:
        return self.num_moe_layers * self.moe_layer.routed_experts

    @property
    def active_per_token(self) -> int:
        """Parameters one token's forward pass touches: all but the routed experts it skips."""
        if self.num_experts == 0:
            return self.total
        skipped = self.routed_expert_params * (self.num_experts - self.experts_per_token) // self.num_experts
        return self.total - skipped

    def by_component(self) -> dict[str, int]:
        """Totals per component over the whole model (they sum to ``total``)."""
        n_d, n_m = self.num_dense_layers, self.num_moe_layers
        d, m = self.dense_layer, self.moe_layer
        parts = {
            "embedding": self.embedding,
            "attention": n_d * d.attention + n_m * m.attention,
            "mlp": n_d * d.mlp + n_m * m.mlp,
            "routed_experts": n_m * m.routed_experts,
            "shared_experts": n_m * m.shared_experts,
            "router": n_m * m.router,
            "norms": n_d * d.norms + n_m * m.norms + self.final_norm,
            "lm_head": self.lm_head,
        }
        assert sum(parts.values()) == self.total
        return parts


def _mlp_params(hidden: int, ffn: int, *, kind: MlpKind, bias: bool) -> tuple[int, int]:
    """(sharded, replicated) parameters of one MLP of width ``ffn``."""
    matrices = 3 if kind is MlpKind.GATED else 2
    sharded = matrices * hidden * ffn + (bias and (matrices - 1) * ffn)
    return sharded, (hidden if bias else 0)


def _attention_params(model: ModelSpec) -> tuple[int, int, int]:
    """(all, kv, replicated) attention parameters of one layer."""
    h = model.hidden
    if model.mla is not None:
        mla, a = model.mla, model.num_heads
        if mla.q_lora_rank:
            q_down = h * mla.q_lora_rank + mla.q_lora_rank  # down-projection and its norm
            q_up = mla.q_lora_rank * a * mla.qk_head_dim
        else:
            q_down, q_up = 0, h * a * mla.qk_head_dim
        kv_down = h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank  # and its norm
        kv_up = mla.kv_lora_rank * a * (mla.qk_nope_head_dim + mla.v_head_dim)
        out = a * mla.v_head_dim * h
        replicated = q_down + kv_down
        return q_down + q_up + kv_down + kv_up + out, 0, replicated
    q, kv = model.q_width, model.kv_width
    bias = model.qkv_bias
    kv_params = 2 * (h * kv + (kv if bias else 0))
    q_params = h * q + (q if bias else 0) + (model.num_heads if model.attention_sinks else 0)
    out_params = q * h + (h if model.out_bias else 0)
    qk_norm = 2 * model.head_dim if model.qk_norm else 0
    replicated = (h if model.out_bias else 0) + qk_norm
    return q_params + kv_params + out_params + qk_norm, kv_params, replicated


def _layer_params(model: ModelSpec, *, moe_layer: bool) -> LayerParams:
    h = model.hidden
    attention, kv, attn_replicated = _attention_params(model)
    norms = 2 * model.norm_params
    if not moe_layer or model.moe is None:
        mlp, mlp_rep = _mlp_params(h, model.ffn_hidden, kind=model.mlp, bias=model.mlp_bias)
        return LayerParams(
            attention=attention,
            kv=kv,
            attention_replicated=attn_replicated,
            mlp=mlp + mlp_rep,
            mlp_replicated=mlp_rep,
            routed_experts=0,
            shared_experts=0,
            router=0,
            norms=norms,
        )
    moe = model.moe
    expert, expert_rep = _mlp_params(h, moe.expert_ffn_hidden, kind=model.mlp, bias=model.mlp_bias)
    shared, shared_rep = _mlp_params(h, moe.shared_hidden, kind=model.mlp, bias=model.mlp_bias)
    shared_total = moe.num_shared_experts * (shared + shared_rep) + (h if moe.shared_expert_gate else 0)
    return LayerParams(
        attention=attention,
        kv=kv,
        attention_replicated=attn_replicated,
        mlp=0,
        mlp_replicated=0,
        routed_experts=moe.num_experts * (expert + expert_rep),
        shared_experts=shared_total,
        router=h * moe.num_experts + (moe.num_experts if moe.router_bias else 0),
        norms=norms,
    )


def _mtp_params(model: ModelSpec, moe_layer: LayerParams) -> int:
    """DeepSeek-V3 MTP module: two input norms, a 2h -> h projection, one layer, an output norm.

    The embedding and output head are shared with the main model and not counted again.
    """
    h = model.hidden
    per_module = 2 * model.norm_params + 2 * h * h + moe_layer.total + model.norm_params
    return model.mtp_layers * per_module


def count_params(model: ModelSpec) -> ParamCount:
    """Exact parameter counts of ``model`` by component."""
    h = model.hidden
    embedding = model.vocab_size * h + model.learned_positions * h
    dense = _layer_params(model, moe_layer=False)
    moe = _layer_params(model, moe_layer=True)
    return ParamCount(
        embedding=embedding,
        position_embedding=model.learned_positions * h,
        dense_layer=dense,
        moe_layer=moe,
        num_dense_layers=model.num_dense_mlp_layers,
        num_moe_layers=model.num_moe_layers,
        final_norm=model.norm_params,
        lm_head=0 if model.tied_embeddings else model.vocab_size * h,
        mtp=_mtp_params(model, moe),
        experts_per_token=model.moe.experts_per_token if model.moe else 0,
        num_experts=model.moe.num_experts if model.moe else 0,
    )


def approx_params(model: ModelSpec) -> float:
    """Back-of-envelope count 12 L h^2 + 2 V h (Narayanan et al. 2021, Eq. 2 without small terms).

    Exact for nothing; kept beside ``count_params`` as the check a person does by hand.
    """
    return (
        12 * model.num_layers * model.hidden**2 + (1 if model.tied_embeddings else 2) * model.vocab_size * model.hidden
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamTensor:
    """One parameter tensor, as a checkpoint, an optimizer and FSDP2 see it (one entry per tensor)."""

    name: str
    """Module path in torchtitan's naming: ``tok_embeddings.weight``, ``layers.3.attention.wq.weight``."""
    shape: tuple[int, ...]
    tp_dim: int | None = None
    """The dim tensor parallelism splits (column-parallel and vocab tables: the output rows; row-parallel: the
    input columns); None: every TP rank holds the tensor whole."""
    expert: bool = False
    """Routed experts stacked on dim 0: split over the expert-parallel ranks."""
    layer: int = -1
    """The transformer layer holding the tensor (-1: embedding, final norm and output head)."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _norm_tensors(model: ModelSpec, prefix: str) -> list[ParamTensor]:
    out = [ParamTensor(name=f"{prefix}.weight", shape=(model.hidden,))]
    if model.norm is NormKind.LAYERNORM:
        out.append(ParamTensor(name=f"{prefix}.bias", shape=(model.hidden,)))
    return out


def _linear(name: str, out_dim: int, in_dim: int, *, tp_dim: int | None, bias: bool) -> list[ParamTensor]:
    """nn.Linear(in_dim, out_dim): weight (out, in); a column-parallel bias is split with the rows."""
    weight = ParamTensor(name=f"{name}.weight", shape=(out_dim, in_dim), tp_dim=tp_dim)
    if not bias:
        return [weight]
    return [weight, ParamTensor(name=f"{name}.bias", shape=(out_dim,), tp_dim=0 if tp_dim == 0 else None)]


def _attention_tensors(model: ModelSpec) -> list[ParamTensor]:
    h, a = model.hidden, model.num_heads
    if model.mla is not None:
        mla = model.mla
        if mla.q_lora_rank:
            q = [
                *_linear("attention.wq_a", mla.q_lora_rank, h, tp_dim=None, bias=False),
                ParamTensor(name="attention.q_norm.weight", shape=(mla.q_lora_rank,)),
                *_linear("attention.wq_b", a * mla.qk_head_dim, mla.q_lora_rank, tp_dim=0, bias=False),
            ]
        else:
            q = _linear("attention.wq", a * mla.qk_head_dim, h, tp_dim=0, bias=False)
        kv_up = a * (mla.qk_nope_head_dim + mla.v_head_dim)
        kv = [
            *_linear("attention.wkv_a", mla.kv_lora_rank + mla.qk_rope_head_dim, h, tp_dim=None, bias=False),
            ParamTensor(name="attention.kv_norm.weight", shape=(mla.kv_lora_rank,)),
            *_linear("attention.wkv_b", kv_up, mla.kv_lora_rank, tp_dim=0, bias=False),
        ]
        return q + kv + _linear("attention.wo", h, a * mla.v_head_dim, tp_dim=1, bias=False)
    out: list[ParamTensor] = []
    for name, width in (("wq", model.q_width), ("wk", model.kv_width), ("wv", model.kv_width)):
        out += _linear(f"attention.{name}", width, h, tp_dim=0, bias=model.qkv_bias)
    if model.qk_norm:
        out += [ParamTensor(name=f"attention.{n}.weight", shape=(model.head_dim,)) for n in ("q_norm", "k_norm")]
    if model.attention_sinks:
        out.append(ParamTensor(name="attention.sinks", shape=(a,), tp_dim=0))
    return out + _linear("attention.wo", h, model.q_width, tp_dim=1, bias=model.out_bias)


def _mlp_tensors(model: ModelSpec, prefix: str, ffn: int) -> list[ParamTensor]:
    """w1 (gate, or the up projection of a plain MLP), w2 (down), w3 (up of a gated MLP)."""
    h, bias = model.hidden, model.mlp_bias
    out = _linear(f"{prefix}.w1", ffn, h, tp_dim=0, bias=bias) + _linear(f"{prefix}.w2", h, ffn, tp_dim=1, bias=bias)
    if model.mlp is MlpKind.GATED:
        out += _linear(f"{prefix}.w3", ffn, h, tp_dim=0, bias=bias)
    return out


def _expert_tensors(model: ModelSpec, num_experts: int, ffn: int) -> list[ParamTensor]:
    """Routed experts stacked as (E, in, out) matrices (torchtitan's GroupedExperts); biases (E, out)."""
    h, gated = model.hidden, model.mlp is MlpKind.GATED
    specs = [("w1", (h, ffn), 2), ("w2", (ffn, h), 1)] + ([("w3", (h, ffn), 2)] if gated else [])
    out = []
    for name, (d_in, d_out), tp_dim in specs:
        out.append(ParamTensor(name=f"feed_forward.experts.{name}", shape=(num_experts, d_in, d_out), tp_dim=tp_dim,
                               expert=True))  # fmt: skip
        if model.mlp_bias:
            out.append(ParamTensor(name=f"feed_forward.experts.{name}_bias", shape=(num_experts, d_out),
                                   tp_dim=1 if tp_dim == 2 else None, expert=True))  # fmt: skip
    return out


def layer_tensors(model: ModelSpec, *, moe_layer: bool) -> tuple[ParamTensor, ...]:
    """The tensors of one layer, names relative to the layer, in module order."""
    out = _norm_tensors(model, "attention_norm") + _attention_tensors(model) + _norm_tensors(model, "ffn_norm")
    moe = model.moe
    if not moe_layer or moe is None:
        return tuple(out + _mlp_tensors(model, "feed_forward", model.ffn_hidden))
    out += _linear("feed_forward.router.gate", moe.num_experts, model.hidden, tp_dim=None, bias=False)
    if moe.router_bias:
        out.append(ParamTensor(name="feed_forward.expert_bias", shape=(moe.num_experts,)))
    out += _expert_tensors(model, moe.num_experts, moe.expert_ffn_hidden)
    for j in range(moe.num_shared_experts):
        out += _mlp_tensors(model, f"feed_forward.shared_experts.{j}", moe.shared_hidden)
    if moe.shared_expert_gate:
        out += _linear("feed_forward.shared_expert_gate", 1, model.hidden, tp_dim=None, bias=False)
    return tuple(out)


def embedding_tensors(model: ModelSpec) -> tuple[ParamTensor, ...]:
    """What the first pipeline stage holds outside its layers: the token table (vocab rows split over TP)."""
    out = [ParamTensor(name="tok_embeddings.weight", shape=(model.vocab_size, model.hidden), tp_dim=0)]
    if model.learned_positions:
        out.append(ParamTensor(name="pos_embeddings.weight", shape=(model.learned_positions, model.hidden)))
    return tuple(out)


def head_tensors(model: ModelSpec) -> tuple[ParamTensor, ...]:
    """What the last stage holds outside its layers: the final norm and the untied output projection."""
    out = _norm_tensors(model, "norm")
    if not model.tied_embeddings:
        out += _linear("output", model.vocab_size, model.hidden, tp_dim=0, bias=False)
    return tuple(out)


def param_inventory(model: ModelSpec) -> tuple[ParamTensor, ...]:
    """Every parameter tensor of the model (MTP modules excluded), in module order; sums to count_params().total."""
    moe_from = model.num_dense_mlp_layers
    layers = [
        ParamTensor(name=f"layers.{i}.{t.name}", shape=t.shape, tp_dim=t.tp_dim, expert=t.expert, layer=i)
        for i in range(model.num_layers)
        for t in layer_tensors(model, moe_layer=i >= moe_from)
    ]
    return (*embedding_tensors(model), *layers, *head_tensors(model))


__all__ = [
    "LayerParams",
    "NormKind",
    "ParamCount",
    "ParamTensor",
    "approx_params",
    "count_params",
    "embedding_tensors",
    "head_tensors",
    "layer_tensors",
    "param_inventory",
]
