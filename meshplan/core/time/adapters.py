"""LoRA and QLoRA adapters in a layer's time: their passes at HBM speed, and QLoRA's dequantization of the
NF4 base before every use."""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.core.finetune import adapted_matrices, base_bytes_per_param
from meshplan.core.num import Num
from meshplan.core.time.flops import Gemm
from meshplan.spec.finetune import Finetune, FinetuneMode
from meshplan.spec.model import ModelSpec

ADAPTER_FORWARD = (1, 3, 2)
"""Elements per token and adapted matrix of an adapter's forward, as coefficients of (d_in, d_out, R): read x,
write and read A x, write B A x, and the sum with the base's output (read B A x, write the output)."""
ADAPTER_WEIGHT_GRAD = (1, 1, 2)
"""Its weight gradients: dB from the output gradient and A x (read d_out and R), dA from d(A x) and x (R, d_in)."""
ADAPTER_INPUT_GRAD = (4, 1, 2)
"""Its input gradient: d(A x) = dy B (read d_out, write R), dx = d(A x) A (read R, write d_in), and the sum with the
base's input gradient (read 2 d_in, write d_in)."""


def adapter_bytes_per_token(
    model: ModelSpec, finetune: Finetune, *, tp: Num, moe_layer: bool, coefficients: tuple[int, int, int]
) -> Num:
    """Elements one token's adapters move in one pass (routed experts: the k experts it visits)."""
    a, b, c = coefficients
    total: Num = 0.0
    for m in adapted_matrices(model, moe_layer=moe_layer, targets=finetune.lora_targets):
        copies = model.moe.experts_per_token if m.routed and model.moe else m.count
        d_in, d_out = (m.d_in, m.d_out / tp) if m.column_parallel else (m.d_in / tp, m.d_out)
        total = total + copies * (a * d_in + b * d_out + c * finetune.lora_rank)
    return total


@dataclass(frozen=True, slots=True, kw_only=True)
class AdapterTime:
    """An adapted layer's adapters, memory bound, and QLoRA's dequantization per use of the base."""

    forward_s: Num
    weight_grad_s: Num
    input_grad_s: Num
    dequant_s: Num


def adapter_time(
    model: ModelSpec,
    finetune: Finetune,
    gemms: list[Gemm],
    *,
    tokens: Num,
    tp: Num,
    moe_layer: bool,
    act_bytes: float,
    hbm: Num,
) -> AdapterTime:
    """An adapted layer's adapter passes, each the elements it reads and writes at HBM speed (``ADAPTER_FORWARD``,
    ``ADAPTER_WEIGHT_GRAD``, ``ADAPTER_INPUT_GRAD``). QLoRA dequantizes each NF4 matrix to bf16 before every use:
    4.127 bits read, 16 written and read again; a GPTQ int4 base the same with its own bits (4.156 at groups of
    128): AutoGPTQ's kernels rebuild the fp16 matrix for inputs of more than a few rows (exllama's
    reconstruction) before a dense matmul, the same traffic."""

    def over(coefficients: tuple[int, int, int]) -> Num:
        elements = adapter_bytes_per_token(model, finetune, tp=tp, moe_layer=moe_layer, coefficients=coefficients)
        return tokens * act_bytes * elements / hbm

    dequant: Num = 0.0
    if finetune.mode is FinetuneMode.QLORA:
        weights = sum(g.n * g.k * g.count for g in gemms)
        dequant = weights * (base_bytes_per_param(finetune) + 4.0) / hbm
    return AdapterTime(
        forward_s=over(ADAPTER_FORWARD),
        weight_grad_s=over(ADAPTER_WEIGHT_GRAD),
        input_grad_s=over(ADAPTER_INPUT_GRAD),
        dequant_s=dequant,
    )
