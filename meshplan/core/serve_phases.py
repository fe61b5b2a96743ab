"""Serving phases on one GPU: a decode step and a prefill chunk, term by term.

Decode step of a batch of B sequences with context c (per GPU of a TP x PP replica):
  GEMMs     max(W_read / (HBM e_hbm), 2 P_active B / (peak e_mm s(B)))   weights read once, then compute bound
  attention max(B c kv_tok / (HBM e_hbm), F_attn(B, c) / (peak e_attn))  the KV cache of every sequence
  + TP all-reduces (2 per layer, alpha + 2(n-1)/n bytes / bw) + EP dispatch/combine + PP sends + overheads
where s(M) = M / (M + d_half) is the GEMM shape efficiency of the GPU kind. Each kernel class is its own
roofline (a GEMM is memory or compute bound, the attention kernel likewise) and the classes run one after
another. Prefill of T tokens after c0 cached ones: the same GEMMs with M = T, causal attention
4 T (c0 + T/2) a d per layer, memory-bound ops at HBM speed. Every array argument broadcasts (numpy).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from meshplan.core.memory import stage_params
from meshplan.core.num import Num, maximum, where
from meshplan.core.params import count_params
from meshplan.core.serving import (
    QUANT_GROUP,
    ServingBill,
    kv_bytes_per_token_per_layer,
    serving_bill,
    weight_bytes_per_param,
)
from meshplan.spec.cluster import GPU, Link
from meshplan.spec.model import ModelSpec
from meshplan.units import DTYPE_BYTES, DType

ACT_BYTES = 2.0
"""Activations between kernels and on the wire are 16-bit (fp8 GEMMs quantize inside the kernel)."""
EP_DISPATCH_BYTES = 1.0
"""Bytes per value a token's hidden state takes to its experts (fp8 dispatch, DeepEP) ..."""
EP_COMBINE_BYTES = 2.0
"""... and back from them (bf16 combine)."""
MEMORY_OP_PASSES_HIDDEN = 12
"""Hidden-width passes of the memory-bound ops of one layer: two norms (read + write), two residual adds
(read 2 + write 1), the input of both all-reduces; rotary and the gated activation are counted apart."""


class Quant(StrEnum):
    """How quantized weights meet the activations."""

    NONE = "none"
    """16-bit weights, 16-bit matmuls."""
    WEIGHT_ONLY = "weight-only"
    """W8A16 / W4A16: weights are dequantized to 16 bits inside the kernel; the matmul runs in bf16."""
    WEIGHT_ACTIVATION = "w-a"
    """W8A8 / W4A4: activations are quantized too and the matmul runs at the low-precision peak."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeCalibration:
    """Constants of one engine family on one GPU kind (catalog/serving/engines.toml), each with its source."""

    engine: str
    hbm_efficiency: float
    """Share of HBM bandwidth a decode step's weight and KV streaming reaches."""
    weight_only_bandwidth_share: dict[str, float]
    """Share of that bandwidth a weight-only dequantizing kernel keeps, by weight dtype (int8, int4)."""
    matmul_share: dict[str, float]
    """Share of the GPU kind's large-GEMM efficiency (its calibration's matmul_efficiency_max) this engine's
    serving GEMMs reach, by compute dtype (bf16, fp8, int8, fp4); s(M) scales it down for small M."""
    attention_efficiency: float
    """Share of 16-bit dense peak the prefill attention kernel reaches."""
    step_overhead_s: float
    """Fixed cost of each forward (scheduler, sampling, CUDA-graph launch, host sync)."""
    layer_overhead_s: float
    """Launch gaps per layer of a decode step not hidden by CUDA graphs."""
    prefill_layer_overhead_s: float
    """Launch gaps per layer of a prefill forward (not graph-captured)."""
    allreduce_latency_s: float
    """Floor of one small TP all-reduce in this engine (custom one-shot kernels or NCCL)."""
    ep_overlap: float
    ep_imbalance: float
    pp_efficiency: float
    """Share of the ideal pipelined throughput a PP > 1 replica keeps (micro-batches unequal in size)."""
    """Load of the busiest expert-parallel rank over the mean (after the engine's expert balancing)."""
    """Share of EP dispatch/combine hidden behind compute (two-batch overlap)."""
    max_batch: int
    """The engine's default cap on sequences per step."""
    max_num_tokens: int
    """The engine's default cap on tokens per step (prefill chunk budget)."""
    reserve_full_sequence: bool
    """Whether admission reserves KV for input + output (TensorRT-LLM guaranteed-no-evict) or input only."""
    memory_fraction: float
    """Share of HBM the engine may fill (vLLM gpu_memory_utilization), or of what the weights, activations
    and runtime leave free (TensorRT-LLM kv_cache_free_gpu_mem_fraction) when ``memory_fraction_of_free``."""
    memory_fraction_of_free: bool
    source: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeLayout:
    """One serving replica: tp x pp GPUs; experts split over the tp group (ep ranks, expert-TP beyond)."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp_attention: bool = False
    """Attention data-parallel over the tp ranks (each keeps its own sequences and all attention weights)."""
    weights_dtype: DType = DType.BF16
    kv_dtype: DType = DType.BF16
    quant: Quant = Quant.NONE
    quant_group: int = QUANT_GROUP
    """Weights per int4 scale group (128: AWQ/GPTQ; gpt-fast uses 32)."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "ep"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.ep > self.tp or self.tp % self.ep:
            raise ValueError(f"ep={self.ep} must divide tp={self.tp} (experts are split inside the TP group)")

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp


