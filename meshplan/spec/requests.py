"""Every input a user can state, declared once: its type, default, bounds, unit and help.

The CLI's flags, the HTTP API's query parameters, the ``key=value`` layouts of
``plan --compare`` and the keys of the catalog's run and recipe files are all
made from (or checked against) this table, so a field means the same thing
wherever it is given. Values are parsed here with one-line errors that name
the field; resolving them into specs (degrees, enums) happens in
``reports.inputs``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

MAX_GPUS = 10_000_000
"""The largest fleet meshplan plans for, everywhere: about 100 times the largest cluster built (2026)."""
MAX_DEGREE = 131_072
MAX_SEQ = 1 << 20
"""Longest training sequence (1M tokens, the longest published context-parallel runs)."""
MAX_CONTEXT = 1 << 24
"""Longest served context (16M tokens; Llama 4 Scout serves 10M)."""
MAX_BATCH = 1 << 24
MAX_MICRO_BATCH = 4096
MAX_TOKENS = 1e16
MAX_DAYS = 3650.0
MAX_TOP = 50

_BINARY = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DECIMAL = {"k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9, "t": 1e12}


class Group(StrEnum):
    """Where a field belongs: what it describes."""

    FLEET = "fleet"
    """Which GPUs and how many."""
    FLEET_SHAPE = "fleet shape"
    """How the fleet is wired: scale-up domain, scale-out link, mesh axis order."""
    LAYOUT = "layout"
    """How the model is split and scheduled."""
    WORKLOAD = "workload"
    """What one step computes: sequence, batch, precision, optimizer, kernels."""
    FINETUNE = "fine-tuning"
    """What trains."""
    CONDITIONS = "conditions"
    """How the run was set up: its training stack and the conditions the stack sets (each overridable)."""
    SEARCH = "search"
    """What the planner searches for and how it ranks."""
    SERVING = "serving"
    """How a served model is stored and how much of HBM the engine may take."""
    SERVE = "serving load"
    """Requests, load, engine and latency targets of ``serve`` and ``serve-plan``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Field:
    """One input: its name is the Python keyword, the JSON key, the query parameter and (dashed) the flag."""

    name: str
    type: type
    """int, float, bool or str."""
    default: Any
    help: str
    group: Group
    unit: str = ""
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    suffixes: bool = False
    """Accept k/M/G/T multipliers: binary (8k = 8192) for integers, decimal (15T = 15e12) for floats."""
    exclusive_lo: bool = False
    """The lower bound itself is refused (a share above 0, a positive float)."""
    alias: str = ""
    """The flag and query name where the field's own would collide: serving's objective is ``--objective``."""

    @property
    def key(self) -> str:
        """The name users type: the query parameter, and (dashed) the flag."""
        return self.alias or self.name

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    def describe(self, default: Any = None) -> str:
        """The help line with its unit, range and default, as the CLI and the OpenAPI show it."""
        default = self.default if default is None else default
        parts = [self.help]
        if self.unit:
            parts.append(f"[{self.unit}]")
        if self.suffixes:
            parts.append("(8k = 8192, 1M = 1048576)" if self.type is int else "(15T = 15e12, 2.5M = 2.5e6)")
        if default is not None and self.type is not bool:
            parts.append(f"(default: {default})")
        return " ".join(parts)

    def parse(self, text: str | int | float | bool) -> Any:
        """A value from text (a flag, a query string, a compare item) or from a TOML/JSON value."""
        if self.type is bool:
            return _boolean(self, text)
        if self.type is str:
            return self._choice(str(text))
        number = _number(self, text)
        self.check(number)
        return number

    def parse_number(self, text: str) -> int | float:
        """A number from text, size suffixes included, before its bounds are checked."""
        return _number(self, text)

    def check(self, value: Any) -> None:
        """Raise ValueError naming the field when ``value`` is outside its bounds or choices."""
        if value is None:
            return
        if self.choices and value not in self.choices:
            raise ValueError(f"{self.flag}: {value!r} is not one of {', '.join(self.choices)}")
        if self.type in (int, float):
            if not math.isfinite(value):
                raise ValueError(f"{self.flag}: expected a finite number, got {value}")
            low_bad = self.lo is not None and (value <= self.lo if self.exclusive_lo else value < self.lo)
            if low_bad or (self.hi is not None and value > self.hi):
                raise ValueError(f"{self.flag}: {value:g} is outside {self.range_text()}")

    def range_text(self) -> str:
        left = "(" if self.exclusive_lo else "["
        return f"{left}{self.lo:g}, {self.hi:g}]"

    def _choice(self, text: str) -> str:
        value = text.strip().lower()
        if not self.choices or value in self.choices:
            return value if self.choices else text.strip()
        import difflib

        close = difflib.get_close_matches(value, self.choices, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ValueError(f"{self.flag}: {text.strip()[:80]!r} is not one of {', '.join(self.choices)}{hint}")


def _boolean(f: Field, text: str | int | float | bool) -> bool:
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{f.flag}: expected true or false, got {str(text)[:80]!r}")


def _number(f: Field, text: str | int | float | bool) -> int | float:
    if isinstance(text, bool):
        raise ValueError(f"{f.flag}: expected a number, got {text}")
    raw = text if isinstance(text, int | float) else _number_text(f, text)
    if f.type is int:
        if isinstance(raw, float) and not raw.is_integer():
            raise ValueError(f"{f.flag}: expected an integer, got {text}")
        return int(raw)
    return float(raw)


def _number_text(f: Field, text: str) -> int | float:
    value = text.strip().lower().replace("_", "")
    scale: float = 1
    table = _BINARY if f.type is int else _DECIMAL
    if f.suffixes and value and value[-1] in table:
        value, scale = value[:-1], table[value[-1]]
    what = "an integer" if f.type is int else "a number"
    try:
        number = int(value) if f.type is int and scale == 1 else float(value)
    except ValueError:
        raise ValueError(f"{f.flag}: expected {what}, got {text.strip()[:80]!r}") from None
    if isinstance(number, float) and not math.isfinite(number):
        raise ValueError(f"{f.flag}: expected a finite number, got {text.strip()[:80]!r}")
    return number * scale if scale != 1 else number


PRECISION_CHOICES = ("bf16", "bf16-fp32-grads", "fp16", "fsdp2-bf16", "fp8", "deepseek-fp8", "fp32")
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zero-bubble", "dualpipe")
OBJECTIVES = ("step-time", "tokens-per-gpu", "headroom", "fewest-gpus")
_L, _W, _F, _S = Group.LAYOUT, Group.WORKLOAD, Group.FINETUNE, Group.SEARCH
_C = Group.CONDITIONS
STACKS = ("deepspeed", "fsdp2", "llm-foundry", "megatron-core", "megatron-lm-2021", "nemo", "torchtitan")
"""The catalog's training stacks (catalog/stacks/*.toml; a test keeps the two lists equal)."""
ON_OFF = ("on", "off")


def _switch(name: str, help: str) -> Field:
    """A condition that is on or off, unset (None) until a flag or the stack sets it."""
    return Field(name=name, type=str, default=None, group=_C, choices=ON_OFF, help=help)


def _degree(name: str, help: str, unit: str = "GPUs") -> Field:
    return Field(name=name, type=int, default=1, help=help, group=_L, unit=unit, lo=1, hi=MAX_DEGREE)


FIELDS: tuple[Field, ...] = (
    Field(
        name="gpu",
        type=str,
        default=None,
        group=Group.FLEET,
        help="GPU kind: a catalog name (meshplan list gpus) or a GPU TOML file",
    ),
    Field(name="gpus", type=int, default=None, group=Group.FLEET, help="GPUs in the fleet", lo=1, hi=MAX_GPUS),
    Field(
        name="node_size",
        type=int,
        default=None,
        group=Group.FLEET_SHAPE,
        help="GPUs per scale-up (NVLink) domain (default: the GPU's own)",
        unit="GPUs",
        lo=1,
        hi=MAX_DEGREE,
    ),
    Field(
        name="scale_out",
        type=str,
        default=None,
        group=Group.FLEET_SHAPE,
        help="scale-out link: a catalog name (meshplan list links) or a link TOML file (default: the GPU's NIC)",
    ),
    Field(
        name="scale_out_bandwidth",
        type=float,
        default=None,
        group=Group.FLEET_SHAPE,
        unit="bytes/s per NIC per direction",
        lo=0,
        hi=1e13,
        exclusive_lo=True,
        suffixes=True,
        help="scale-out bandwidth as a number, replacing the link's (e.g. 50G for a 400 Gb/s NIC; one per GPU "
        "unless --nics-per-node says otherwise)",
    ),
    Field(
        name="nics_per_node",
        type=int,
        default=None,
        group=Group.FLEET_SHAPE,
        unit="NICs",
        lo=1,
        hi=64,
        help="scale-out NICs per host, each of the scale-out link's bandwidth, shared by the host's GPUs (default: "
        "one per GPU, rail-optimized; 4 for 8 GPUs halves each GPU's share)",
    ),
    Field(
        name="oversubscription",
        type=float,
        default=None,
        group=Group.FLEET_SHAPE,
        unit="downlink / uplink bandwidth",
        lo=1,
        hi=64,
        help="the fabric's oversubscription at the leaf switches (default 1, non-blocking): all-to-all traffic "
        "leaving a node shares the uplinks; rings and trees stay on their rail",
    ),
    Field(
        name="axis_order",
        type=str,
        default=None,
        group=Group.FLEET_SHAPE,
        help="mesh axes innermost first, e.g. tp,cp,ep,dp_shard,dp_replicate,pp (the default)",
    ),
    Field(
        name="profile",
        type=str,
        default=None,
        group=Group.FLEET_SHAPE,
        help="cluster profile from meshplan calibrate: its TOML file, or inline compute_scale=0.9,comm_scale=1.2 "
        "(scales on every GPU and link constant: compute_scale, comm_scale, attention_scale, memory_scale; and "
        "step_overhead_s, host seconds added to every step)",
    ),
    _degree("tp", "tensor-parallel degree"),
    _degree("pp", "pipeline-parallel degree (stages)"),
    Field(
        name="vpp", type=int, default=1, group=_L, help="virtual pipeline stages per rank (interleaved)", lo=1, hi=64
    ),
    _degree("cp", "context-parallel degree"),
    _degree("ep", "expert-parallel degree, carved out of dp_shard x cp (and of tp when --expert-tp is below tp)"),
    Field(
        name="expert_tp",
        type=int,
        default=None,
        group=_L,
        unit="GPUs",
        lo=1,
        hi=MAX_DEGREE,
        help="tensor-parallel degree inside each expert (Megatron --expert-tensor-parallel-size; default: tp); "
        "below tp, EP folds over the TP ranks (MoE parallel folding), so ep x expert-tp <= node size keeps the "
        "all-to-all inside the node",
    ),
    Field(
        name="dp",
        type=int,
        default=None,
        group=_L,
        unit="GPUs",
        lo=1,
        hi=MAX_GPUS,
        help="data-parallel ranks, gpus / (tp x pp x cp): derived, and checked when given",
    ),
    Field(
        name="dp_shard",
        type=int,
        default=None,
        group=_L,
        unit="GPUs",
        lo=1,
        hi=MAX_GPUS,
        help="ZeRO/FSDP shard group (default: every data-parallel rank when zero > 0)",
    ),
    Field(
        name="dp_replicate",
        type=int,
        default=None,
        group=_L,
        unit="GPUs",
        lo=1,
        hi=MAX_GPUS,
        help="replicas of the shard group, dp / dp_shard: derived, and checked when given",
    ),
    Field(
        name="zero",
        type=int,
        default=0,
        group=_L,
        help="ZeRO stage: 0 none, 1 optimizer, 2 +gradients, 3 +weights",
        lo=0,
        hi=3,
    ),
    Field(name="sp", type=bool, default=False, group=_L, help="sequence parallelism inside the TP group"),
    Field(
        name="recompute",
        type=str,
        default="none",
        group=_L,
        choices=("none", "selective", "full"),
        help="activation recomputation",
    ),
    Field(
        name="schedule",
        type=str,
        default=None,
        group=_L,
        choices=SCHEDULES,
        help="pipeline schedule (default: 1f1b, interleaved when vpp > 1)",
    ),
    Field(
        name="cp_kind",
        type=str,
        default="ring",
        group=_L,
        choices=("ring", "all-gather"),
        help="context parallelism: ring K/V exchange or all-gathered K/V",
    ),
    Field(
        name="micro_batch",
        type=int,
        default=1,
        group=_L,
        unit="sequences",
        lo=1,
        hi=MAX_MICRO_BATCH,
        help="sequences per micro-batch",
    ),
    Field(
        name="seq",
        type=int,
        default=4096,
        group=_W,
        unit="tokens",
        lo=1,
        hi=MAX_SEQ,
        suffixes=True,
        help="sequence length",
    ),
    Field(
        name="global_batch",
        type=int,
        default=None,
        group=_W,
        unit="sequences",
        lo=1,
        hi=MAX_BATCH,
        suffixes=True,
        help="sequences per optimizer step (default: pp x micro-batch x dp)",
    ),
    Field(
        name="precision",
        type=str,
        default="bf16",
        group=_W,
        choices=PRECISION_CHOICES,
        help="precision policy of weights, gradients, master copy and compute",
    ),
    Field(
        name="optimizer",
        type=str,
        default="adamw",
        group=_W,
        choices=("adamw", "sgd-momentum", "sgd", "adafactor"),
        help="optimizer",
    ),
    Field(
        name="optimizer_bytes",
        type=float,
        default=None,
        group=_W,
        unit="bytes per parameter",
        lo=0,
        hi=64,
        help="explicit optimizer-state bytes per parameter, master copy excluded",
    ),
    Field(
        name="attention",
        type=str,
        default="flash",
        group=_W,
        choices=("flash", "fa1", "fa-triton", "fa2", "fa3", "cudnn", "eager"),
        help="attention kernel: flash (the stack's fused kernel on this GPU), a named fused kernel (FlashAttention "
        "1, its Triton kernel, 2 or 3, cuDNN), or eager (unfused, the score matrix stored)",
    ),
    Field(
        name="kernels",
        type=str,
        default="fused",
        group=_W,
        choices=("fused", "eager"),
        help="fused (Megatron / Transformer Engine) or eager (plain PyTorch) elementwise ops",
    ),
    Field(
        name="finetune",
        type=str,
        default=None,
        group=_F,
        choices=("full", "lora", "qlora"),
        help="what trains (default: full training)",
    ),
    Field(
        name="lora_rank",
        type=int,
        default=None,
        group=_F,
        lo=1,
        hi=1 << 16,
        help="rank of the LoRA adapters (default 16)",
    ),
    Field(
        name="lora_targets",
        type=str,
        default=None,
        group=_F,
        help="adapted projections, comma-separated: q,k,v,o,gate,up,down (default: all of them)",
    ),
    Field(
        name="lora_train_embeddings",
        type=bool,
        default=False,
        group=_F,
        help="LoRA / QLoRA: the embedding and the output head train too (PEFT modules_to_save)",
    ),
    Field(
        name="freeze",
        type=str,
        default=None,
        group=_F,
        help="frozen parts in full fine-tuning: embeddings and/or layers=N",
    ),
    Field(
        name="stack",
        type=str,
        default=None,
        group=_C,
        choices=STACKS,
        help="training stack whose defaults set every condition below (meshplan stacks lists them)",
    ),
    Field(
        name="framework",
        type=str,
        default=None,
        group=_C,
        choices=("megatron", "torch"),
        help="whose tensors the activation bill counts: Megatron-Core's or PyTorch-native (FSDP2, DTensor)",
    ),
    Field(
        name="runtime_reserve",
        type=float,
        default=None,
        group=_C,
        unit="bytes",
        lo=0,
        hi=1e12,
        suffixes=True,
        help="what the runtime keeps beyond the allocator's peak: NCCL buffers, communicators, CUDA graphs",
    ),
    Field(
        name="microbatch_group",
        type=int,
        default=None,
        group=_C,
        unit="micro-batches",
        lo=1,
        hi=MAX_BATCH,
        help="interleaved schedule: micro-batches per group N (Megatron microbatch_group_size_per_vp_stage; "
        "default: pp)",
    ),
    Field(
        name="first_stage_layers",
        type=int,
        default=None,
        group=_C,
        unit="layers",
        lo=0,
        hi=4096,
        help="transformer layers on the first pipeline stage (Megatron --decoder-first-pipeline-num-layers); "
        "the stages not stated split the rest evenly",
    ),
    Field(
        name="last_stage_layers",
        type=int,
        default=None,
        group=_C,
        unit="layers",
        lo=0,
        hi=4096,
        help="transformer layers on the last pipeline stage (Megatron --decoder-last-pipeline-num-layers)",
    ),
    Field(
        name="recompute_layers",
        type=int,
        default=None,
        group=_C,
        unit="layers",
        lo=0,
        hi=4096,
        help="with --recompute full, recompute only the first k layers of each stage (Megatron "
        "--recompute-num-layers with the block method); the rest keep everything",
    ),
    Field(
        name="offload_layers",
        type=int,
        default=None,
        group=_C,
        unit="layers",
        lo=0,
        hi=4096,
        help="activations of the first k layers offloaded to host memory (Megatron --cpu-offloading-num-layers "
        "with activation offloading; pp 1 and no recompute, as Megatron requires)",
    ),
    Field(
        name="doc_tokens",
        type=int,
        default=None,
        group=_C,
        unit="tokens",
        lo=1,
        hi=MAX_SEQ,
        help="sequences are packed documents of this mean length and attention stays inside each (document "
        "masks, cu_seqlens); default: one document a sequence",
    ),
    Field(
        name="routing_imbalance",
        type=float,
        default=None,
        group=_C,
        unit="busiest / mean",
        lo=1,
        hi=64,
        help="MoE: tokens the busiest expert-parallel rank receives over the mean (default 1, balanced)",
    ),
    _switch("grad_sync", "reduce gradients on every micro-batch; off: accumulate without sync (unsharded grads)"),
    _switch("reshard_after_forward", "FSDP/ZeRO-3 frees gathered parameters after forward; off: keeps them"),
    _switch(
        "pp_host_sync",
        "each pipeline send ends in a host synchronize (Megatron-LM's batched p2p; default); off: overlapped "
        "interleaved sends only order streams (Megatron-Core --overlap-p2p-comm)",
    ),
    Field(
        name="loss",
        type=str,
        default=None,
        group=_C,
        choices=("framework", "upcast", "fused", "compiled"),
        help="cross-entropy: the framework's own, eager fp32 upcast, chunked/fused, or the upcast under torch.compile "
        "(torchtitan's with compile since 2025-04)",
    ),
    _switch("loss_parallel", "compute the loss on vocabulary shards over the TP group"),
    _switch(
        "loss_fusion",
        "Megatron: the fused cross-entropy (--cross-entropy-loss-fusion; default); off: Megatron-LM's default "
        "unfused vocab-parallel loss on fp32 logits",
    ),
    _switch(
        "pp_scatter_gather",
        "pipeline sends split over the TP ranks and gathered again on NVLink (Megatron's default); off: every TP "
        "rank sends the whole activation (DeepSpeed's pipeline engine)",
    ),
    _switch(
        "grad_accum_fusion",
        "Megatron: the weight-gradient GEMM accumulates into the main gradient (--gradient-accumulation-fusion; "
        "default); off: a separate pass adds each micro-batch's weight gradients after the first (Megatron-LM "
        "2021 in fp16)",
    ),
    Field(
        name="zero3_unit",
        type=str,
        default=None,
        group=_C,
        choices=("layer", "module", "parameter"),
        help="what one ZeRO-3 all-gather / reduce-scatter carries: a layer (FSDP units; default) or one weight "
        "matrix (DeepSpeed ZeRO-3, which also re-gathers in the recomputed forward; parameter: through the list "
        "collectives of DeepSpeed 0.3, a copy per rank)",
    ),
    Field(
        name="zero3_grad_reduce",
        type=str,
        default=None,
        group=_C,
        choices=("reduce-scatter", "all-reduce"),
        help="how ZeRO-3 reduces each unit's gradients: a reduce-scatter (default) or an all-reduce of flat "
        "buckets (DeepSpeed 0.3 with contiguous_gradients off, its stage-3 default)",
    ),
    Field(
        name="selective",
        type=str,
        default=None,
        group=_C,
        choices=("core-attention", "layer", "modules", "op"),
        help="what --recompute selective recomputes: Megatron's core attention or its --recompute-modules list, "
        "or torchtitan's per-op or every-second-layer checkpointing",
    ),
    Field(
        name="recompute_modules",
        type=str,
        default=None,
        group=_C,
        help="with --selective modules: Megatron's modules, comma-separated: core_attn, layernorm, mlp, moe_act, "
        "moe, shared_experts, mla_up_proj (default: core_attn)",
    ),
    Field(
        name="grad_dtype",
        type=str,
        default=None,
        group=_C,
        choices=("bf16", "fp16", "fp32"),
        help="gradient buffers, as they are reduced (overrides the precision policy)",
    ),
    Field(
        name="master_dtype",
        type=str,
        default=None,
        group=_C,
        choices=("fp32", "bf16", "none"),
        help="optimizer's master copy of the weights; bf16: a 16-bit copy (Apex's distributed Adam with its state "
        "in bf16, NeMo 1.x's optim.dtype bf16); none: the weights are updated in place",
    ),
    Field(
        name="moment_dtype",
        type=str,
        default=None,
        group=_C,
        choices=("bf16", "fp32"),
        help="optimizer moments (overrides the precision policy)",
    ),
    Field(
        name="fp8_recipe",
        type=str,
        default=None,
        group=_C,
        choices=("tensorwise", "rowwise", "delayed", "mxfp8"),
        help="FP8 scaling with --precision fp8: per tensor, per row, delayed (amax history), or mxfp8 (a scale per "
        "32 elements, Blackwell only); rowwise and mxfp8 refuse --fp8-all-gather",
    ),
    _switch(
        "fp8_all_gather",
        "parameter all-gathers carry the layers' weights in FP8, half the bytes of bf16: FSDP / ZeRO-3's (torchao "
        "enable_fsdp_float8_all_gather) and ZeRO-1/2's after the step (Megatron --fp8-param-gather); needs "
        "--precision fp8 and one scale per tensor (--fp8-recipe tensorwise, delayed or unset)",
    ),
    _switch(
        "fp8_dispatch",
        "MoE: the dispatch all-to-all carries the routed tokens in FP8 with an fp32 scale per 128 elements, the "
        "combine stays bf16 (DeepSeek-V3 Sec. 3.3.2; DeepEP's FP8 dispatch); needs FP8 matmuls",
    ),
    _switch(
        "fsdp_copies",
        "ZeRO-3 is FSDP2: each all-gather copied out into the parameters and the gradients into the "
        "reduce-scatter buffer, on the compute stream (off: FSDP1's flat parameters, used in place)",
    ),
    _switch(
        "repeat_kv",
        "the attention gets K/V repeated to one head per query head (torchtitan's Llama: repeat_kv before SDPA); "
        "context parallelism passes them at that width",
    ),
    _switch(
        "recompute_early_stop",
        "full recompute is PyTorch's non-reentrant checkpoint, which stops re-running a block once every tensor "
        "its backward saved is back: the block's last matmul (the MLP's down projection) is not recomputed",
    ),
    Field(
        name="cp_rotate",
        type=str,
        default=None,
        group=_C,
        choices=("alltoall", "allgather"),
        help="PyTorch's ring CP: pass each K/V block to the next rank per step (alltoall; default) or all-gather "
        "every block once, hidden behind the first block's attention only (allgather: PyTorch's and torchtitan's "
        "rotate_method default)",
    ),
    _switch("overlap_dp", "data-parallel gradient reduction overlaps backward"),
    _switch("overlap_param_gather", "ZeRO/FSDP parameter all-gather overlaps compute"),
    _switch("overlap_tp", "TP communication overlaps its matmuls (Megatron --tp-comm-overlap, async TP)"),
    _switch(
        "overlap_tp_backward",
        "TP's backward input-gradient all-reduce overlaps the weight-gradient matmuls (Megatron's default; off in "
        "the Megatron-LM of the 2021 papers)",
    ),
    _switch("overlap_ep", "MoE dispatch/combine all-to-alls overlap compute"),
    _switch("overlap_pp", "pipeline sends and receives overlap compute"),
    _switch("overlap_cp", "context-parallel K/V exchange overlaps attention"),
    Field(
        name="global_batch_tokens",
        type=int,
        default=None,
        group=_S,
        unit="tokens",
        lo=1,
        hi=MAX_BATCH * 1024,
        suffixes=True,
        help="tokens per optimizer step",
    ),
    Field(name="top", type=int, default=5, group=_S, lo=1, hi=MAX_TOP, help="plans to show"),
    Field(
        name="headroom",
        type=float,
        default=0.10,
        group=_S,
        unit="share of HBM",
        lo=0,
        hi=0.9,
        help="share of HBM kept free",
    ),
    Field(name="objective", type=str, default="step-time", group=_S, choices=OBJECTIVES, help="what ranks the plans"),
    Field(
        name="tokens",
        type=float,
        default=None,
        group=_S,
        unit="tokens",
        lo=0,
        hi=MAX_TOKENS,
        exclusive_lo=True,
        suffixes=True,
        help="tokens to train: adds days and GPU-hours",
    ),
    Field(
        name="days",
        type=float,
        default=None,
        group=_S,
        unit="days",
        lo=0,
        hi=MAX_DAYS,
        exclusive_lo=True,
        help="deadline for the fewest-gpus objective",
    ),
    Field(
        name="training_engine",
        alias="engine",
        type=str,
        default=None,
        group=_S,
        choices=("torchtitan", "megatron", "deepspeed"),
        help="keep only layouts this engine runs (what meshplan export ENGINE --from-plan accepts)",
    ),
    Field(
        name="allow_cross_node_tp",
        type=bool,
        default=False,
        group=_S,
        help="let TP groups leave the scale-up domain",
    ),
)

SERVING_FIELDS: tuple[Field, ...] = (
    Field(
        name="dtype",
        type=str,
        default="bf16",
        group=Group.SERVING,
        choices=("bf16", "fp16", "fp8", "int8", "int4", "fp4"),
        help="weight dtype",
    ),
    Field(
        name="kv_dtype",
        type=str,
        default="bf16",
        group=Group.SERVING,
        choices=("bf16", "fp16", "fp8"),
        help="KV-cache dtype",
    ),
    Field(
        name="context",
        type=int,
        default=None,
        group=Group.SERVING,
        unit="tokens",
        lo=1,
        hi=MAX_CONTEXT,
        suffixes=True,
        help="tokens per sequence (default: the model's maximum)",
    ),
    Field(
        name="gpu_memory_utilization",
        type=float,
        default=0.9,
        group=Group.SERVING,
        unit="share",
        lo=0,
        hi=1,
        exclusive_lo=True,
        help=(
            "the engine's memory fraction, read as the engine reads it: vLLM --gpu-memory-utilization (of HBM), "
            "TensorRT-LLM kv_cache_free_gpu_mem_fraction (of what is free after load), SGLang "
            "--mem-fraction-static (of HBM, for weights and KV); serve's default: the engine's"
        ),
    ),
)
_V = Group.SERVE
MAX_LOAD = 1e7
"""Users or requests per second: above any single deployment's traffic."""
SERVE_FIELDS: tuple[Field, ...] = (
    Field(
        name="input_len",
        type=int,
        default=None,
        group=_V,
        unit="tokens",
        lo=1,
        hi=MAX_CONTEXT,
        suffixes=True,
        help="prompt tokens per request",
    ),
    Field(
        name="output_len",
        type=int,
        default=None,
        group=_V,
        unit="tokens",
        lo=1,
        hi=MAX_CONTEXT,
        suffixes=True,
        help="generated tokens per request",
    ),
    Field(
        name="concurrency",
        type=float,
        default=None,
        group=_V,
        unit="users",
        lo=0,
        hi=MAX_LOAD,
        exclusive_lo=True,
        help="users in a closed loop, each sending its next request when the last one ends",
    ),
    Field(
        name="rate",
        type=float,
        default=None,
        group=_V,
        unit="requests/s",
        lo=0,
        hi=MAX_LOAD,
        exclusive_lo=True,
        help="requests arriving per second (Poisson), open loop",
    ),
    Field(
        name="dp_attention", type=bool, default=False, group=_V, help="attention data-parallel over the TP ranks (MoE)"
    ),
    Field(
        name="replicas",
        type=int,
        default=None,
        group=_V,
        unit="replicas",
        lo=1,
        hi=MAX_GPUS,
        help="model replicas (default: gpus / (tp x pp))",
    ),
    Field(
        name="weights_dtype",
        type=str,
        default="bf16",
        group=_V,
        choices=("bf16", "fp16", "fp8", "int8", "int4", "fp4"),
        help="weight dtype",
    ),
    Field(
        name="quant",
        type=str,
        default=None,
        group=_V,
        choices=("weight-only", "w-a"),
        help="weight-only or weight-and-activation quantization (default: W-A where the GPU computes in the dtype)",
    ),
    Field(
        name="engine",
        type=str,
        default="trtllm",
        group=_V,
        choices=("trtllm", "vllm", "sglang", "gpt-fast"),
        help="serving engine whose calibrated shares apply",
    ),
    Field(
        name="max_batch",
        type=int,
        default=None,
        group=_V,
        unit="sequences",
        lo=1,
        hi=MAX_BATCH,
        help="cap on sequences per replica",
    ),
    Field(
        name="max_num_tokens",
        type=int,
        default=None,
        group=_V,
        unit="tokens",
        lo=1,
        hi=MAX_CONTEXT,
        suffixes=True,
        help="tokens one forward may carry (decode tokens and prompt chunks; engine default otherwise)",
    ),
    Field(
        name="num_requests",
        type=int,
        default=None,
        group=_V,
        unit="requests",
        lo=1,
        hi=int(MAX_LOAD),
        help=(
            "serve: an offline run of this many identical requests queued at once (trtllm-bench throughput): "
            "the steady state at that concurrency, and the whole run, ramp and drain included"
        ),
    ),
    Field(
        name="cuda_graph_padding",
        type=bool,
        default=False,
        group=_V,
        help=(
            "decode-only steps replay CUDA graphs padded to the captured batch sizes 1, 2, 4 ... 256, 384, 512, "
            "1024 ... 8192 (TensorRT-LLM cuda_graph_config enable_padding)"
        ),
    ),
    Field(
        name="disaggregate",
        type=str,
        default=None,
        group=_V,
        help="serve: P:D, GPUs of the prefill pool and of the decode pool",
    ),
    Field(
        name="ttft_p99",
        type=float,
        default=None,
        group=_V,
        unit="s",
        lo=0,
        hi=1e6,
        exclusive_lo=True,
        help="p99 time-to-first-token target",
    ),
    Field(
        name="tpot_p99",
        type=float,
        default=None,
        group=_V,
        unit="s",
        lo=0,
        hi=1e6,
        exclusive_lo=True,
        help="p99 time-per-output-token target",
    ),
    Field(
        name="serve_objective",
        alias="objective",
        type=str,
        default="throughput",
        group=_V,
        choices=("throughput", "latency", "fewest-gpus"),
        help="what ranks the serving plans",
    ),
    Field(
        name="weights_dtypes",
        type=str,
        default=None,
        group=_V,
        help="weight dtypes serve-plan searches, comma-separated (default: every one the GPU runs)",
    ),
    Field(
        name="search_disaggregated",
        type=bool,
        default=False,
        group=_V,
        help="serve-plan: also split replicas into prefill and decode pools",
    ),
)
FIELDS = FIELDS + SERVING_FIELDS + SERVE_FIELDS
BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}
LAYOUT_ALIASES = {"mb": "micro_batch"}
"""Short keys ``--compare`` accepts beside the field names."""


