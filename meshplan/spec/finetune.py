"""Fine-tuning: which parameters train, and in what form the frozen ones are kept."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class FinetuneMode(StrEnum):
    """How a model is trained."""

    FULL = "full"
    """Every parameter trains (minus any frozen parts): the pre-training bill."""
    LORA = "lora"
    """The base is frozen in its dtype; low-rank adapters B A (rank r) train beside the chosen matrices."""
    QLORA = "qlora"
    """As LoRA, with the frozen matmul weights stored in 4-bit NormalFloat with double-quantized block scales."""


class QuantBase(StrEnum):
    """How QLoRA's frozen matmul weights are stored."""

    NF4 = "nf4"
    """bitsandbytes' 4-bit NormalFloat, an absmax per block of 64, double-quantized (Dettmers et al. 2023)."""
    GPTQ_INT4 = "gptq-int4"
    """GPTQ's int4 (Frantar et al. 2022, as AutoGPTQ packs it): 4 bits a weight, an fp16 scale and a 4-bit zero
    per group of ``quant_group_size`` input rows of each output column."""


LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
"""Projections an adapter can sit beside: attention q, k, v, o and MLP gate, up, down (experts included)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Finetune:
    """What trains: the mode, the adapters' rank and targets, and frozen parts."""

    mode: FinetuneMode = FinetuneMode.FULL
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = LORA_TARGETS
    freeze_embeddings: bool = False
    """Keep the token embedding (and the untied output head) fixed in full fine-tuning."""
    freeze_layers: int = 0
    """Keep the first N transformer layers fixed in full fine-tuning."""
    train_embeddings: bool = False
    """LoRA / QLoRA: the token embedding and the output head train in full beside the adapters (PEFT's
    ``modules_to_save = ["embed_tokens", "lm_head"]``, trained in place, as when new tokens are added)."""
    double_quant: bool = True
    """QLoRA's second quantization of the block scales (8-bit scales with an fp32 scale per 256 blocks)."""
    base_quant: QuantBase = QuantBase.NF4
    """QLoRA: how the frozen base is stored."""
    quant_group_size: int = 128
    """GPTQ int4: weights per scale and zero (AutoGPTQ's group_size, 128 in most published checkpoints)."""

    def __post_init__(self) -> None:
        if not isinstance(self.lora_rank, int) or self.lora_rank < 1:
            raise ValueError(f"lora_rank must be a positive integer, got {self.lora_rank!r}")
        unknown = [t for t in self.lora_targets if t not in LORA_TARGETS]
        if unknown:
            raise ValueError(f"unknown LoRA target {unknown[0]!r} (targets: {', '.join(LORA_TARGETS)})")
        if self.adapted and not self.lora_targets:
            raise ValueError("LoRA needs at least one target projection")
        if self.freeze_layers < 0:
            raise ValueError(f"freeze_layers must be >= 0, got {self.freeze_layers}")
        if self.train_embeddings and not self.adapted:
            raise ValueError("--lora-train-embeddings applies to the lora and qlora modes (full training trains them)")
        if self.base_quant is not QuantBase.NF4 and self.mode is not FinetuneMode.QLORA:
            raise ValueError(f"--qlora-base {self.base_quant.value} applies to --finetune qlora only")
        if not isinstance(self.quant_group_size, int) or self.quant_group_size < 1:
            raise ValueError(f"quant_group_size must be a positive integer, got {self.quant_group_size!r}")
        if self.adapted and (self.freeze_layers or self.freeze_embeddings):
            raise ValueError(f"{self.mode.value} already freezes the whole base; --freeze applies to full fine-tuning")

    @property
    def adapted(self) -> bool:
        """LoRA or QLoRA: only adapters train."""
        return self.mode is not FinetuneMode.FULL