@dataclass(frozen=True, slots=True, kw_only=True)
class Hardware:
    """The GPU, the links a replica's groups use, and the engine's constants."""

    gpu: GPU
    scale_up: Link
    scale_out: Link
    cal: ServeCalibration

    def link(self, group: int) -> Link:
        return self.scale_up if group <= self.gpu.scale_up_domain else self.scale_out


def default_quant(weights: DType, gpu: GPU) -> Quant:
    """W8A8/W4A4 where the GPU has tensor cores for the weight dtype (fp8, fp4), weight-only otherwise."""
    if weights in (DType.BF16, DType.FP16):
        return Quant.NONE
    if weights in (DType.FP8, DType.FP4) and weights in gpu.peak_flops:
        return Quant.WEIGHT_ACTIVATION
    return Quant.WEIGHT_ONLY


def compute_dtype(layout: ServeLayout) -> DType:
    return layout.weights_dtype if layout.quant is Quant.WEIGHT_ACTIVATION else DType.BF16


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaShape:
    """What one GPU of the replica holds and does per token: the bill plus the FLOP and byte counts of a step."""

    bill: ServingBill
    layers: int
    """Layers of the heaviest stage."""
    dense_weight_bytes: float
    """Weights read by every forward whatever the batch (all but the routed experts)."""
    expert_weight_bytes: float
    """Routed-expert weights on this GPU (read only where a token is routed)."""
    kv_budget_bytes: float
    """HBM left for the KV cache on this GPU."""
    gemm_params_per_token: float
    """Matmul parameters on this GPU one local token passes, routed experts and lm_head apart."""
    expert_params_per_token: float
    """Routed-expert parameters on this GPU per local token (all experts at k/E)."""
    lm_head_params: float
    kv_bytes_per_token: float
    attn_flops_per_pair_decode: float
    """Attention-core FLOPs per (query, cached token) pair, all layers of the stage (QK^T and AV); MLA in
    its absorbed form (queries meet the latent: d_c + d_R for scores, d_c for values)."""
    attn_flops_per_pair_prefill: float
    """The same in prefill, where MLA runs as plain multi-head attention (d_nope + d_R, then d_v)."""
    expert_fraction: float
    """k / E: the chance a token picks a given routed expert (0 for dense models)."""
    memory_bytes_per_token: float
    """Bytes memory-bound ops move per token (all layers of the stage)."""

    def max_sequences(self, model: ModelSpec, *, tokens_per_sequence: Num) -> Num:
        """Sequences whose KV cache fits beside the weights (sliding-window layers capped)."""
        per_sequence = self.kv_bytes_per_token * sliding_context(model, tokens_per_sequence)
        return np.floor(self.kv_budget_bytes / per_sequence)


