"""What each term of a memory bill is, its formula and its source, for people and the explorer.

Symbols are those of docs/notation.md: P = parameters this GPU's stage holds
after TP/EP/PP splitting, D = ZeRO shard group (dp_shard * cp), s, b, h, a,
f, V, t = tp, c = cp, p = pp, m = micro-batches in flight.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.core.memory.bill import MemoryBill


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
        what="The parameters the forward and backward passes read, in the weight dtype (frozen under LoRA; "
        "NF4 for QLoRA's matmul weights).",
        formula="P * bytes(weights), divided by D under ZeRO-3 / FSDP; QLoRA: 4.127 bits per matmul weight",
        source="ZeRO (Rajbhandari et al. 2020) Sec. 3.1: 2 bytes per parameter in 16-bit",
    ),
    Term(
        name="adapter_weights_bytes",
        title="Adapter weights",
        what="The low-rank matrices LoRA trains beside the frozen base (B A, rank R), in the weight dtype.",
        formula="R (d_in + d_out) per adapted matrix, per layer; under TP a column-parallel matrix splits B, a "
        "row-parallel one A",
        source="Hu et al. 2021, LoRA (arXiv:2106.09685) Sec. 4.1",
    ),
    Term(
        name="gradients_bytes",
        title="Gradients",
        what="One gradient per trained parameter (the adapters under LoRA), accumulated over micro-batches.",
        formula="P_trained * bytes(grads), divided by D from ZeRO-2",
        source="ZeRO Sec. 3.1 (2 bytes in 16-bit); Megatron-LM keeps fp32 main_grad (4 bytes)",
    ),
    Term(
        name="master_weights_bytes",
        title="Master weights",
        what="The higher-precision copy of the parameters the optimizer updates under mixed precision, fp32 "
        "unless --master-dtype says otherwise (of the adapters under LoRA; none under QLoRA, whose bf16 adapters "
        "are updated in place).",
        formula="P_trained * bytes(master), divided by D from ZeRO-1",
        source="ZeRO Sec. 3.1 (part of K = 12); Micikevicius et al. 2018, mixed precision training",
    ),
    Term(
        name="optimizer_moments_bytes",
        title="Optimizer moments",
        what="Adam's first and second moments (one for SGD with momentum, factored for Adafactor).",
        formula="P_trained * moments * bytes(moment), divided by D from ZeRO-1",
        source="ZeRO Sec. 3.1: momentum 4 + variance 4 bytes in fp32; DeepSeek-V3 Sec. 3.3 keeps them in bf16",
    ),
    Term(
        name="activations_bytes",
        title="Activations",
        what="Tensors the forward pass keeps for backward, for every micro-batch in flight on this stage (a "
        "frozen matmul or norm keeps only what its input gradient needs; each LoRA adapter adds its R-wide A x).",
        formula="in-flight micro-batches x layers x per-layer bytes; a GPT layer with TP keeps "
        "sbh(10 + 24/t + 5as/ht), sbh(34/t) with SP and selective recompute, 2sbh with full recompute",
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
        name="dequant_workspace_bytes",
        title="Dequantization workspace",
        what="Under QLoRA, the bf16 copy of the one NF4 matrix being multiplied, rebuilt before every matmul.",
        formula="2 bytes x the largest matmul weight of a layer on this GPU",
        source="Dettmers et al. 2023, QLoRA (arXiv:2305.14314) Sec. 3 (storage in NF4, computation in bf16)",
    ),
    Term(
        name="comm_buffers_bytes",
        title="Gathered parameters",
        what="Under ZeRO-3 / FSDP: the current and the prefetched layer gathered whole, and one layer's "
        "unsharded gradients before their reduce-scatter.",
        formula="largest layer's P * (2 * bytes(gathered) + bytes(grads)) under ZeRO-3, else 0; bytes(gathered) = 2 "
        "(bf16), 1 with --fp8-all-gather",
        source="PyTorch FSDP (Zhao et al. 2023) Sec. 3.3, forward prefetch of the next unit; torchao float8 "
        "enable_fsdp_float8_all_gather (FP8 weights all-gathered and used as gathered)",
    ),
    Term(
        name="framework_bytes",
        title="Framework",
        what="CUDA context, cuBLAS/cuDNN workspaces and the first NCCL communicator: resident whatever the model.",
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
    Term(
        name="runtime_reserve_bytes",
        title="Runtime reserve",
        what="What the training stack's runtime keeps outside the caching allocator beyond the CUDA context: "
        "NCCL communicators and their buffers, CUDA graphs, userbuffers for TP overlap.",
        formula="a constant per stack (catalog/stacks runtime_reserve), or --runtime-reserve; 0 without a stack",
        source="stated assumption per stack; see docs/formulas.md",
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
