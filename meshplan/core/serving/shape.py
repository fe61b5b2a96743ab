"""A serving replica and what one of its GPUs holds and does per token.

The inputs of the serving phase model: the engine family's constants (catalog/serving/engines.toml),
the replica layout (TP x PP, experts over the TP group, attention-DP), the hardware, and the replica's
shape: the memory bill of its heaviest stage, the weights a forward reads, the matmul parameters and
attention FLOPs per token, the KV bytes per cached token. Formulas: docs/formulas.md, section 4b.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from meshplan.core.comm.cost import peer_share
from meshplan.core.memory.stage_params import stage_params
from meshplan.core.num import Num
from meshplan.core.params import count_params
from meshplan.core.serving.bill import (
    QUANT_GROUP,
    EngineMemory,
    MemoryFraction,
    ServingBill,
    kv_bytes_per_token_per_layer,
    serving_bill,
    weight_bytes_per_param,
)
from meshplan.core.time.flops import attention_gemms, mlp_gemms, sliding_keys
from meshplan.core.time.gemm import mean_depth
from meshplan.core.time.host import Launch
from meshplan.spec.cluster import GPU, Link
from meshplan.spec.model import ModelSpec
from meshplan.units import DTYPE_BYTES, DType

CUDA_GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048, 4096, 8192)
"""Batch sizes TensorRT-LLM's published PyTorch-backend recipe captures (perf-overview, v0.20 and v1.0 editions,
llm_options.yml: cuda_graph_config enable_padding true, batch_sizes 1 ... 8192): a decode-only step of b sequences
replays the graph of the smallest captured size >= b, its extra rows dummy requests; larger batches run eagerly."""
ACT_BYTES = 2.0
"""Activations between kernels and on the wire are 16-bit (fp8 GEMMs quantize inside the kernel)."""
MEMORY_OP_PASSES_HIDDEN = 12
"""Hidden-width passes of the memory-bound ops of one layer: two norms (read + write), two residual adds
(read 2 + write 1), the input of both all-reduces; rotary and the gated activation are counted apart."""


class AllReduceKernel(StrEnum):
    """Who runs a serving engine's TP all-reduces."""

    CUSTOM = "custom"
    """The engine's own one-/two-shot kernel over NVLink: a latency floor plus the ring's bytes."""
    NCCL = "nccl"
    """NCCL (torch.distributed): priced as NCCL's tuner prices it (core/comm/cost.py, nccl_time)."""


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
    kv_read_share: float
    """Share of that bandwidth the decode-attention kernel keeps while reading the KV cache (below 1 for paged
    caches: block-table lookups and scattered pages)."""
    weight_only_bandwidth_share: dict[str, float]
    """Share of that bandwidth a weight-only dequantizing kernel keeps, by weight dtype (int8, int4)."""
    matmul_share: dict[str, float]
    """Share of the GPU kind's large-GEMM efficiency (its calibration's matmul_efficiency_max) this engine's
    serving GEMMs reach, by compute dtype (bf16, fp8, int8, fp4); s(M) scales it down for small M."""
    moe_matmul_share: float
    """Share of the dense GEMMs' efficiency the routed-expert (grouped) GEMMs reach, on both sides of their
    roofline: the tensor-core rate and the rate they stream the expert weights at."""
    moe_source: str
    attention_efficiency: float
    """Share of 16-bit dense peak the prefill attention kernel reaches."""
    step_overhead_s: float
    """Fixed cost of each forward (scheduler, sampling, CUDA-graph launch, host sync)."""
    sequence_host_s: float = 0.0
    """Host seconds between two forwards for each sequence a step samples (scheduling, input preparation, the
    sampler's per-sequence loops, incremental detokenization, output processing), where the engine runs them in
    the loop that issues the forwards; 0 where they are priced in ``step_overhead_s`` or overlap the GPU."""
    separate_prefill: bool = False
    """Whether a batch of new prompts runs as a forward of its own, the decoding sequences waiting for it (its token
    budget not counting them), where other engines put prompt chunks and decodes in one forward."""
    separate_prefill_source: str = ""
    """Where the engine's code says so."""
    worker_sequence_host_s: float = 0.0
    """What each of a replica's worker processes adds per sequence a step samples, where the driver sends every
    worker the step's per-sequence metadata and gathers each one's output (vLLM 0.2's Ray control plane)."""
    layer_overhead_s: float
    """Launch gaps per layer of a decode step not hidden by CUDA graphs."""
    prefill_layer_overhead_s: float
    """Launch gaps per layer of a prefill forward (not graph-captured)."""
    allreduce: AllReduceKernel
    """Whose kernel runs the TP all-reduces."""
    allreduce_latency_s: float
    """Floor of one TP all-reduce in the engine's own kernel (custom one-/two-shot all-reduce) on two ranks."""
    allreduce_latency_per_rank_s: float
    """What each rank beyond two adds to that floor (a one-shot kernel reads every peer's buffer and raises a flag
    at each)."""
    two_batch_overlap: bool
    """Whether the engine splits a step of an EP layout (attention-DP, experts over the group) into two
    micro-batches whose compute and dispatch/combine overlap: each micro-batch reads the weights and runs its
    GEMMs at half the rows."""
    ep_overlap: float
    """Share of the EP dispatch/combine of a prefill forward (normal, SM-driven kernels) hidden behind compute."""
    ep_overlap_decode: float
    """The same share in a decode step (low-latency kernels, RDMA in flight without SMs)."""
    ep_imbalance: float
    """Load of the busiest expert-parallel rank over the mean (after the engine's expert balancing)."""
    pp_efficiency: float
    """Share of the ideal pipelined throughput a PP > 1 replica keeps (micro-batches unequal in size)."""
    max_batch: int
    """The engine's default cap on sequences per step."""
    max_num_tokens: int
    """The engine's default cap on tokens per step (prefill chunk budget)."""
    reserve_full_sequence: bool
    """Whether admission reserves KV for input + output (TensorRT-LLM guaranteed-no-evict) or input only."""
    memory_fraction: float
    """The engine's memory knob: vLLM gpu_memory_utilization, TensorRT-LLM kv_cache_free_gpu_mem_fraction,
    SGLang mem_fraction_static; ``memory_fraction_of`` says what it is a share of."""
    memory_fraction_of: MemoryFraction
    runtime_reserve_bytes: float
    """What the engine's runtime holds beside weights, activations and KV cache (CUDA context and library
    workspaces, CUDA-graph pool, sampler and decoder buffers)."""
    memory_source: str
    """Where the memory fraction, what it is a share of, and the runtime reserve come from."""
    source: str
    cuda_graph_padding: bool = False
    """Whether decode-only steps run as CUDA graphs padded up to the captured batch sizes (CUDA_GRAPH_BATCH_SIZES):
    the padded rows pass through every GEMM, all-reduce and memory-bound op, not through the KV cache."""
    launch: Launch = Launch.CUDAGRAPH
    """How the host issues each layer's kernels: replayed CUDA graphs (every engine's default: the in-graph floor
    ``layer_overhead_s`` is the whole fixed cost), or op by op (``eager``: vLLM --enforce-eager, SGLang
    --disable-cuda-graph, engine versions without graphs) or from torch.compile's wrapper (``compile``), where a
    layer cannot run faster than the host issues its kernels (``serving_host_layer_s``)."""
    fp8_kv_with: tuple[str, ...] = ()
    """Weight dtypes with which the engine keeps an FP8 KV cache when the user leaves its KV dtype to it (the model's
    16-bit dtype otherwise)."""
    int4_group_size: int = QUANT_GROUP
    """Weights per int4 scale group of the engine's usual int4 checkpoints (a 16-bit scale and zero each)."""
    defaults_source: str = ""
    """Where the engine's KV dtype and int4 group size defaults come from."""

    def memory(self) -> EngineMemory:
        return EngineMemory(
            fraction=self.memory_fraction, of=self.memory_fraction_of, runtime_reserve_bytes=self.runtime_reserve_bytes
        )


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
        """The link a group of ``group`` GPUs talks over: the scale-up link inside one domain (on a board of direct
        links, the group's own peers' share of it: ``Link.switched``), the NIC beyond."""
        if group > self.gpu.scale_up_domain:
            return self.scale_out
        share = peer_share(group, domain=self.gpu.scale_up_domain, switched=self.scale_up.switched)
        if share == 1.0:
            return self.scale_up
        return dataclasses.replace(self.scale_up, bandwidth_bytes_per_s=self.scale_up.bandwidth_bytes_per_s * share)


