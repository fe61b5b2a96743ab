"""Fine-tuning counts: adapter parameters, what trains, and the bytes of a 4-bit frozen base.

LoRA (Hu et al. 2021) adds B A beside a frozen W (d_out x d_in): A is r x d_in, B is d_out x r, so
r (d_in + d_out) parameters per adapted matrix; K and V are k d wide under GQA. Under tensor parallelism
(Megatron's LoRA layers) a column-parallel W keeps A whole and splits B, a row-parallel W splits A and keeps
B whole. QLoRA (Dettmers et al. 2023) stores the frozen matmul weights in NF4: 4 bits each, plus an absmax per
block of 64 weights, itself quantized to 8 bits with an fp32 scale per 256 blocks (double quantization):
4 + 8/64 + 32/(64 * 256) = 4.127 bits per weight; without double quantization 4 + 32/64 = 4.5 bits.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.core.num import Num, maximum, minimum
from meshplan.core.params import count_params
from meshplan.spec.finetune import Finetune, FinetuneMode, QuantBase
from meshplan.spec.model import MlpKind, ModelSpec

NF4_BLOCK = 64
"""Weights per absmax scale of NF4 (QLoRA, Dettmers et al. 2023, Sec. 3: blocksize 64 for W)."""
NF4_SCALE_BLOCK = 256
"""Scales per fp32 scale of double quantization (QLoRA Sec. 3: blocksize 256 for the 8-bit scales)."""


def nf4_bytes_per_param(*, double_quant: bool) -> float:
    """Bytes of one NF4 weight with its share of the block scales."""
    scales_bits = 8 / NF4_BLOCK + 32 / (NF4_BLOCK * NF4_SCALE_BLOCK) if double_quant else 32 / NF4_BLOCK
    return (4 + scales_bits) / 8


GPTQ_SCALE_BITS = 16
"""GPTQ's per-group scale: fp16 (AutoGPTQ's QuantLinear ``scales``, float16, [in / group, out])."""
GPTQ_ZERO_BITS = 4
"""Its per-group zero point, packed eight to an int32 like the weights (``qzeros``, [in / group, out / 8])."""


def gptq_bytes_per_param(*, group_size: int) -> float:
    """Bytes of one GPTQ int4 weight with its share of the group's fp16 scale and 4-bit zero: (4 + 20 / g) / 8,
    0.5195 at g = 128. The int32 ``g_idx`` per input row (4 / d_out bytes a weight) is left out."""
    return (4 + (GPTQ_SCALE_BITS + GPTQ_ZERO_BITS) / group_size) / 8


def base_bytes_per_param(finetune: Finetune) -> float:
    """Bytes of one quantized base weight under QLoRA, as its format stores it."""
    if finetune.base_quant is QuantBase.GPTQ_INT4:
        return gptq_bytes_per_param(group_size=finetune.quant_group_size)
    return nf4_bytes_per_param(double_quant=finetune.double_quant)


@dataclass(frozen=True, slots=True, kw_only=True)
class Adapted:
    """One projection an adapter sits beside: (d_in, d_out), how many of it a layer has, and its TP split."""

    target: str
    d_in: int
    d_out: int
    count: int
    column_parallel: bool
    """Column-parallel matrices split d_out over TP (q, k, v, gate, up); row-parallel split d_in (o, down)."""
    routed: bool = False
    """A routed expert's matrix: split over EP, and a token meets only k of the count."""