def replica_shape(model: ModelSpec, hw: Hardware, layout: ServeLayout, *, context: int) -> ReplicaShape:
    """Per-GPU bytes and FLOPs of ``layout`` (the heavier of the first and last pipeline stages).

    Attention-DP keeps every attention weight and the KV heads of its own sequences on each rank; the
    MLPs and experts stay split over the group and see the tokens of all its ranks.
    """
    params = count_params(model)
    tp, pp = layout.tp, layout.pp
    attn_tp = 1 if layout.dp_attention else tp
    if model.num_heads % attn_tp:
        raise ValueError(f"tp={attn_tp} does not divide the {model.num_heads} attention heads of {model.name}")
    cal, gpu = hw.cal, hw.gpu
    bill = serving_bill(
        model,
        gpu=gpu,
        tp=tp,
        pp=pp,
        weight_dtype=layout.weights_dtype,
        kv_dtype=layout.kv_dtype,
        context=context,
        quant_group=layout.quant_group,
        gpu_memory_utilization=1.0 if cal.memory_fraction_of_free else cal.memory_fraction,
    )
    per_param = weight_bytes_per_param(layout.weights_dtype, hidden=model.hidden, group=layout.quant_group)
    stage = stage_params(params, model, tp=tp, pp=pp, ep=1, stage=pp - 1)
    layers = int(stage.dense_layers + stage.moe_layers)
    d, m = params.dense_layer, params.moe_layer
    replicated = (d.attention * stage.dense_layers + m.attention * stage.moe_layers) * (1 - 1 / tp)
    replicated *= layout.dp_attention
    frac = model.moe.experts_per_token / model.moe.num_experts if model.moe else 0.0
    per_layer = stage.dense_layers * (d.attention + d.mlp + d.shared_experts)
    per_layer += stage.moe_layers * (m.attention + m.mlp + m.shared_experts)
    free_share = cal.memory_fraction if cal.memory_fraction_of_free else 1.0
    per_layer_kv = kv_bytes_per_token_per_layer(model, tp=attn_tp, kv_dtype=layout.kv_dtype)
    return ReplicaShape(
        bill=bill,
        layers=layers,
        dense_weight_bytes=bill.weights_bytes - float(stage.experts) * per_param + replicated * per_param,
        expert_weight_bytes=float(stage.experts) * per_param,
        kv_budget_bytes=max(bill.kv_budget_bytes - replicated * per_param, 0.0) * free_share,
        gemm_params_per_token=float(per_layer) / attn_tp,
        expert_params_per_token=float(stage.moe_layers * m.routed_experts) * frac / attn_tp,
        lm_head_params=model.vocab_size * model.hidden / attn_tp,
        kv_bytes_per_token=layers * per_layer_kv,
        attn_flops_per_pair_decode=layers * _attn_flops_per_pair(model, absorbed=True) / attn_tp,
        attn_flops_per_pair_prefill=layers * _attn_flops_per_pair(model, absorbed=False) / attn_tp,
        expert_fraction=frac,
        memory_bytes_per_token=layers * ACT_BYTES * _memory_passes(model, tp=attn_tp),
    )