def default_quant(weights: DType, gpu: GPU) -> Quant:
    """W8A8/W4A4 where the GPU has tensor cores for the weight dtype (fp8, fp4), weight-only otherwise: FP4 weights
    on a GPU without FP4 tensor cores are dequantized inside the GEMM to 16 bits, as int4's are (Marlin's FP4 path:
    vLLM runs gpt-oss's MXFP4 experts so on Hopper, VLLM_MXFP4_USE_MARLIN)."""
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
    gemm_depth: float = 1.0
    """How many times longer than on the plateau the matmuls other than the routed experts run for their K and
    N (gemm.mean_depth over the stage's layers, at the compute dtype's ridge point)."""
    expert_depth: float = 1.0
    """The same for the routed experts' matmuls."""

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
    per_param = weight_bytes_per_param(layout.weights_dtype, hidden=model.hidden, group=layout.quant_group)
    stage = stage_params(params, model, tp=tp, pp=pp, ep=1, stage=pp - 1)
    layers = int(stage.dense_layers + stage.moe_layers)
    d, m = params.dense_layer, params.moe_layer
    replicated = (d.attention * stage.dense_layers + m.attention * stage.moe_layers) * (1 - 1 / tp)
    replicated *= layout.dp_attention
    bill = serving_bill(
        model,
        gpu=gpu,
        tp=tp,
        pp=pp,
        weight_dtype=layout.weights_dtype,
        kv_dtype=layout.kv_dtype,
        context=context,
        quant_group=layout.quant_group,
        memory=cal.memory(),
        prefill_chunk_tokens=cal.max_num_tokens,
        replicated_weights_bytes=replicated * per_param,
    )
    frac = model.moe.experts_per_token / model.moe.num_experts if model.moe else 0.0
    per_layer = stage.dense_layers * (d.attention + d.mlp + d.shared_experts)
    per_layer += stage.moe_layers * (m.attention + m.mlp + m.shared_experts)
    per_layer_kv = kv_bytes_per_token_per_layer(model, tp=attn_tp, kv_dtype=layout.kv_dtype)
    gemm_depth, expert_depth = _depths(model, gpu, layout, attn_tp=attn_tp, moe_layers=int(stage.moe_layers))
    return ReplicaShape(
        bill=bill,
        layers=layers,
        dense_weight_bytes=bill.weights_bytes - float(stage.experts) * per_param,
        expert_weight_bytes=float(stage.experts) * per_param,
        kv_budget_bytes=bill.kv_budget_bytes,
        gemm_params_per_token=float(per_layer) / attn_tp,
        expert_params_per_token=float(stage.moe_layers * m.routed_experts) * frac / attn_tp,
        lm_head_params=model.vocab_size * model.hidden / attn_tp,
        kv_bytes_per_token=layers * per_layer_kv,
        attn_flops_per_pair_decode=layers * _attn_flops_per_pair(model, absorbed=True) / attn_tp,
        attn_flops_per_pair_prefill=layers * _attn_flops_per_pair(model, absorbed=False) / attn_tp,
        expert_fraction=frac,
        memory_bytes_per_token=layers * ACT_BYTES * _memory_passes(model, tp=attn_tp),
        gemm_depth=gemm_depth,
        expert_depth=expert_depth,
    )