def adapted_matrices(model: ModelSpec, *, moe_layer: bool, targets: tuple[str, ...]) -> list[Adapted]:
    """The matrices of one layer an adapter sits beside."""
    h = model.hidden
    out: list[Adapted] = []
    if model.mla is not None:
        mla, a = model.mla, model.num_heads
        q_in = mla.q_lora_rank or h
        attn = {
            "q": [(q_in, a * mla.qk_head_dim, True)] + ([(h, mla.q_lora_rank, True)] if mla.q_lora_rank else []),
            "k": [(h, mla.kv_lora_rank + mla.qk_rope_head_dim, True)],
            "v": [(mla.kv_lora_rank, a * (mla.qk_nope_head_dim + mla.v_head_dim), True)],
            "o": [(a * mla.v_head_dim, h, False)],
        }
    else:
        attn = {
            "q": [(h, model.q_width, True)],
            "k": [(h, model.kv_width, True)],
            "v": [(h, model.kv_width, True)],
            "o": [(model.attn_out_width, h, False)],
        }
    for target in ("q", "k", "v", "o"):
        if target in targets:
            out += [Adapted(target=target, d_in=i, d_out=o, count=1, column_parallel=c) for i, o, c in attn[target]]
    mlps: list[tuple[int, int, bool]] = []  # (ffn width, how many such MLPs, routed)
    if moe_layer and model.moe is not None:
        mlps.append((model.moe.expert_ffn_hidden, model.moe.num_experts, True))
        if model.moe.num_shared_experts:
            mlps.append((model.moe.shared_hidden, model.moe.num_shared_experts, False))
    else:
        mlps.append((model.ffn_hidden, 1, False))
    for f, n, routed in mlps:
        shapes = {"gate": (h, f, True), "up": (h, f, True), "down": (f, h, False)}
        if model.mlp is MlpKind.PLAIN:
            shapes.pop("gate")
        for target, (i, o, c) in shapes.items():
            if target in targets:
                out.append(Adapted(target=target, d_in=i, d_out=o, count=n, column_parallel=c, routed=routed))
    return out


def matrix_adapter_params(m: Adapted, *, rank: int, tp: Num = 1) -> Num:
    """Adapter parameters beside one adapted matrix on one TP rank: r (d_in + d_out) whole, the side its base
    matrix splits over TP divided by tp (A of a row-parallel W, B of a column-parallel one); one copy of the
    matrix (a layer holds ``m.count``, experts divide further over EP)."""
    whole, split = (m.d_in, m.d_out) if m.column_parallel else (m.d_out, m.d_in)
    return rank * (whole + split / tp)


def validate_finetune(model: ModelSpec, finetune: Finetune) -> None:
    """Reject a rank at least as large as an adapted matrix's smaller side (it would not be low-rank)."""
    if not finetune.adapted:
        if finetune.freeze_layers > model.num_layers:
            raise ValueError(f"freeze_layers={finetune.freeze_layers} exceeds num_layers={model.num_layers}")
        return
    for moe_layer in (False, True):
        for m in adapted_matrices(model, moe_layer=moe_layer, targets=finetune.lora_targets):
            if finetune.lora_rank >= min(m.d_in, m.d_out):
                raise ValueError(
                    f"lora_rank={finetune.lora_rank} is not below the {m.target} projection's smaller side "
                    f"min({m.d_in}, {m.d_out}) = {min(m.d_in, m.d_out)}"
                )


@dataclass(frozen=True, slots=True, kw_only=True)
class Trainable:
    """Parameters that receive gradients and optimizer state, and those kept frozen."""

    trainable: int
    frozen: int
    adapters: int


def trainable_params(model: ModelSpec, finetune: Finetune) -> Trainable:
    """What trains in ``finetune`` mode, over the whole model."""
    p = count_params(model)
    if finetune.adapted:
        dense, moe = (sum(adapter_split(model, finetune, moe_layer=m, tp=1, ep=1)) for m in (False, True))
        adapters = int(p.num_dense_layers * dense + p.num_moe_layers * moe)
        edges = p.embedding if finetune.train_embeddings else 0
        return Trainable(trainable=adapters + edges, frozen=p.total - edges, adapters=adapters)
    frozen = p.embedding if finetune.freeze_embeddings else 0
    layers = [p.dense_layer.total] * p.num_dense_layers + [p.moe_layer.total] * p.num_moe_layers
    frozen += sum(layers[: finetune.freeze_layers])
    return Trainable(trainable=p.total - frozen, frozen=frozen, adapters=0)