def group(g: Group) -> tuple[Field, ...]:
    return tuple(f for f in FIELDS if f.group is g)


def field(name: str) -> Field:
    return BY_NAME[name]


def flag_args(values: Mapping[str, Any]) -> list[str]:
    """Schema values (by field name) as the command-line arguments that set them: a true switch as its flag, a
    false one and an unset value left out, a float written so that it parses back to itself."""
    args: list[str] = []
    for key, value in values.items():
        flag = field(key).flag
        if isinstance(value, bool):
            args += [flag] if value else []
        elif value is not None:
            args += [flag, repr(value) if isinstance(value, float) else str(value)]
    return args


def parse_values(values: Mapping[str, Any], *, allowed: Iterable[Field], what: str) -> dict[str, Any]:
    """Parse a mapping of field names to raw values (a run file's table, a compare string's items).

    Unknown keys are refused with the known ones listed, never dropped.
    """
    known = {f.name: f for f in allowed}
    out: dict[str, Any] = {}
    for key, raw in values.items():
        name = LAYOUT_ALIASES.get(key, key)
        if name not in known:
            names = ", ".join(sorted(known))
            raise ValueError(f"unknown {what} key {key!r} (known: {names})")
        out[name] = known[name].parse(raw)
    return out


def parse_key_values(text: str, *, allowed: Iterable[Field], what: str) -> dict[str, Any]:
    """'tp=8,pp=16,dp=128' into parsed values, with keys dashed or underscored."""
    raw: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        if "=" not in item:
            raise ValueError(f"{what} item {item!r} must look like key=value (e.g. tp=8,pp=16,dp=128)")
        key, value = (x.strip() for x in item.split("=", 1))
        raw[key.lower().replace("-", "_")] = value
    return parse_values(raw, allowed=allowed, what=what)