def _attn_flops_per_pair(model: ModelSpec, *, absorbed: bool) -> float:
    """QK^T and AV FLOPs of one layer for one query and one cached token."""
    if model.mla is not None:
        mla = model.mla
        if absorbed:
            return 2.0 * model.num_heads * (2 * mla.kv_lora_rank + mla.qk_rope_head_dim)
        return 2.0 * model.num_heads * (mla.qk_head_dim + mla.v_head_dim)
    return 4.0 * model.num_heads * model.head_dim


def _memory_passes(model: ModelSpec, *, tp: int) -> float:
    ffn = model.moe.experts_per_token * model.moe.expert_ffn_hidden if model.moe else model.ffn_hidden
    return MEMORY_OP_PASSES_HIDDEN * model.hidden + (3 * ffn + 2 * (model.q_width + model.kv_width)) / tp


@dataclass(frozen=True, slots=True, kw_only=True)
class Forward:
    """One forward of the stage on one GPU: seconds by term (arrays where inputs are arrays)."""

    weights_read_s: Num
    kv_read_s: Num
    gemm_compute_s: Num
    attention_compute_s: Num
    memory_ops_s: Num
    tp_comm_s: Num
    ep_comm_s: Num
    pp_comm_s: Num
    overhead_s: Num

    @property
    def gemm_s(self) -> Num:
        return maximum(self.weights_read_s, self.gemm_compute_s)

    @property
    def attention_s(self) -> Num:
        return maximum(self.kv_read_s, self.attention_compute_s)

    @property
    def comm_s(self) -> Num:
        return self.tp_comm_s + self.ep_comm_s + self.pp_comm_s

    @property
    def total_s(self) -> Num:
        return self.gemm_s + self.attention_s + self.memory_ops_s + self.comm_s + self.overhead_s

    def breakdown(self) -> dict[str, Num]:
        """Seconds by what bounds them: the binding side of each roofline, then the rest."""
        gemm_mem = self.weights_read_s >= self.gemm_compute_s
        attn_mem = self.kv_read_s >= self.attention_compute_s
        return {
            "weights_read_s": where(gemm_mem, self.weights_read_s, 0.0),
            "kv_read_s": where(attn_mem, self.kv_read_s, 0.0),
            "compute_s": where(gemm_mem, 0.0, self.gemm_compute_s)
            + where(attn_mem, 0.0, self.attention_compute_s)
            + self.memory_ops_s,
            "communication_s": self.comm_s,
            "overhead_s": self.overhead_s,
        }


def pipeline_factor(hw: Hardware, layout: ServeLayout) -> float:
    """Seconds of a token's round through all stages per second of one stage's forward: pp, over the
    engine's pipeline efficiency when pp > 1."""
    return layout.pp / (hw.cal.pp_efficiency if layout.pp > 1 else 1.0)


def shape_efficiency(m: Num, half_dim: float) -> Num:
    """s(M) = M / (M + d_half): a GEMM with few rows falls off its peak (compute.gemm_time's factor)."""
    return m / (m + half_dim)


def _hbm_bytes_per_s(hw: Hardware, layout: ServeLayout) -> float:
    share = hw.cal.weight_only_bandwidth_share.get(layout.weights_dtype.value, 1.0)
    share = share if layout.quant is Quant.WEIGHT_ONLY else 1.0
    return hw.gpu.hbm_bandwidth_bytes_per_s * hw.cal.hbm_efficiency * share


def allreduce_s(size_bytes: Num, *, n: int, link: Link, floor_s: float) -> Num:
    """One all-reduce of ``size_bytes`` over ``n`` ranks: a latency floor plus the ring's 2(n-1)/n bytes."""
    if n == 1:
        return 0.0 * size_bytes
    return floor_s + 2 * (n - 1) / n * size_bytes / link.effective_bytes_per_s


