"""The serving bill of one GPU: weights, the KV cache, a prefill chunk, and what fits.

KV cache per token per layer: 2 * k * d * bytes (K and V of every KV head;
Kwon et al. 2023 Sec. 3 give 800 KiB/token for a 13B MHA model in fp16); MLA
caches only the latent and the RoPE key, (d_c + d_R) * bytes (DeepSeek-V2/V3
Sec. 2.1); sliding-window layers cache at most ``window`` tokens per sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from meshplan.core.finetune import nf4_bytes_per_param
from meshplan.core.memory.stage_params import StageParams, stage_params
from meshplan.core.params import ParamCount, count_params
from meshplan.core.stages import vocab_params_per_rank
from meshplan.spec.cluster import GPU
from meshplan.spec.model import ModelSpec
from meshplan.units import DTYPE_BYTES, DType

QUANT_GROUP = 128
"""Weights per scale group of int4 quantization (AWQ / GPTQ default)."""

SERVING_WEIGHT_DTYPES = (DType.BF16, DType.FP16, DType.FP8, DType.INT8, DType.INT4, DType.FP4)


def weight_bytes_per_param(dtype: DType, *, hidden: int, group: int = QUANT_GROUP) -> float:
    """Bytes per quantized matmul weight, scales included.

    int4: a 16-bit scale and a 16-bit zero point per group of ``group`` weights (128: AWQ/GPTQ);
    fp4: NVFP4's 8-bit scale per 16 values; int8: a 16-bit scale per output
    row (1/h per weight); fp8 and 16-bit: one scale per tensor (negligible).
    """
    if dtype not in SERVING_WEIGHT_DTYPES:
        raise ValueError(f"serving weights cannot be {dtype}; choose one of {', '.join(SERVING_WEIGHT_DTYPES)}")
    overhead = {DType.INT4: 4 / group, DType.FP4: 1 / 16, DType.INT8: 2 / hidden}.get(dtype, 0.0)
    return DTYPE_BYTES[dtype] + overhead


def _unquantized_params(params: ParamCount) -> int:
    """Parameters that stay in 16 bits when matmul weights are quantized: embeddings, head, norms, routers."""
    layers = params.num_dense_layers * (params.dense_layer.norms + params.dense_layer.router)
    layers += params.num_moe_layers * (params.moe_layer.norms + params.moe_layer.router)
    return params.embedding + params.lm_head + params.final_norm + layers


def _stage_unquantized(
    params: ParamCount, model: ModelSpec, *, tp: int, pp: int, stage: int, held: StageParams
) -> float:
    """16-bit parameters on one GPU of ``stage``: its share of embedding and head, its norms and routers."""
    layers = held.dense_layers * (params.dense_layer.norms + params.dense_layer.router)
    layers += held.moe_layers * (params.moe_layer.norms + params.moe_layer.router)
    vocab_rows = vocab_params_per_rank(model, tp=tp)
    first = vocab_rows + params.position_embedding if stage == 0 else 0.0
    last = (0.0 if model.tied_embeddings and pp == 1 else vocab_rows) + params.final_norm if stage == pp - 1 else 0.0
    return float(layers + first + last)


def weights_bytes_total(model: ModelSpec, dtype: DType) -> float:
    """All weights of the model in ``dtype`` (matmul weights quantized, the rest 16-bit); NF4 is QLoRA's, with
    double-quantized block scales (4.127 bits per weight)."""
    params = count_params(model)
    plain = _unquantized_params(params)
    return (params.total - plain) * _matmul_bytes_per_param(model, dtype) + plain * 2.0


def _matmul_bytes_per_param(model: ModelSpec, dtype: DType) -> float:
    """Bytes a quantized matmul weight takes: QLoRA's double-quantized NF4, or a serving dtype's."""
    if dtype is DType.NF4:
        return nf4_bytes_per_param(double_quant=True)
    return weight_bytes_per_param(dtype, hidden=model.hidden)


class MemoryFraction(StrEnum):
    """What a serving engine's memory fraction is a share of (each engine's own knob)."""

    HBM = "hbm"
    """vLLM --gpu-memory-utilization: weights, activations, runtime reserve and KV cache within f x HBM."""
    FREE = "free"
    """TensorRT-LLM kv_cache_free_gpu_mem_fraction: the KV cache is f x what weights, activations and the runtime
    leave free."""
    STATIC = "static"
    """SGLang --mem-fraction-static: weights and KV cache within f x HBM; activations, CUDA graphs and the
    runtime live in the rest."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineMemory:
    """How a serving engine sizes its KV pool: its memory fraction, what that is a share of, and the runtime
    reserve it keeps beside weights and activations (CUDA context, CUDA-graph pool, sampler buffers)."""

    fraction: float = 0.9
    of: MemoryFraction = MemoryFraction.HBM
    runtime_reserve_bytes: float = 1.5e9

    def __post_init__(self) -> None:
        if not 0 < self.fraction <= 1:
            raise ValueError(f"the engine's memory fraction must be in (0, 1], got {self.fraction}")
        if self.runtime_reserve_bytes < 0:
            raise ValueError(f"runtime_reserve_bytes must be >= 0, got {self.runtime_reserve_bytes}")

    def headroom_bytes(self, *, hbm_bytes: float, weights_bytes: float, activations_bytes: float) -> float:
        """HBM the engine's fraction leaves unused (what is not weights, activations, reserve or KV cache)."""
        rest = 1.0 - self.fraction
        if self.of is MemoryFraction.HBM:
            return rest * hbm_bytes
        if self.of is MemoryFraction.FREE:
            return rest * max(hbm_bytes - weights_bytes - activations_bytes - self.runtime_reserve_bytes, 0.0)
        return max(rest * hbm_bytes - activations_bytes - self.runtime_reserve_bytes, 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingBill:
    """One GPU of a serving replica (the heaviest pipeline stage). The terms sum to the device's HBM:
    weights + activations + runtime reserve + engine headroom + KV budget = hbm (while the weights fit)."""

    weights_bytes: float
    kv_bytes_per_token: float
    """KV-cache bytes one token adds on this GPU, as if every layer kept every token."""
    kv_bytes_per_sequence: float
    """KV-cache bytes of one sequence of ``context`` tokens on this GPU (sliding windows capped)."""
    activations_bytes: float
    runtime_reserve_bytes: float
    """The engine's runtime beside weights and activations: CUDA context, CUDA-graph pool, sampler buffers."""
    headroom_bytes: float
    """What the engine's memory fraction leaves unused."""
    hbm_bytes: float
    context: int

    @property
    def usable_bytes(self) -> float:
        """HBM the engine takes: all but the headroom."""
        return self.hbm_bytes - self.headroom_bytes

    @property
    def kv_budget_bytes(self) -> float:
        held = self.weights_bytes + self.activations_bytes + self.runtime_reserve_bytes
        return max(self.usable_bytes - held, 0.0)

    @property
    def kv_capacity_tokens(self) -> int:
        return int(self.kv_budget_bytes // self.kv_bytes_per_token)

    @property
    def max_concurrent_sequences(self) -> int:
        return int(self.kv_budget_bytes // self.kv_bytes_per_sequence)

    @property
    def fits(self) -> bool:
        return self.max_concurrent_sequences >= 1


def kv_bytes_per_token_total(model: ModelSpec, *, kv_dtype: DType = DType.BF16) -> float:
    """KV-cache bytes one token costs the whole model (every layer, every KV head): a fleet-wide figure."""
    return model.num_layers * kv_bytes_per_token_per_layer(model, tp=1, kv_dtype=kv_dtype)


def kv_bytes_per_token_per_layer(model: ModelSpec, *, tp: int, kv_dtype: DType) -> float:
    """KV bytes one token adds to one layer on one TP rank (KV heads split over tp, copied past k ranks)."""
    if model.mla is not None:  # the latent is not split by TP: every rank caches it whole
        return (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim) * DTYPE_BYTES[kv_dtype]
    heads_per_rank = max(model.num_kv_heads / tp, 1.0)
    return 2 * heads_per_rank * model.head_dim * DTYPE_BYTES[kv_dtype]


def prefill_activation_bytes(model: ModelSpec, *, tp: int, chunk_tokens: int) -> float:
    """Largest live set of one layer while a prefill chunk passes (nothing is kept for backward).

    Residual and norm output (2h), Q/K/V and attention output split over tp,
    and three f-wide MLP tensors (gate, up, product) split over tp; for MoE
    layers the k routed copies of each token with the expert's width.
    """
    beta = 2.0
    attn = model.q_width + 2 * model.kv_width + model.attn_out_width
    if model.moe is not None:
        moe = model.moe
        mlp = moe.experts_per_token * (2 * model.hidden + 3 * moe.expert_ffn_hidden / tp)
        mlp = max(mlp, 3 * model.ffn_hidden / tp)
    else:
        mlp = 3 * model.ffn_hidden / tp
    return chunk_tokens * beta * (2 * model.hidden + attn / tp + mlp)


def serving_bill(
    model: ModelSpec,
    *,
    gpu: GPU,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    weight_dtype: DType = DType.BF16,
    kv_dtype: DType = DType.BF16,
    context: int | None = None,
    memory: EngineMemory | None = None,
    prefill_chunk_tokens: int = 8192,
    quant_group: int = QUANT_GROUP,
    replicated_weights_bytes: float = 0.0,
) -> ServingBill:
    """What one GPU of a TP x PP (x EP) serving replica holds, and how much KV cache is left.

    ``memory`` is the engine's sizing rule (default: vLLM's, 0.9 of HBM, the GPU kind's framework bytes as the
    runtime reserve); ``replicated_weights_bytes`` are weights held on top of the TP split (attention under
    attention-DP)."""
    for name, value in (("tp", tp), ("pp", pp), ("ep", ep), ("prefill_chunk_tokens", prefill_chunk_tokens)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if pp > model.num_layers:
        raise ValueError(f"pp={pp} exceeds num_layers={model.num_layers}")
    if ep > 1 and (model.moe is None or model.moe.num_experts % ep):
        raise ValueError(f"ep={ep} must divide the number of experts ({model.moe.num_experts if model.moe else 0})")
    memory = memory or EngineMemory(runtime_reserve_bytes=gpu.calibration.framework_bytes)
    context = context or model.max_seq_len or 8192
    per_param = weight_bytes_per_param(weight_dtype, hidden=model.hidden, group=quant_group)
    weights, layers_max = _heaviest_stage(model, tp=tp, pp=pp, ep=ep, per_param=per_param)
    weights += replicated_weights_bytes
    per_layer = kv_bytes_per_token_per_layer(model, tp=tp, kv_dtype=kv_dtype)
    sliding_share = model.sliding_share
    window = min(context, model.sliding_window) if model.sliding_window else context
    per_sequence = layers_max * per_layer * ((1 - sliding_share) * context + sliding_share * window)
    activations = prefill_activation_bytes(model, tp=tp, chunk_tokens=prefill_chunk_tokens)
    return ServingBill(
        weights_bytes=weights,
        kv_bytes_per_token=layers_max * per_layer,
        kv_bytes_per_sequence=per_sequence,
        activations_bytes=activations,
        runtime_reserve_bytes=memory.runtime_reserve_bytes,
        headroom_bytes=memory.headroom_bytes(
            hbm_bytes=gpu.hbm_bytes, weights_bytes=weights, activations_bytes=activations
        ),
        hbm_bytes=gpu.hbm_bytes,
        context=context,
    )


def _heaviest_stage(model: ModelSpec, *, tp: int, pp: int, ep: int, per_param: float) -> tuple[float, float]:
    """(weight bytes, layers) of the heaviest pipeline stage on one GPU: every stage is looked at, since
    uneven splits and dense-first MoE put the heaviest anywhere."""
    params = count_params(model)
    weights = layers_max = 0.0
    for stage in range(pp):
        on_stage = stage_params(params, model, tp=tp, pp=pp, ep=ep, stage=stage)
        held = float(on_stage.dense + on_stage.experts)
        plain = _stage_unquantized(params, model, tp=tp, pp=pp, stage=stage, held=on_stage)
        weights = max(weights, (held - plain) * per_param + plain * 2.0)
        layers_max = max(layers_max, float(on_stage.dense_layers + on_stage.moe_layers))
    return weights, layers_max


def min_gpus(total_bytes: float, hbm_bytes: float) -> int:
    """Fewest GPUs whose HBM holds ``total_bytes`` split evenly (nothing else counted)."""
    return max(1, math.ceil(total_bytes / hbm_bytes))


def serving_tp_ok(model: ModelSpec, tp: int) -> bool:
    """Whether serving engines split the attention over ``tp`` ranks: TP divides the heads, and one of TP and the
    KV heads divides the other (vLLM and SGLang refuse the rest; KV heads fewer than the ranks are copied)."""
    kv = model.num_kv_heads
    return tp >= 1 and model.num_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightSplit:
    """A serving split of the weights over tp x pp GPUs, and the weight bytes of its heaviest GPU."""

    tp: int
    pp: int
    weights_bytes: float

    @property
    def gpus(self) -> int:
        return self.tp * self.pp


def lightest_weight_split(model: ModelSpec, gpus: int, dtype: DType) -> WeightSplit | None:
    """Of the splits tp x pp dividing ``gpus`` that engines run (``serving_tp_ok``, no more stages than layers; the
    other GPUs hold replicas), the one whose heaviest GPU holds the fewest weight bytes, every stage looked at
    (uneven stages and the embedding count): for each TP, its longest pipeline. None when no split exists."""
    per_param = _matmul_bytes_per_param(model, dtype)
    best: WeightSplit | None = None
    for tp in (t for t in range(1, min(gpus, model.num_heads) + 1) if gpus % t == 0 and serving_tp_ok(model, t)):
        pp = max(p for p in range(1, min(gpus // tp, model.num_layers) + 1) if (gpus // tp) % p == 0)
        held, _ = _heaviest_stage(model, tp=tp, pp=pp, ep=1, per_param=per_param)
        if best is None or held < best.weights_bytes:
            best = WeightSplit(tp=tp, pp=pp, weights_bytes=held)
    return best


def fewest_weight_split(model: ModelSpec, dtype: DType, budget_bytes: float) -> WeightSplit | None:
    """The fewest GPUs whose lightest split (``lightest_weight_split``) holds the weights within ``budget_bytes``
    a GPU: from the even split's bound up, every count tried (so the split found spans them all: one over fewer
    would have been found first); None when no split of the model does."""
    most = max(t for t in range(1, model.num_heads + 1) if serving_tp_ok(model, t)) * model.num_layers
    for gpus in range(min_gpus(weights_bytes_total(model, dtype), budget_bytes), most + 1):
        split = lightest_weight_split(model, gpus, dtype)
        if split is not None and split.weights_bytes <= budget_bytes:
            return split
    return None