def quantized_base(finetune: Finetune) -> bool:
    return finetune.mode is FinetuneMode.QLORA


# --- per GPU of a pipeline stage (these broadcast over arrays of layouts) ---------------------------------------


def adapter_split(model: ModelSpec, finetune: Finetune, *, moe_layer: bool, tp: Num, ep: Num) -> tuple[Num, Num]:
    """(non-expert, expert) adapter parameters of one layer on one TP x EP rank (tp = ep = 1: the whole layer)."""
    dense: Num = 0
    experts: Num = 0
    for m in adapted_matrices(model, moe_layer=moe_layer, targets=finetune.lora_targets):
        per_matrix = matrix_adapter_params(m, rank=finetune.lora_rank, tp=tp)
        if m.routed:
            experts = experts + m.count * per_matrix / ep
        else:
            dense = dense + m.count * per_matrix
    return dense, experts


def adapter_tensors(model: ModelSpec, finetune: Finetune, *, moe_layer: bool, ep: Num) -> Num:
    """Adapter tensors (A and B of every adapted matrix) of one layer on one EP rank."""
    total: Num = 0
    for m in adapted_matrices(model, moe_layer=moe_layer, targets=finetune.lora_targets):
        total = total + 2 * m.count / (ep if m.routed else 1)
    return total


def largest_matrix(model: ModelSpec, *, tp: Num) -> Num:
    """Parameters of the biggest single matmul weight of a layer on one TP rank (what QLoRA dequantizes at once)."""
    h = model.hidden
    widest = max(model.ffn_hidden, model.moe.expert_ffn_hidden if model.moe else 0, model.q_width)
    return h * widest / tp


def saved_input_savings(model: ModelSpec, finetune: Finetune, *, moe_layer: bool) -> tuple[float, float, float]:
    """Inputs a frozen base no longer keeps, per token, in units of (QKV input h, MLP input h, down input f).

    A frozen matmul needs no weight gradient, so autograd keeps its input only where an adapter beside it
    needs it: the QKV input when none of q, k, v is adapted, the MLP input (and in a MoE layer the frozen
    router's input and each expert's copy of it) when neither gate nor up is, the down projection's input
    when down is not (1 = dropped, 0 = kept).
    """
    if not finetune.adapted:
        return 0.0, 0.0, 0.0
    t = set(finetune.lora_targets)
    qkv = 0.0 if t & {"q", "k", "v"} else 1.0
    mlp_in = 0.0 if t & {"gate", "up"} else 1.0
    down = 0.0 if "down" in t else 1.0
    return qkv, mlp_in, down


def adapter_saved_per_token(model: ModelSpec, finetune: Finetune, *, moe_layer: bool, act_bytes: float) -> float:
    """The r-wide A x each adapter keeps for B's gradient, per token (routed experts: per routed copy)."""
    if not finetune.adapted:
        return 0.0
    total = 0.0
    for m in adapted_matrices(model, moe_layer=moe_layer, targets=finetune.lora_targets):
        copies = model.moe.experts_per_token if m.routed and model.moe else m.count  # a token meets k of E experts
        total += copies * act_bytes * finetune.lora_rank
    return total


def quantizable_params(model: ModelSpec, *, dense: Num, experts: Num, layers: Num, edges: Num) -> Num:
    """Matmul weights among ``dense + experts`` stage parameters: all but the layers' norms and routers and the
    ``edges`` (embedding, output head and final norm where the stage holds them)."""
    norms_router = 2 * model.norm_params + (model.hidden * model.moe.num_experts if model.moe else 0)
    return maximum(dense + experts - layers * norms_router - edges, 0.0)


def frozen_leading_layers(finetune: Finetune, *, first: Num, layers: Num) -> Num:
    """Layers of a stage (starting at layer ``first``) inside the frozen prefix of full fine-tuning."""
    return minimum(maximum(finetune.freeze_layers - first, 0), layers)