def _depths(model: ModelSpec, gpu: GPU, layout: ServeLayout, *, attn_tp: int, moe_layers: int) -> tuple[float, float]:
    """(other matmuls, routed experts): ``gemm.mean_depth`` of one GPU's matmuls per token, at the ridge point
    of the compute dtype (the K and N a GEMM has do not depend on the batch)."""
    ridge = gpu.peak(compute_dtype(layout)) / gpu.hbm_bandwidth_bytes_per_s
    moe = model.moe is not None and moe_layers > 0
    layer = attention_gemms(model, tokens=1, tp=attn_tp) + mlp_gemms(model, tokens=1, tp=attn_tp, ep=1, moe_layer=moe)
    if not moe:
        return mean_depth(layer, ridge=ridge), 1.0
    experts = [g for g in layer if g.name.startswith("expert_")]
    others = [g for g in layer if not g.name.startswith("expert_")]
    return mean_depth(others, ridge=ridge), mean_depth(experts, ridge=ridge)


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


def sliding_context(model: ModelSpec, context: Num) -> Num:
    """Cached tokens one query reads on average over the layers (sliding-window layers capped)."""
    if not model.sliding_window:
        return context
    share = model.sliding_share
    return (1 - share) * context + share * np.minimum(context, model.sliding_window)


def prefill_keys(model: ModelSpec, *, cached: Num, chunk: Num) -> Num:
    """Keys one query of a prefill chunk reaches on average over the layers: a chunk of ``chunk`` tokens after
    ``cached`` ones attends c0 + T/2 keys a query in a full layer, at most its window in a sliding one
    (flops.sliding_keys)."""
    full = cached + chunk / 2
    if not model.sliding_window:
        return full
    share = model.sliding_share
    return (1 - share) * full + share * sliding_keys(window=model.sliding_window, cached=cached, chunk=chunk)


def kv_dtype_bytes(dtype: DType) -> float:
    if dtype not in (DType.BF16, DType.FP16, DType.FP8):
        raise ValueError(f"KV cache dtype must be bf16, fp16 or fp8, got {dtype}")
    return DTYPE_BYTES[dtype]


def graph_batch(batch: Num) -> Num:
    """Rows a CUDA-graph-padded decode step computes for ``batch`` sequences: the smallest captured batch size
    >= batch (CUDA_GRAPH_BATCH_SIZES), the batch itself beyond the largest; arrays broadcast."""
    sizes = np.asarray(CUDA_GRAPH_BATCH_SIZES, dtype=np.float64)
    b = np.asarray(batch, dtype=np.float64)
    padded = sizes[np.minimum(np.searchsorted(sizes, b), sizes.size - 1)]
    out = np.where(b > sizes[-1], b, np.maximum(padded, b))
    return float(out) if out.ndim == 0 else out
