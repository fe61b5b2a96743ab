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

Under FP8 matmuls Transformer Engine keeps a linear layer's input as the
quantized copy its forward made (``LinearInputs``): 1 byte an element and
the recipe's scales, where bf16 training keeps 2.

Where frameworks keep different tensors, ``SAVED_TENSORS`` says what each
keeps (measured for PyTorch 2.13 by ``meshplan check``; docs/check.md):
an eager RMSNorm keeps its fp32 upcast input, x * rstd and rstd; DTensor
sequence parallelism keeps the gathered QKV and MLP inputs; the loss keeps
fp32 log-probabilities over the whole vocabulary without loss parallelism.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from meshplan.core.num import Num, maximum, where
from meshplan.spec.layout import Recompute
from meshplan.spec.model import MlpKind, ModelSpec, NormKind
from meshplan.spec.workload import Attention, Framework, Kernels, Workload
from meshplan.units import FP32_BYTES

GATED_SAVED_TENSORS = {Kernels.EAGER: 4, Kernels.FUSED: 3}
"""f-wide tensors a gated MLP keeps: gate out, up out and act(gate) * up; run eagerly, act(gate) too."""
PLAIN_SAVED_TENSORS = 2
"""f-wide tensors a GELU MLP keeps: the up output (GELU input) and the GELU output."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NormSaves:
    """What one norm keeps for backward, per token."""

    hidden_tensors: int
    """h-wide tensors: the input (fused kernels); the input and x * rstd (eager RMSNorm)."""
    weight_grad_tensors: int = 0
    """Of those, kept only for the weight's gradient (eager RMSNorm's x * rstd): gone when the weight is frozen."""
    hidden_fp32: bool
    """Those are fp32 whatever the activation dtype (an eager norm upcasts before it reduces)."""
    row_stats: int
    """fp32 numbers per token (rstd; LayerNorm's mean too)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SavedTensors:
    """What a framework keeps for backward where frameworks differ; the rest of the accounting is shared."""

    norms: Mapping[NormKind, NormSaves]
    sp_gathered_inputs: bool
    """Under sequence parallelism the QKV, MLP and output-head inputs stay gathered (DTensor keeps the output
    of its all-gather); False: the shard is kept and gathered again in backward (Megatron-LM)."""
    vocab_parallel_loss: bool
    """The loss keeps its fp32 log-probabilities split over the TP ranks (Megatron's vocab-parallel
    cross-entropy); False: every TP rank keeps all V of them (logits gathered, no loss parallelism)."""
    loss_scalar_bytes: float
    """Per micro-batch: the 0-dim fp32 total weight nll_loss keeps."""
    router_fp32_tensors: int
    """E-wide fp32 tensors the router keeps per token (logits and probabilities; the softmax output only)."""
    routed_hidden_copies: int
    """h-wide copies kept per routed (token, expert) pair: the dispatched row and the expert output
    (Megatron); the expert input, the returned row and the gate-weighted row (sort / all-to-all /
    index_add dispatch, meshplan/check/experts.py)."""
    routed_index_bytes: float
    """int64 bookkeeping per routed pair: top-k ids, sort order, source rows (twice), regroup and its inverse."""
    routed_gate_values: int
    """Gate weights kept per routed pair, in the activation dtype."""
    stage_outputs: bool
    """A pipeline stage holds each in-flight micro-batch's output until its backward (PipelineStage's
    forward cache); Megatron frees the output's data once sent."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LinearInputs:
    """Bytes per element of what a linear layer keeps of its input for its weight gradient."""

    own_bytes: float
    """The input of a linear layer that no other op keeps (the QKV and fc1 inputs after their norm, fc2's, the
    experts'): the activation dtype, or under Transformer Engine's FP8 recipes the quantized copy its forward
    made (``transformer_engine/pytorch/module/linear.py``: ``saved_inputmat = inputmat``, rowwise or
    columnwise data only), 1 byte an element and its scales."""
    copy_bytes: float = 0.0
    """A second, quantized copy a linear layer keeps of an input another op already keeps in bf16 (the output
    projection's input beside the attention kernel's output, a shared expert's input beside the router's):
    0 where it keeps the original instead (Megatron-Core ``set_save_original_input`` for every recipe but
    delayed scaling, attention.py and shared_experts.py), its own FP8 copy under delayed scaling."""

    @classmethod
    def plain(cls, act_bytes: float) -> LinearInputs:
        return cls(own_bytes=act_bytes)

    def block_input_bytes(self, act_bytes: float, *, moe_layer: bool) -> float:
        """What an MLP block keeps of its input, the norm's output: fc1's copy in a dense layer; in a MoE layer
        the router's, in the activation dtype (each routed copy's expert input is kept apart)."""
        return act_bytes if moe_layer else self.own_bytes


_FUSED_NORM = NormSaves(hidden_tensors=1, hidden_fp32=False, row_stats=0)  # dgamma from the input and rstd

SAVED_TENSORS: dict[Framework, SavedTensors] = {
    Framework.MEGATRON: SavedTensors(
        norms=dict.fromkeys(NormKind, _FUSED_NORM),
        sp_gathered_inputs=False,
        vocab_parallel_loss=True,
        loss_scalar_bytes=0.0,
        router_fp32_tensors=2,
        routed_hidden_copies=2,
        routed_index_bytes=0.0,
        routed_gate_values=0,
        stage_outputs=False,
    ),
    Framework.TORCH: SavedTensors(
        norms={
            # nn.RMSNorm decomposes (pow, mean, rsqrt, mul, mul): x.float(), rstd and x * rstd are saved
            NormKind.RMSNORM: NormSaves(hidden_tensors=2, weight_grad_tensors=1, hidden_fp32=True, row_stats=1),
            # native_layer_norm saves its input, mean and rstd (from source; not measured here)
            NormKind.LAYERNORM: NormSaves(hidden_tensors=1, hidden_fp32=False, row_stats=2),
        },
        sp_gathered_inputs=True,
        vocab_parallel_loss=False,
        loss_scalar_bytes=float(FP32_BYTES),
        router_fp32_tensors=1,
        routed_hidden_copies=3,
        routed_index_bytes=6.0 * 8,
        routed_gate_values=1,
        stage_outputs=True,
    ),
}


def norm_bytes_per_token(
    model: ModelSpec, *, act_bytes: float, framework: Framework = Framework.MEGATRON, frozen_weight: bool = False
) -> float:
    """Bytes one norm over the hidden size keeps per token (``frozen_weight``: its scale does not train)."""
    saves = SAVED_TENSORS[framework].norms[model.norm]
    width = FP32_BYTES if saves.hidden_fp32 else act_bytes
    tensors = saves.hidden_tensors - (saves.weight_grad_tensors if frozen_weight else 0)
    return tensors * width * model.hidden + FP32_BYTES * saves.row_stats


def norm_weight_grad_bytes_per_token(model: ModelSpec, *, act_bytes: float, framework: Framework) -> float:
    """What a norm keeps per token only for its own weight's gradient."""
    full = norm_bytes_per_token(model, act_bytes=act_bytes, framework=framework)
    return full - norm_bytes_per_token(model, act_bytes=act_bytes, framework=framework, frozen_weight=True)


def input_split(tp: Num, sp: Num, framework: Framework) -> Num:
    """Share of a block input (QKV, MLP, output head) a TP rank keeps: 1/t under SP unless kept gathered."""
    return 1.0 if SAVED_TENSORS[framework].sp_gathered_inputs else where(sp, 1.0 / tp, 1.0)


def _mlp_tensors(model: ModelSpec, kernels: Kernels) -> int:
    return GATED_SAVED_TENSORS[kernels] if model.mlp is MlpKind.GATED else PLAIN_SAVED_TENSORS


def attention_bytes_per_token(
    model: ModelSpec,
    *,
    seq_len: Num,
    tp: Num,
    sp: Num,
    attention: Attention,
    act_bytes: float,
    keep_scores: Num,
    framework: Framework = Framework.MEGATRON,
    inputs: LinearInputs | None = None,
) -> Num:
    """Bytes one attention block keeps per local token (norm included); ``inputs``: what a linear layer keeps of
    its input (default: the activation dtype)."""
    lin = LinearInputs.plain(act_bytes) if inputs is None else inputs
    rep = where(sp, 1.0 / tp, 1.0)
    beta, h, mask = act_bytes, model.hidden, 1.0 if model.dropout else 0.0
    norm = norm_bytes_per_token(model, act_bytes=beta, framework=framework)
    replicated = (norm + mask * h) * rep + lin.own_bytes * h * input_split(tp, sp, framework)
    if model.mla is not None:
        mla = model.mla
        # each low-rank latent: its norm's input and the up projection's input; and the shared rotary key
        latents = mla.q_lora_rank + mla.kv_lora_rank
        replicated = replicated + beta * (latents + mla.qk_rope_head_dim) + lin.own_bytes * latents
        qkv = beta * model.num_heads * (2 * mla.qk_head_dim + mla.v_head_dim) / tp
    else:
        kv_per_rank = maximum(model.num_kv_heads / tp, 1.0) * model.head_dim
        qkv = beta * (model.q_width / tp + 2 * kv_per_rank)
    out = (beta + lin.copy_bytes) * model.attn_out_width / tp  # the kernel's output is the projection's input
    heads = model.num_heads / tp
    # fused: a log-sum-exp per row; unfused: the softmax output (beta), and with dropout its 1-byte mask and
    # beta-wide output, one row of s keys per query
    core = FP32_BYTES * heads if attention.fused else keep_scores * heads * seq_len * (beta + (1.0 + beta) * mask)
    return replicated + qkv + out + core


def busiest_rank_share(ep: Num, routing_imbalance: float) -> Num:
    """The busiest expert-parallel rank's routed tokens over the mean: the stated imbalance under EP, 1 without it
    (a rank holding every expert receives every routed copy)."""
    return where(ep > 1, routing_imbalance, 1.0)


def mlp_bytes_per_token(
    model: ModelSpec,
    *,
    tp: Num,
    sp: Num,
    act_bytes: float,
    moe_layer: bool,
    kernels: Kernels = Kernels.FUSED,
    framework: Framework = Framework.MEGATRON,
    routing_imbalance: Num = 1.0,
    etp: Num = None,
    inputs: LinearInputs | None = None,
) -> Num:
    """Bytes one MLP (or MoE) block keeps per local token (norm included); the routed experts' share is scaled
    by ``routing_imbalance``, the busiest expert-parallel rank's tokens over the mean. ``inputs``: what a linear
    layer keeps of its input (the fc1 and fc2 inputs, each routed copy's expert input).

    Routed copies per local token: k, each expert's internals split by the expert TP degree e_t (``etp``, None:
    tp). With SP each rank dispatches its s/t tokens and the expert-TP group gathers e_t of them
    (Megatron-Core's all-to-all dispatcher), so a rank keeps k e_t / t copies per local token: k when e_t = t,
    k / t under MoE parallel folding with e_t = 1.
    """
    lin = LinearInputs.plain(act_bytes) if inputs is None else inputs
    rep, split = where(sp, 1.0 / tp, 1.0), input_split(tp, sp, framework)
    beta, h, mask = act_bytes, model.hidden, 1.0 if model.dropout else 0.0
    norm = norm_bytes_per_token(model, act_bytes=beta, framework=framework)
    is_moe = moe_layer and model.moe is not None
    replicated = (norm + mask * h) * rep + lin.block_input_bytes(beta, moe_layer=is_moe) * h * split
    if not is_moe:
        per_f = mlp_internal_bytes(model, kernels=kernels, act_bytes=beta, inputs=lin)
        return replicated + per_f * model.ffn_hidden / tp
    return replicated + moe_internal_bytes_per_token(
        model,
        tp=tp,
        sp=sp,
        act_bytes=act_bytes,
        kernels=kernels,
        framework=framework,
        routing_imbalance=routing_imbalance,
        etp=etp,
        inputs=lin,
    )


def moe_internal_bytes_per_token(
    model: ModelSpec,
    *,
    tp: Num,
    sp: Num,
    act_bytes: float,
    kernels: Kernels = Kernels.FUSED,
    framework: Framework = Framework.MEGATRON,
    routing_imbalance: Num = 1.0,
    etp: Num = None,
    inputs: LinearInputs | None = None,
) -> Num:
    """Bytes a MoE block keeps per local token beyond its norm and its input: the router's fp32 tensors, each
    routed copy's rows, bookkeeping and expert internals (scaled by ``routing_imbalance``), the shared experts'.
    All of it is what Megatron's ``moe`` recompute module drops: MoELayer checkpoints its whole forward (router,
    dispatch, experts, combine) and keeps only the block's input (megatron/core/transformer/moe/moe_layer.py,
    ``moe_layer_recompute``: ``tensor_parallel.checkpoint(custom_forward, False, hidden_states)``)."""
    assert model.moe is not None
    lin = LinearInputs.plain(act_bytes) if inputs is None else inputs
    rep, split = where(sp, 1.0 / tp, 1.0), input_split(tp, sp, framework)
    beta, h = act_bytes, model.hidden
    per_f = mlp_internal_bytes(model, kernels=kernels, act_bytes=beta, inputs=lin)
    moe, saved = model.moe, SAVED_TENSORS[framework]
    k = moe.experts_per_token
    router = saved.router_fp32_tensors * FP32_BYTES * moe.num_experts * rep
    # each routed copy: the expert's input (its fc1's) and the rest of the framework's h-wide copies
    hidden_copies = (saved.routed_hidden_copies - 1) * beta + lin.own_bytes
    per_pair = hidden_copies * h + saved.routed_index_bytes + saved.routed_gate_values * beta
    etp = tp if etp is None else etp
    copies = k * where(sp, etp / tp, 1.0)
    routed = routing_imbalance * copies * (per_pair + per_f * moe.expert_ffn_hidden / etp)
    shared_input = lin.copy_bytes * h * split if moe.num_shared_experts else 0.0
    shared = moe.num_shared_experts * per_f * moe.shared_hidden / tp + shared_input
    return router + routed + shared


def mlp_internal_bytes(model: ModelSpec, *, kernels: Kernels, act_bytes: float, inputs: LinearInputs) -> float:
    """Bytes an MLP keeps per element of its hidden width f: its f-wide tensors in the activation dtype, but
    for the last, the down projection's input, kept as that linear layer keeps its input."""
    return (_mlp_tensors(model, kernels) - 1) * act_bytes + inputs.own_bytes


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
    framework: Framework = Framework.MEGATRON,
    routing_imbalance: Num = 1.0,
    etp: Num = None,
    inputs: LinearInputs | None = None,
) -> Num:
    """Bytes one layer keeps for one micro-batch under the given recompute policy (``etp``: expert TP;
    ``inputs``: what a linear layer keeps of its input)."""
    tokens = seq_len / cp * micro_batch
    keep_scores = where(recompute == Recompute.NONE, 1.0, 0.0)
    kept = attention_bytes_per_token(
        model,
        seq_len=seq_len,
        tp=tp,
        sp=sp,
        attention=attention,
        act_bytes=act_bytes,
        keep_scores=keep_scores,
        framework=framework,
        inputs=inputs,
    ) + mlp_bytes_per_token(
        model,
        tp=tp,
        sp=sp,
        act_bytes=act_bytes,
        moe_layer=moe_layer,
        kernels=kernels,
        framework=framework,
        routing_imbalance=routing_imbalance,
        etp=etp,
        inputs=inputs,
    )
    full = layer_input_bytes_per_token(model, tp=tp, sp=sp, act_bytes=act_bytes)
    return tokens * where(recompute == Recompute.FULL, full, kept)