def forward(
    model: ModelSpec,
    shape: ReplicaShape,
    hw: Hardware,
    layout: ServeLayout,
    *,
    new_tokens: Num,
    decode_pairs: Num,
    prefill_pairs: Num,
    kv_tokens_read: Num,
    group_tokens: Num,
    logits: Num,
    layer_overhead_s: float,
    ep_per_node: bool,
) -> Forward:
    """One forward on one GPU: ``new_tokens`` local tokens attend over (query, key) pairs, decode and
    prefill ones apart, reading ``kv_tokens_read`` cached tokens; ``group_tokens`` tokens reach the
    experts of the TP group; ``logits`` tokens go through the LM head."""
    cal, gpu = hw.cal, hw.gpu
    hbm = _hbm_bytes_per_s(hw, layout)
    dtype = compute_dtype(layout)
    peak = gpu.peak(dtype) * gpu.calibration.matmul_efficiency_max * cal.matmul_share.get(dtype.value, 1.0)
    touched = 1.0 - (1.0 - shape.expert_fraction) ** group_tokens if model.moe else 0.0
    weights = shape.dense_weight_bytes + shape.expert_weight_bytes * touched
    half = gpu.calibration.matmul_half_dim
    dense_flops = 2 * (shape.gemm_params_per_token * new_tokens + shape.lm_head_params * logits)
    gemm = dense_flops / (peak * shape_efficiency(maximum(new_tokens, 1.0), half))
    if model.moe is not None:  # the busiest expert rank sets the pace: imbalance x the mean load
        expert_rows = maximum(group_tokens * shape.expert_fraction, 1.0)
        imbalance = cal.ep_imbalance if layout.ep > 1 else 1.0
        expert_flops = 2 * shape.expert_params_per_token * new_tokens * imbalance
        gemm = gemm + expert_flops / (peak * shape_efficiency(expert_rows, half))
    attn_flops = decode_pairs * shape.attn_flops_per_pair_decode + prefill_pairs * shape.attn_flops_per_pair_prefill
    attn = attn_flops / (gpu.peak(DType.BF16) * cal.attention_efficiency)
    tp_link = hw.link(layout.tp)
    ar_bytes = new_tokens * model.hidden * ACT_BYTES * (layout.tp if layout.dp_attention else 1)
    n_ar = 0 if layout.dp_attention and model.moe else 2
    tp_comm = n_ar * shape.layers * allreduce_s(ar_bytes, n=layout.tp, link=tp_link, floor_s=cal.allreduce_latency_s)
    return Forward(
        weights_read_s=weights / hbm,
        kv_read_s=kv_tokens_read * shape.kv_bytes_per_token / hbm,
        gemm_compute_s=gemm,
        attention_compute_s=attn,
        memory_ops_s=new_tokens * shape.memory_bytes_per_token / (gpu.hbm_bandwidth_bytes_per_s * cal.hbm_efficiency),
        tp_comm_s=tp_comm,
        ep_comm_s=_ep_comm_s(model, shape, hw, layout, new_tokens=new_tokens, per_node=ep_per_node),
        pp_comm_s=_pp_send_s(model, hw, layout, new_tokens=new_tokens),
        overhead_s=cal.step_overhead_s + layer_overhead_s * shape.layers + 0.0 * new_tokens,
    )


