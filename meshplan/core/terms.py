"""What each term of a memory bill is, its formula and its source, for people and the explorer.

Symbols are those of docs/notation.md: P = parameters this GPU's stage holds
after TP/EP/PP splitting, D = ZeRO shard group (dp_shard * cp), s, b, h, a,
f, V, t = tp, c = cp, p = pp, m = micro-batches in flight.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.core.memory import MemoryBill


@dataclass(frozen=True, slots=True, kw_only=True)
class Term:
    """The explanation of one bill term."""

    name: str
    title: str
    what: str
    formula: str
    source: str


TRAINING_TERMS: tuple[Term, ...] = (
    Term(
        name="weights_bytes",
        title="Weights",
        what="The parameters the forward and backward passes read, in the weight dtype.",
        formula="P * bytes(weights), divided by D under ZeRO-3 / FSDP",
        source="ZeRO (Rajbhandari et al. 2020) Sec. 3.1: 2 bytes per parameter in 16-bit",
    ),
    Term(
        name="gradients_bytes",
        title="Gradients",
        what="One gradient per parameter, accumulated over micro-batches (fp32 when accumulation is fp32).",
        formula="P * bytes(grads), divided by D from ZeRO-2",
        source="ZeRO Sec. 3.1 (2 bytes in 16-bit); Megatron-LM keeps fp32 main_grad (4 bytes)",
    ),
    Term(
        name="master_weights_bytes",
        title="Master weights",
        what="The fp32 copy of the parameters the optimizer updates under mixed precision.",
        formula="P * 4, divided by D from ZeRO-1",
        source="ZeRO Sec. 3.1 (part of K = 12); Micikevicius et al. 2018, mixed precision training",
    ),
    Term(
        name="optimizer_moments_bytes",
        title="Optimizer moments",
        what="Adam's first and second moments (one for SGD with momentum, factored for Adafactor).",
        formula="P * moments * bytes(moment), divided by D from ZeRO-1",
        source="ZeRO Sec. 3.1: momentum 4 + variance 4 bytes in fp32; DeepSeek-V3 Sec. 3.3 keeps them in bf16",
    ),
    Term(
        name="activations_bytes",
        title="Activations",
        what="Tensors the forward pass keeps for backward, for every micro-batch in flight on this stage.",
        formula="m * layers * s/c * b * (per-token bytes: sbh(10 + 24/t + 5as/(ht)) for a GPT layer with TP, "
        "sbh(34/t) with SP and selective recompute, 2sbh with full recompute)",
        source="Korthikanti et al. 2022, Table 2 and Eq. 5-6, extended to GQA, gated MLPs, flash attention, CP, MoE",
    ),
    Term(
        name="logits_bytes",
        title="Logits",
        what="The fp32 log-probabilities over the vocabulary that the loss keeps (last pipeline stage).",
        formula="4 * s/c * b * V / t",
        source="Korthikanti et al. 2022 Sec. 4.3 (4sbv/t)",
    ),
    Term(
        name="activation_workspace_bytes",
        title="Recompute workspace",
        what="Activations rebuilt while one layer is recomputed in backward (one layer, one micro-batch).",
        formula="full: one layer's activations without recompute; selective: one layer's attention scores",
        source="Chen et al. 2016 (gradient checkpointing); Korthikanti et al. 2022 Sec. 5",
    ),
    Term(
        name="comm_buffers_bytes",
        title="Gathered parameters",
        what="Under ZeRO-3 / FSDP: the current and the prefetched layer gathered whole, and one layer's "
        "unsharded gradients before their reduce-scatter.",
        formula="largest layer's P * (2 * 2 bytes + bytes(grads)) under ZeRO-3, else 0",
        source="PyTorch FSDP (Zhao et al. 2023) Sec. 3.3, forward prefetch of the next unit",
    ),
    Term(
        name="framework_bytes",
        title="Framework",
        what="CUDA context, cuBLAS/cuDNN workspaces and NCCL buffers: resident whatever the model.",
        formula="a constant per GPU kind (catalog calibration.framework_bytes)",
        source="stated assumption per GPU kind; see docs/formulas.md",
    ),
    Term(
        name="fragmentation_bytes",
        title="Fragmentation",
        what="Memory the caching allocator holds but cannot hand out, as a share of what is allocated per step.",
        formula="fragmentation * (activations + logits + workspace + gathered parameters)",
        source="stated assumption per GPU kind (default 5%); see docs/formulas.md",
    ),
)

assert tuple(t.name for t in TRAINING_TERMS) == tuple(name for name in MemoryBill.__dataclass_fields__), (
    "every bill term needs exactly one explanation"
)


def explain(bill: MemoryBill) -> list[dict[str, object]]:
    """Each term's explanation with its value, in bill order."""
    return [
        {
            "name": t.name,
            "title": t.title,
            "what": t.what,
            "formula": t.formula,
            "source": t.source,
            "value_bytes": float(getattr(bill, t.name)),
        }
        for t in TRAINING_TERMS
    ]
