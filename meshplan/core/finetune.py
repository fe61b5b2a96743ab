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

from meshplan.core.num import Num
from meshplan.core.params import count_params
from meshplan.spec.finetune import Finetune, FinetuneMode
from meshplan.spec.model import MlpKind, ModelSpec

NF4_BLOCK = 64
NF4_SCALE_BLOCK = 256


def nf4_bytes_per_param(*, double_quant: bool) -> float:
    """Bytes of one NF4 weight with its share of the block scales."""
    scales_bits = 8 / NF4_BLOCK + 32 / (NF4_BLOCK * NF4_SCALE_BLOCK) if double_quant else 32 / NF4_BLOCK
    return (4 + scales_bits) / 8


@dataclass(frozen=True, slots=True, kw_only=True)
class Adapted:
    """One projection an adapter sits beside: (d_in, d_out), how many of it a layer has, and its TP split."""

    target: str
    d_in: int
    d_out: int
    count: int
    column_parallel: bool
    """Column-parallel matrices split d_out over TP (q, k, v, gate, up); row-parallel split d_in (o, down)."""


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
    mlps: list[tuple[int, int]] = []  # (ffn width, how many such MLPs)
    if moe_layer and model.moe is not None:
        mlps.append((model.moe.expert_ffn_hidden, model.moe.num_experts))
        if model.moe.num_shared_experts:
            mlps.append((model.moe.shared_hidden, model.moe.num_shared_experts))
    else:
        mlps.append((model.ffn_hidden, 1))
    for f, n in mlps:
        shapes = {"gate": (h, f, True), "up": (h, f, True), "down": (f, h, False)}
        if model.mlp is MlpKind.PLAIN:
            shapes.pop("gate")
        for target, (i, o, c) in shapes.items():
            if target in targets:
                out.append(Adapted(target=target, d_in=i, d_out=o, count=n, column_parallel=c))
    return out


def adapter_params(model: ModelSpec, finetune: Finetune, *, moe_layer: bool, tp: Num = 1) -> Num:
    """Adapter parameters of one layer on one TP rank (the whole layer when tp = 1)."""
    r = finetune.lora_rank
    total: Num = 0
    for m in adapted_matrices(model, moe_layer=moe_layer, targets=finetune.lora_targets):
        whole, split = (m.d_in, m.d_out) if m.column_parallel else (m.d_out, m.d_in)
        total = total + m.count * r * (whole + split / tp)
    return total


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
        adapters = int(
            p.num_dense_layers * adapter_params(model, finetune, moe_layer=False)
            + p.num_moe_layers * adapter_params(model, finetune, moe_layer=True)
        )
        return Trainable(trainable=adapters, frozen=p.total, adapters=adapters)
    frozen = p.embedding if finetune.freeze_embeddings else 0
    layers = [p.dense_layer.total] * p.num_dense_layers + [p.moe_layer.total] * p.num_moe_layers
    frozen += sum(layers[: finetune.freeze_layers])
    return Trainable(trainable=p.total - frozen, frozen=frozen, adapters=0)


def quantized_base(finetune: Finetune) -> bool:
    return finetune.mode is FinetuneMode.QLORA
