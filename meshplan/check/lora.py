"""LoRA on the tiny Llama, measured in one process and held against meshplan's fine-tuning bill.

The adapters are plain torch modules (frozen nn.Linear + A (r x d_in) + B (d_out x r), B zero-initialized,
output base(x) + B(A(x)) * alpha / r), the way peft's LoraLayer computes them; peft itself is not needed.
Measured per step: trainable parameters, AdamW state bytes, and the bytes autograd saves for backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from meshplan.check.cases import Shape, model_spec
from meshplan.check.measure import SavedTensorTracker, state_bytes
from meshplan.check.model import TinyConfig, TinyLlama, cross_entropy
from meshplan.core.memory.bill import stage_bill
from meshplan.core.params import count_params
from meshplan.spec.cluster import GpuCalibration
from meshplan.spec.finetune import Finetune, FinetuneMode
from meshplan.spec.layout import Layout
from meshplan.spec.workload import PRECISIONS, Framework, Kernels, Workload

# the tiny model's module names for each LoRA target
TARGET_MODULES = {
    "q": "attention.wq",
    "k": "attention.wk",
    "v": "attention.wv",
    "o": "attention.wo",
    "gate": "feed_forward.w1",
    "up": "feed_forward.w3",
    "down": "feed_forward.w2",
}


class LoRALinear(nn.Module):
    """A frozen linear layer with a trainable low-rank update beside it."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float = 16.0) -> None:
        super().__init__()
        self.base = base
        self.base.weight.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.scaling = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.base(x) + F.linear(F.linear(x, self.lora_a), self.lora_b) * self.scaling
        return out


def apply_lora(model: TinyLlama, *, rank: int, targets: tuple[str, ...]) -> None:
    """Freeze every parameter, then put an adapter beside each target projection of every block."""
    for p in model.parameters():
        p.requires_grad_(False)
    for block in model.layers.values():
        for target in targets:
            parent_name, child = TARGET_MODULES[target].split(".")
            parent = getattr(block, parent_name)
            base = getattr(parent, child)
            if not isinstance(base, nn.Linear):  # the tiny MoE keeps its experts as (E, ...) tensors
                raise ValueError(f"LoRA target {target!r} is not a linear layer in this model")
            setattr(parent, child, LoRALinear(base, rank))


@dataclass(frozen=True, slots=True, kw_only=True)
class LoRAMeasurement:
    """Measured (or predicted) quantities of one LoRA step of the tiny model."""

    trainable_params: float
    optimizer_bytes: float
    """AdamW's two moments and its 0-dim step, per adapter tensor."""
    activation_bytes: float
    """Everything autograd saves for backward that the forward allocated (loss log-probabilities included)."""


def measure(cfg: TinyConfig, *, rank: int, targets: tuple[str, ...], seed: int = 0) -> LoRAMeasurement:
    """One AdamW step of the tiny model with LoRA adapters; fp32, eager kernels, one process."""
    torch.manual_seed(seed)
    model = TinyLlama(cfg)
    apply_lora(model, rank=rank, targets=targets)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3, foreach=False)
    tokens = torch.randint(0, cfg.vocab_size, (cfg.micro_batch, cfg.seq_len))
    targets_ids = torch.randint(0, cfg.vocab_size, (cfg.micro_batch, cfg.seq_len))
    tracker = SavedTensorTracker(module=model, inputs=(tokens, targets_ids))
    with tracker.track():
        loss = cross_entropy(model(tokens), targets_ids)
    loss.backward()  # type: ignore[no-untyped-call]
    optimizer.step()
    state: dict[str, Any] = state_bytes(model, optimizer)
    return LoRAMeasurement(
        trainable_params=sum(p.numel() for p in trainable),
        optimizer_bytes=int(state["optimizer_bytes"]),
        activation_bytes=int(tracker.saved_bytes["activation"]),
    )


def predict(cfg: TinyConfig, *, rank: int, targets: tuple[str, ...]) -> LoRAMeasurement:
    """The same quantities from meshplan's bill: fp32, eager kernels, PyTorch-native saves, one GPU."""
    model = model_spec(Shape.of(cfg), moe=cfg.num_experts > 0)
    work = Workload(
        seq_len=cfg.seq_len,
        global_batch=cfg.micro_batch,
        precision=PRECISIONS["fp32"],
        kernels=Kernels.EAGER,
        framework=Framework.TORCH,
        finetune=Finetune(mode=FinetuneMode.LORA, lora_rank=rank, lora_targets=targets),
    )
    bill = stage_bill(
        model,
        count_params(model),
        Layout(micro_batch=cfg.micro_batch),
        work,
        calibration=GpuCalibration(framework_bytes=0.0, fragmentation=0.0),
        stage=0,
    )
    return LoRAMeasurement(
        trainable_params=float(bill.adapter_weights_bytes) / work.precision.weight_bytes,
        optimizer_bytes=float(bill.optimizer_bytes),
        activation_bytes=float(bill.activations_bytes + bill.logits_bytes),
    )