def head_bytes(
    model: ModelSpec,
    *,
    tokens: Num,
    tp: Num,
    sp: Num,
    act_bytes: float,
    framework: Framework = Framework.MEGATRON,
    frozen_head: bool = False,
    frozen_norm: bool = False,
) -> Num:
    """Final norm and output-projection input of one micro-batch on the last stage (2sbh, or 2sbh/t with SP).

    A frozen output head needs no weight gradient, so its input is not kept; a frozen final norm keeps only
    what its input gradient needs.
    """
    rep = where(sp, 1.0 / tp, 1.0)
    norm = norm_bytes_per_token(model, act_bytes=act_bytes, framework=framework, frozen_weight=frozen_norm)
    head_input = 0.0 if frozen_head else act_bytes * model.hidden * input_split(tp, sp, framework)
    return tokens * (norm * rep + head_input)


def vocab_parallel_loss(workload: Workload) -> bool:
    """The loss runs on the logits' vocabulary shards over the TP group (Megatron's vocab-parallel cross-entropy,
    PyTorch's loss_parallel), so no rank gathers the whole vocabulary: ``Conditions.loss_parallel`` where the run
    states it, else the framework's own."""
    stated = workload.conditions.loss_parallel
    return SAVED_TENSORS[workload.framework].vocab_parallel_loss if stated is None else bool(stated)


def loss_bytes(model: ModelSpec, *, tokens: Num, tp: Num, framework: Framework = Framework.MEGATRON) -> Num:
    """fp32 log-probabilities the loss keeps for one micro-batch: 4sbV/t vocab-parallel, 4sbV otherwise."""
    saved = SAVED_TENSORS[framework]
    vocab_split = tp if saved.vocab_parallel_loss else 1
    return FP32_BYTES * tokens * model.vocab_size / vocab_split + saved.loss_scalar_bytes


def stage_output_bytes(
    model: ModelSpec, *, tokens: Num, act_bytes: float, last: Num, framework: Framework = Framework.MEGATRON
) -> Num:
    """Output of one in-flight micro-batch a pipeline stage holds outside autograd: the (b, s, h) hidden states,
    or the logits on the last stage (0 where the framework frees it once sent)."""
    if not SAVED_TENSORS[framework].stage_outputs:
        return 0.0 * tokens
    return tokens * act_bytes * where(last, model.vocab_size, model.hidden)
