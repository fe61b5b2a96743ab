"""Hugging Face ``config.json`` to ModelSpec, for the model families meshplan reads.

Field semantics follow the transformers modeling code of each family (not
only its docstrings): defaults for absent keys, which layers slide, which
leading layers stay dense.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from meshplan.spec.model import MAX_LAYERS, MLASpec, MlpKind, ModelSpec, MoESpec, NormKind

MAX_INT = 1 << 53
"""Integers above this are refused on reading: no field of a config is anywhere near it."""


class _HfConfig:
    """Typed reads from a config.json; a null value counts as absent, as transformers treats it."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config

    def get(self, key: str, default: Any = None) -> Any:
        value = self.config.get(key)
        return default if value is None else value

    def integer(self, key: str, default: int | None = None) -> int:
        value = self.get(key, default)
        if value is None:
            raise ValueError(f"'{key}' is missing")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"'{key}' must be an integer, got {_short(value)}")
        if not -MAX_INT <= value <= MAX_INT:
            raise ValueError(f"'{key}' = {_short(value)} is out of range")
        return value

    def count(self, key: str, default: int | None = None, *, limit: int = MAX_INT) -> int:
        """A positive integer within ``limit`` (sizes that divide or are looped over)."""
        value = self.integer(key, default)
        if value < 1:
            raise ValueError(f"'{key}' must be a positive integer, got {value}")
        if value > limit:
            raise ValueError(f"'{key}' = {value:,} is above the limit of {limit:,}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise ValueError(f"'{key}' must be true or false, got {value!r}")
        return value

    def positive(self, *keys: str, default: float = 0.0) -> bool:
        """Whether any of ``keys`` (dropout probabilities) is above zero."""
        out = False
        for key in keys:
            value = self.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
                raise ValueError(f"'{key}' must be a probability in [0, 1], got {_short(value)}")
            out = out or value > 0
        return out


def _short(value: Any) -> str:
    """A value for a one-line message: long integers and structures are cut."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _decoder(
    c: _HfConfig, *, head_dim: int | None = None, qkv_bias: bool = False, out_bias: bool = False
) -> dict[str, Any]:
    """Fields shared by the Llama-like families (RMSNorm, gated MLP, rotary positions)."""
    h, a = c.integer("hidden_size"), c.count("num_attention_heads")
    return {
        "num_layers": c.count("num_hidden_layers", limit=MAX_LAYERS),
        "hidden": h,
        "num_heads": a,
        "num_kv_heads": c.integer("num_key_value_heads", a),
        "head_dim": c.integer("head_dim", head_dim or h // a),
        "ffn_hidden": c.integer("intermediate_size"),
        "vocab_size": c.integer("vocab_size"),
        "tied_embeddings": c.flag("tie_word_embeddings", False),
        "qkv_bias": qkv_bias,
        "out_bias": out_bias,
        "mlp_bias": c.flag("mlp_bias", False),
        "dropout": c.positive("attention_dropout", "hidden_dropout"),
        "max_seq_len": c.integer("max_position_embeddings", 0),
    }


def _sliding(c: _HfConfig, num_layers: int, *, every_layer: bool) -> dict[str, int]:
    """Sliding layers: Mistral windows every layer; Qwen only with use_sliding_window, layers >= max_window_layers."""
    window = c.get("sliding_window")
    if not every_layer and not c.flag("use_sliding_window", False):
        window = None
    kinds = c.get("layer_types")
    if kinds is not None:
        if not isinstance(kinds, list) or len(kinds) != num_layers or not all(isinstance(k, str) for k in kinds):
            got = f"a list of {len(kinds)}" if isinstance(kinds, list) else type(kinds).__name__
            raise ValueError(f"'layer_types' must be a list of {num_layers} strings (one per layer), got {got}")
        count = sum(kind == "sliding_attention" for kind in kinds)
    elif window is None:
        count = 0
    else:
        count = num_layers if every_layer else max(0, num_layers - c.integer("max_window_layers", 28))
    if count and not window:
        raise ValueError("layer_types has sliding layers but sliding_window is unset")
    return {"sliding_window": c.integer("sliding_window") if count else 0, "num_sliding_layers": count}


def _leading_dense_layers(c: _HfConfig, num_layers: int) -> int:
    """Qwen MoE: dense layers are mlp_only_layers and those off the decoder_sparse_step grid."""
    step, listed = c.count("decoder_sparse_step", 1), c.get("mlp_only_layers", [])
    if not isinstance(listed, list) or len(listed) > MAX_LAYERS:
        raise ValueError(f"'mlp_only_layers' must be a list of at most {MAX_LAYERS} layer indices")
    only = set(listed)
    dense = [i for i in range(num_layers) if i in only or (i + 1) % step != 0]
    if dense != list(range(len(dense))):
        raise ValueError(f"dense layers {dense} are not a leading block, which is all ModelSpec can describe")
    return len(dense)


def _llama(c: _HfConfig) -> dict[str, Any]:
    bias = c.flag("attention_bias", False)
    return _decoder(c, qkv_bias=bias, out_bias=bias)


def _mistral(c: _HfConfig) -> dict[str, Any]:
    fields = _decoder(c)
    return fields | _sliding(c, fields["num_layers"], every_layer=True)


def _mixtral(c: _HfConfig) -> dict[str, Any]:
    moe = MoESpec(
        num_experts=c.integer("num_local_experts"),
        experts_per_token=c.integer("num_experts_per_tok"),
        expert_ffn_hidden=c.integer("intermediate_size"),
    )
    return _mistral(c) | {"moe": moe}


def _qwen2(c: _HfConfig) -> dict[str, Any]:
    fields = _decoder(c, qkv_bias=c.flag("qkv_bias", True))  # Q/K/V carry biases, the output projection none
    return fields | _sliding(c, fields["num_layers"], every_layer=False)


def _qwen2_moe(c: _HfConfig) -> dict[str, Any]:
    fields = _qwen2(c)
    shared = c.integer("shared_expert_intermediate_size", 0)
    moe = MoESpec(
        num_experts=c.integer("num_experts"),
        experts_per_token=c.integer("num_experts_per_tok"),
        expert_ffn_hidden=c.integer("moe_intermediate_size"),
        num_shared_experts=1 if shared else 0,
        shared_ffn_hidden=shared,
        num_dense_layers=_leading_dense_layers(c, fields["num_layers"]),
        shared_expert_gate=bool(shared),
    )
    return fields | {"moe": moe}


def _qwen3(c: _HfConfig) -> dict[str, Any]:
    bias = c.flag("attention_bias", False)
    # transformers' Qwen3Config defaults head_dim to 128, not hidden / heads
    fields = _decoder(c, head_dim=128, qkv_bias=bias, out_bias=bias)
    return fields | _sliding(c, fields["num_layers"], every_layer=False) | {"qk_norm": True}


def _qwen3_moe(c: _HfConfig) -> dict[str, Any]:
    fields = _qwen3(c)
    moe = MoESpec(
        num_experts=c.integer("num_experts"),
        experts_per_token=c.integer("num_experts_per_tok"),
        expert_ffn_hidden=c.integer("moe_intermediate_size"),
        num_dense_layers=_leading_dense_layers(c, fields["num_layers"]),
    )
    return fields | {"moe": moe}


def _gpt_oss(c: _HfConfig) -> dict[str, Any]:
    """gpt-oss: every layer MoE, biases on every projection, the experts and the router (transformers'
    GptOssExperts and GptOssTopKRouter always carry them), a learned sink per head, full and sliding-window layers
    alternating (layer_types)."""
    bias = c.flag("attention_bias", True)
    fields = _decoder(c, qkv_bias=bias, out_bias=bias) | {"mlp_bias": True, "attention_sinks": True}
    moe = MoESpec(
        num_experts=c.integer("num_local_experts"),
        experts_per_token=c.integer("num_experts_per_tok", c.get("experts_per_token")),
        expert_ffn_hidden=c.integer("intermediate_size"),
        router_bias=True,
    )
    return fields | _sliding(c, fields["num_layers"], every_layer=True) | {"moe": moe}


def _node_limit(c: _HfConfig) -> int:
    """Group-limited routing (n_group expert groups, topk_group reachable): DeepSeek places one group per node,
    so a token reaches at most topk_group nodes (DeepSeek-V3 Sec. 2.1.2: 8 groups, 4 nodes); 0 when unlimited."""
    groups, reachable = c.integer("n_group", 1), c.integer("topk_group", 0)
    return reachable if groups > 1 and 0 < reachable < groups else 0


def _deepseek(c: _HfConfig, *, router_bias: bool) -> dict[str, Any]:
    if c.flag("attention_bias", False):
        raise ValueError("attention_bias=true on MLA projections is not modeled")
    if c.integer("moe_layer_freq", 1) != 1:
        raise ValueError(f"moe_layer_freq={c.integer('moe_layer_freq')} is not modeled (only 1)")
    mla = MLASpec(
        kv_lora_rank=c.integer("kv_lora_rank"),
        qk_rope_head_dim=c.integer("qk_rope_head_dim"),
        qk_nope_head_dim=c.integer("qk_nope_head_dim"),
        v_head_dim=c.integer("v_head_dim"),
        q_lora_rank=c.integer("q_lora_rank", 0),
    )
    fields = _decoder(c, qkv_bias=False) | {"head_dim": mla.qk_nope_head_dim, "mla": mla}
    if c.integer("n_routed_experts", 0):
        fields["moe"] = MoESpec(
            num_experts=c.integer("n_routed_experts"),
            experts_per_token=c.integer("num_experts_per_tok"),
            expert_ffn_hidden=c.integer("moe_intermediate_size"),
            num_shared_experts=c.integer("n_shared_experts", 0),
            num_dense_layers=min(c.integer("first_k_dense_replace", 0), fields["num_layers"]),
            router_bias=router_bias,
            max_nodes_per_token=_node_limit(c),
        )
    return fields | {"mtp_layers": c.integer("num_nextn_predict_layers", 0)}


def _gpt2(c: _HfConfig) -> dict[str, Any]:
    h, a, positions = c.integer("n_embd"), c.count("n_head"), c.integer("n_positions")
    return {
        "num_layers": c.count("n_layer", limit=MAX_LAYERS),
        "hidden": h,
        "num_heads": a,
        "num_kv_heads": a,
        "head_dim": h // a,
        "ffn_hidden": c.integer("n_inner", 4 * h),
        "vocab_size": c.integer("vocab_size"),
        "mlp": MlpKind.PLAIN,
        "norm": NormKind.LAYERNORM,
        "tied_embeddings": c.flag("tie_word_embeddings", True),
        "learned_positions": positions,
        "qkv_bias": True,
        "out_bias": True,
        "mlp_bias": True,
        "dropout": c.positive("resid_pdrop", "embd_pdrop", "attn_pdrop", default=0.1),  # GPT2Config defaults: 0.1
        "max_seq_len": positions,
    }


def _gpt_neox(c: _HfConfig) -> dict[str, Any]:
    # The parallel residual changes the data flow, not the tensors: counts are those of a sequential block.
    bias = c.flag("attention_bias", True)
    fields = _decoder(c, qkv_bias=bias, out_bias=bias)
    return fields | {
        "mlp": MlpKind.PLAIN,
        "norm": NormKind.LAYERNORM,
        "mlp_bias": True,
        "num_kv_heads": fields["num_heads"],
    }


def _mpt(c: _HfConfig) -> dict[str, Any]:
    """MosaicML MPT (llm-foundry's MPTConfig): LayerNorm, a plain GELU MLP of expansion_ratio x d_model, tied
    embeddings, and a learned position table of max_seq_len rows when learned_pos_emb (its default; the model
    also takes ALiBi, a bias inside attention with no parameters). no_bias drops the linear layers' biases; it
    drops the norms' too, which a LayerNorm here keeps (2h per layer: 266,240 of MPT-7B's 6.65 billion).
    Grouped-query attention names its KV heads kv_n_heads in attn_config."""
    h, a = c.integer("d_model"), c.count("n_heads")
    attn = c.get("attn_config") or {}
    if not isinstance(attn, Mapping):
        raise ValueError(f"'attn_config' must be an object, got {_short(attn)}")
    grouped = attn.get("attn_type") in ("grouped_query_attention", "multiquery_attention")
    kv_heads = 1 if attn.get("attn_type") == "multiquery_attention" else _HfConfig(attn).integer("kv_n_heads", a)
    bias = not c.flag("no_bias", False)
    positions = c.integer("max_seq_len", 2048)
    return {
        "num_layers": c.count("n_layers", limit=MAX_LAYERS),
        "hidden": h,
        "num_heads": a,
        "num_kv_heads": kv_heads if grouped else a,
        "head_dim": h // a,
        "ffn_hidden": _mpt_ffn_hidden(c, h),
        "vocab_size": c.integer("vocab_size"),
        "mlp": MlpKind.PLAIN,
        "norm": NormKind.LAYERNORM,
        "tied_embeddings": c.flag("tie_word_embeddings", True),
        "learned_positions": positions if c.flag("learned_pos_emb", True) else 0,
        "qkv_bias": bias,
        "out_bias": bias,
        "mlp_bias": bias,
        "dropout": c.positive("resid_pdrop", "emb_pdrop"),
        "max_seq_len": positions,
    }


def _mpt_ffn_hidden(c: _HfConfig, hidden: int) -> int:
    """ffn_config's ffn_hidden_size when given, else expansion_ratio x d_model (a ratio may be fractional)."""
    ffn = c.get("ffn_config") or {}
    if isinstance(ffn, Mapping) and ffn.get("ffn_hidden_size") is not None:
        return _HfConfig(ffn).count("ffn_hidden_size")
    ratio = c.get("expansion_ratio", 4)
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio <= 64:
        raise ValueError(f"'expansion_ratio' must be a number in (0, 64], got {_short(ratio)}")
    return int(ratio * hidden)


_HF_FAMILIES: dict[str, Callable[[_HfConfig], dict[str, Any]]] = {
    "deepseek_v2": lambda c: _deepseek(c, router_bias=c.get("topk_method") == "noaux_tc"),
    "deepseek_v3": lambda c: _deepseek(c, router_bias=True),
    "gpt2": _gpt2,
    "gpt_oss": _gpt_oss,
    "gpt_neox": _gpt_neox,
    "llama": _llama,
    "mistral": _mistral,
    "mixtral": _mixtral,
    "mpt": _mpt,
    "qwen2": _qwen2,
    "qwen2_moe": _qwen2_moe,
    "qwen3": _qwen3,
    "qwen3_moe": _qwen3_moe,
}


def model_from_hf_config(config: Mapping[str, Any], *, name: str) -> ModelSpec:
    """The ModelSpec of a Hugging Face ``config.json`` (already parsed); ``name`` names the result."""
    model_type = config.get("model_type")
    family = _HF_FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise ValueError(
            f"config of {name}: unsupported model_type {model_type!r} (supported: {', '.join(sorted(_HF_FAMILIES))})"
        )
    try:
        return ModelSpec(name=name, **family(_HfConfig(config)))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"config of {name} ({model_type}): {exc}") from None


__all__ = ["model_from_hf_config"]
