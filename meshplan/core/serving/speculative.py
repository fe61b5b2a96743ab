"""Speculative decoding: a drafter proposes K tokens a sequence, the target checks them in one forward of K + 1.

Each drafted token is taken as accepted with probability a, independently, until the first rejection; the target's
forward then adds its own next token (the correction, or a bonus token after K accepted ones). A verify step thus
yields X = 1 + min(G, K) tokens, G geometric (P(G >= j) = a^j), on average

  E = (1 - a^(K+1)) / (1 - a)        (K + 1 at a = 1; Leviathan, Kalman and Matias 2023, eq. 1)

A step of a replica holding b sequences is
  verify  one forward of the target over b (K + 1) tokens: the GEMMs and the LM head on b (K + 1) rows, every
          query against its sequence's cache, each cache read once (phases.forward, as a decode step's terms)
  draft   K forwards, one a drafted token, at batch b: a named draft model's decode step on the target's TP
          group (vLLM's draft-model proposer), or for heads one layer of the target and the LM head (EAGLE: one
          decoder layer over the target's features; MTP: DeepSeek-V3's module, one layer and the shared head).
          The draft forwards run inside the verify step's engine iteration (vLLM's EagleProposer.propose loops
          over the drafted tokens in one call): they pay the layers' launch gaps, not the step's fixed cost.
TPOT = (t_verify + t_draft) / E; output tokens/s of a replica = B E / (t_verify + t_draft). The drafter's weights
and its cache (per token: a draft model's, or one layer's of the target for heads) come out of the KV budget.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum

from meshplan.core.num import Num, where
from meshplan.core.serving.phases import Forward, decode_step, forward, step_host_s
from meshplan.core.serving.shape import Hardware, ReplicaShape, ServeLayout, sliding_context
from meshplan.spec.model import ModelSpec

MAX_DRAFT_TOKENS = 16
"""Drafted tokens per verify step accepted on input (engines run 1-8; beyond 16 nothing is gained at any a < 1)."""


class SpecMethod(StrEnum):
    """Who drafts."""

    DRAFT = "draft"
    """A smaller model of the same tokenizer (``--draft-model``)."""
    MTP = "mtp"
    """The model's own multi-token-prediction module (DeepSeek-V3): one layer and the shared head."""
    EAGLE = "eagle"
    """An EAGLE head: one decoder layer over the target's hidden states, the target's LM head."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Speculation:
    """The drafter, how many tokens it drafts and the stated acceptance rate per drafted token."""

    method: SpecMethod
    k: int
    acceptance: float
    draft_model: ModelSpec | None = None
    draft_shape: ReplicaShape | None = None
    """The draft model on one GPU of its replica (the target's TP group)."""
    draft_layout: ServeLayout | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.k <= MAX_DRAFT_TOKENS:
            raise ValueError(f"drafted tokens per step must be 1..{MAX_DRAFT_TOKENS}, got {self.k}")
        if not 0.0 <= self.acceptance <= 1.0:
            raise ValueError(f"the acceptance rate is a probability (0..1), got {self.acceptance}")
        drafted = (self.draft_model, self.draft_shape, self.draft_layout)
        if (self.method is SpecMethod.DRAFT) != all(x is not None for x in drafted):
            raise ValueError("a draft model (with its shape and layout) goes with draft:K and only with it")

    @property
    def tokens_per_step(self) -> float:
        """E = sum_{j=0..K} a^j = (1 - a^(K+1)) / (1 - a)."""
        return sum(self.acceptance**j for j in range(self.k + 1))

    @property
    def tokens_per_step_variance(self) -> float:
        """Var X, X = 1 + min(G, K): E[min(G, K)^2] = sum_{j=1..K} (2j - 1) a^j, less its mean squared."""
        a = self.acceptance
        mean = self.tokens_per_step - 1
        return sum((2 * j - 1) * a**j for j in range(1, self.k + 1)) - mean * mean

    def holding(self, shape: ReplicaShape, model: ModelSpec) -> ReplicaShape:
        """``shape`` with the drafter's weights taken from the KV budget and its cache added to each token's (for
        what fits only: the step's times keep the target's own shape)."""
        if self.draft_shape is not None:
            weights, kv = self.draft_shape.bill.weights_bytes, self.draft_shape.kv_bytes_per_token
        else:
            layer = _one_layer(model, shape)  # the head's layer; it shares the target's LM head
            weights = layer.dense_weight_bytes - _lm_head_bytes(shape) + layer.expert_weight_bytes
            kv = layer.kv_bytes_per_token
        return dataclasses.replace(
            shape,
            kv_budget_bytes=shape.kv_budget_bytes - weights,
            kv_bytes_per_token=shape.kv_bytes_per_token + kv,
        )


def verify_step(
    model: ModelSpec,
    shape: ReplicaShape,
    hw: Hardware,
    layout: ServeLayout,
    *,
    batch: Num,
    context: Num,
    k: int,
    prefill_tokens: Num = 0.0,
    rows: Num | None = None,
) -> Forward:
    """The target's forward over ``k`` + 1 tokens of each of ``batch`` sequences (decode_step's terms at k = 0),
    with ``prefill_tokens`` of chunked prefill riding along."""
    sliding = sliding_context(model, context)
    rows = batch if rows is None else rows
    q = k + 1
    return forward(
        model,
        shape,
        hw,
        layout,
        new_tokens=rows * q + prefill_tokens,
        decode_pairs=batch * q * sliding,
        prefill_pairs=prefill_tokens * sliding_context(model, context / 2),
        kv_tokens_read=batch * sliding,
        group_tokens=rows * q * (layout.tp if layout.dp_attention else 1) + prefill_tokens,
        logits=rows * q,
        layer_overhead_s=hw.cal.layer_overhead_s,
        ep_per_node=False,
    )


def draft_s(
    model: ModelSpec,
    shape: ReplicaShape,
    hw: Hardware,
    layout: ServeLayout,
    spec: Speculation,
    *,
    batch: Num,
    context: Num,
) -> Forward:
    """The K draft forwards of one step at ``batch`` sequences, by term (module docstring)."""
    if spec.draft_model is not None:
        assert spec.draft_shape is not None and spec.draft_layout is not None
        group = layout.tp if layout.dp_attention else 1  # the draft model runs plain TP over the group's sequences
        one = decode_step(
            spec.draft_model, spec.draft_shape, hw, spec.draft_layout, batch=batch * group, context=context
        )
        between = step_host_s(hw, spec.draft_layout, sequences=batch * group)
    else:
        one = decode_step(model, _one_layer(model, shape), hw, layout, batch=batch, context=context)
        between = step_host_s(hw, layout, sequences=batch)
    one = dataclasses.replace(one, overhead_s=one.overhead_s - between)  # drafts run inside the step
    return _scaled(one, spec.k)


def spec_step(
    model: ModelSpec,
    shape: ReplicaShape,
    hw: Hardware,
    layout: ServeLayout,
    spec: Speculation,
    *,
    batch: Num,
    context: Num,
    prefill_tokens: Num = 0.0,
    rows: Num | None = None,
) -> Forward:
    """One speculative step: the verify forward and the K draft forwards, term by term."""
    verify = verify_step(
        model, shape, hw, layout, batch=batch, context=context, k=spec.k, prefill_tokens=prefill_tokens, rows=rows
    )
    return add_forwards(verify, draft_s(model, shape, hw, layout, spec, batch=batch, context=context))


def _one_layer(model: ModelSpec, shape: ReplicaShape) -> ReplicaShape:
    """A drafting head on one GPU: one of the stage's layers (its per-token work and weights) and the LM head."""
    f = 1.0 / max(shape.layers, 1)
    lm = _lm_head_bytes(shape)
    return dataclasses.replace(
        shape,
        layers=1,
        dense_weight_bytes=(shape.dense_weight_bytes - lm) * f + lm,
        expert_weight_bytes=shape.expert_weight_bytes * f,
        gemm_params_per_token=shape.gemm_params_per_token * f,
        expert_params_per_token=shape.expert_params_per_token * f,
        kv_bytes_per_token=shape.kv_bytes_per_token * f,
        attn_flops_per_pair_decode=shape.attn_flops_per_pair_decode * f,
        attn_flops_per_pair_prefill=shape.attn_flops_per_pair_prefill * f,
        memory_bytes_per_token=shape.memory_bytes_per_token * f,
    )


def _lm_head_bytes(shape: ReplicaShape) -> float:
    """The LM head's bytes on one GPU, at the stage's mean bytes per matmul parameter."""
    params = shape.gemm_params_per_token + shape.lm_head_params
    per_param = shape.dense_weight_bytes / params if params > 0 else 0.0
    return min(shape.lm_head_params * per_param, shape.dense_weight_bytes)


def add_forwards(a: Forward, b: Forward) -> Forward:
    """Two forwards run one after the other. Each keeps its own rooflines: the time of each side that binds is
    kept (a memory-bound GEMM's weight read, a compute-bound one's math, likewise attention), the math moved
    among the always-added terms, so the total is the sum of the two totals and the breakdown each one's."""
    parts = (a, b)
    weights = sum(where(f.weights_read_s >= f.gemm_compute_s, f.weights_read_s, 0.0) for f in parts)
    kv = sum(where(f.kv_read_s >= f.attention_compute_s, f.kv_read_s, 0.0) for f in parts)
    math = sum(
        where(f.weights_read_s >= f.gemm_compute_s, 0.0, f.gemm_compute_s)
        + where(f.kv_read_s >= f.attention_compute_s, 0.0, f.attention_compute_s)
        + f.memory_ops_s
        for f in parts
    )
    return Forward(
        weights_read_s=weights,
        kv_read_s=kv,
        gemm_compute_s=0.0 * weights,
        attention_compute_s=0.0 * kv,
        memory_ops_s=math,
        tp_comm_s=a.tp_comm_s + b.tp_comm_s,
        ep_comm_s=a.ep_comm_s + b.ep_comm_s,
        pp_comm_s=a.pp_comm_s + b.pp_comm_s,
        overhead_s=a.overhead_s + b.overhead_s,
        host_wait_s=a.host_wait_s + b.host_wait_s,
    )


def _scaled(a: Forward, k: float) -> Forward:
    return Forward(**{f.name: getattr(a, f.name) * k for f in dataclasses.fields(Forward)})