def _ep_comm_s(
    model: ModelSpec, shape: ReplicaShape, hw: Hardware, layout: ServeLayout, *, new_tokens: Num, per_node: bool
) -> Num:
    """Dispatch (fp8) and combine (bf16) all-to-all of each MoE layer under attention-DP, the part not hidden.

    Of a token's k copies, k (D - 1) / ep go to other GPUs of its scale-up domain (D GPUs) and k (ep - D) / ep
    to other domains over the NICs. DeepEP's normal kernels (prefill, ``per_node``) send a token once to
    each other domain it needs and forward it over NVLink there: (n - 1)(1 - (1 - 1/n)^k) NIC copies for n
    domains; its low-latency kernels (decode) send every copy over RDMA. The slower of the two paths sets
    the pace; each collective adds log2(ep) link latencies."""
    if model.moe is None or not layout.dp_attention or layout.ep == 1:
        return 0.0 * new_tokens
    k, ep = model.moe.experts_per_token, layout.ep
    domain = min(hw.gpu.scale_up_domain, ep)
    nodes = -(-ep // domain)
    on_copies = k * (domain - 1) / ep
    off_copies = (nodes - 1) * (1 - (1 - 1 / nodes) ** k) if per_node else k * (ep - domain) / ep
    per_copy = new_tokens * model.hidden * (EP_DISPATCH_BYTES + EP_COMBINE_BYTES)
    per_layer = maximum(
        per_copy * on_copies / hw.scale_up.effective_bytes_per_s,
        per_copy * off_copies / hw.scale_out.effective_bytes_per_s,
    ) + 2 * hw.link(ep).latency_s * np.log2(ep)
    moe_layers = min(model.num_moe_layers, shape.layers)
    return moe_layers * per_layer * hw.cal.ep_imbalance * (1 - hw.cal.ep_overlap)


def _pp_send_s(model: ModelSpec, hw: Hardware, layout: ServeLayout, *, new_tokens: Num) -> Num:
    """The activation a stage hands to the next (one send per forward; the last stage sends nothing)."""
    if layout.pp == 1:
        return 0.0 * new_tokens
    link = hw.link(layout.tp * layout.pp)
    return link.latency_s + new_tokens * model.hidden * ACT_BYTES / link.effective_bytes_per_s


def decode_step(
    model: ModelSpec,
    shape: ReplicaShape,
    hw: Hardware,
    layout: ServeLayout,
    *,
    batch: Num,
    context: Num,
    prefill_tokens: Num = 0.0,
) -> Forward:
    """One decode step of ``batch`` sequences per GPU (per micro-batch under PP) at mean ``context``,
    with ``prefill_tokens`` of chunked prefill riding along (their attention at mean depth context/2)."""
    sliding = sliding_context(model, context)
    group = batch * (layout.tp if layout.dp_attention else 1) + prefill_tokens
    new = batch + prefill_tokens
    return forward(
        model,
        shape,
        hw,
        layout,
        new_tokens=new,
        decode_pairs=batch * sliding,
        prefill_pairs=prefill_tokens * context / 2,
        kv_tokens_read=batch * sliding,
        group_tokens=group,
        logits=batch,
        layer_overhead_s=hw.cal.layer_overhead_s,
        ep_per_node=False,
    )


def prefill(
    model: ModelSpec,
    shape: ReplicaShape,
    hw: Hardware,
    layout: ServeLayout,
    *,
    tokens: Num,
    cached: Num = 0.0,
    sequences: Num = 1.0,
) -> Forward:
    """A prefill forward of ``tokens`` new tokens after ``cached`` ones (causal: each attends to half the
    chunk on average), ``sequences`` of them ending here (their last token goes through the LM head)."""
    group = tokens * (layout.tp if layout.dp_attention else 1)
    return forward(
        model,
        shape,
        hw,
        layout,
        new_tokens=tokens,
        decode_pairs=0.0,
        prefill_pairs=tokens * (cached + tokens / (2 * sequences)),
        kv_tokens_read=0.0 * tokens,
        group_tokens=group,
        logits=sequences,
        layer_overhead_s=hw.cal.prefill_layer_overhead_s,
        ep_per_node=True,
    )


def sliding_context(model: ModelSpec, context: Num) -> Num:
    """Cached tokens one query reads on average over the layers (sliding-window layers capped)."""
    if not model.sliding_window:
        return context
    share = model.num_sliding_layers / model.num_layers
    return (1 - share) * context + share * np.minimum(context, model.sliding_window)


def kv_dtype_bytes(dtype: DType) -> float:
    if dtype not in (DType.BF16, DType.FP16, DType.FP8):
        raise ValueError(f"KV cache dtype must be bf16, fp16 or fp8, got {dtype}")
    return DTYPE_BYTES[dtype]
