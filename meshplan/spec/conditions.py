"""How a run was set up beyond its layout: the conditions a training stack sets and a user can override.

A stack (catalog/stacks/*.toml) gives a default for each condition; a flag overrides it. The core reads the
resolved values from ``Workload.conditions``; the reports say where each value came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class LossKind(StrEnum):
    """How the cross-entropy over the vocabulary is computed, which decides the loss peak."""

    FRAMEWORK = "framework"
    """The framework's own loss (Megatron's fused vocab-parallel CE, PyTorch's as ``check`` measures it)."""
    UPCAST = "upcast"
    """``cross_entropy(logits.float())`` in eager PyTorch: bf16 logits, their fp32 copy, the saved fp32
    log-probabilities and two fp32 gradients; 12 bytes per token and vocabulary entry at the backward peak."""
    BF16 = "bf16"
    """``cross_entropy(logits)`` on the bf16 logits in eager PyTorch, no upcast (KempnerForge's ``cross_entropy``
    loss): the bf16 log-probabilities and two bf16 gradients, the caller keeping the logits through backward;
    8 bytes per token and vocabulary entry at the backward peak (``BF16_LOSS_BYTES``)."""
    FUSED = "fused"
    """Chunked or fused linear cross-entropy (torchtune, Liger): the upcast loss on one of 8 token chunks at a time."""
    COMPILED = "compiled"
    """``cross_entropy(logits.float())`` under torch.compile (torchtitan's loss with --training.compile since
    2025-04): Inductor fuses the upcast, the log-softmax and the loss into row reductions over the bf16 logits,
    keeps those logits for backward and writes their bf16 gradient in one pass (``COMPILED_LOSS_BYTES``)."""


UPCAST_LOSS_BYTES = 12.0
"""Bytes per token per vocabulary entry at the peak of ``cross_entropy(logits.float())``: in forward the bf16
logits (2), their fp32 upcast (4) and the saved fp32 log-probabilities (4) make 10; in backward the saved
log-probabilities (4), the fp32 gradient of the log-probabilities (4) and of the upcast logits (4) make 12, the
bf16 logits being freed once the loop drops them (torchtitan's ``del pred``; 14 if the caller keeps them)."""
PARALLEL_UPCAST_LOSS_BYTES = 16.0
"""The same loss under PyTorch's ``loss_parallel`` (DTensor logits sharded over the vocabulary, torchtitan's
default under TP), per token and local vocabulary entry: its backward (torch/distributed/tensor/parallel/loss.py
``_nll_loss_and_log_softmax_backward``) fuses the two gradients as ``(zeros_like(x) + exp(x)) * grad`` on the
saved fp32 log-probabilities x, so x (4), the zeros it scatters -1 into (4), their sum with exp(x) (4) and the
product (4) are live at once: 16 where aten's fused kernels take 12 (measured on CPU by
tests/test_loss_parallel_peak.py)."""
BF16_LOSS_BYTES = 8.0
"""Bytes per token per vocabulary entry at the peak of ``cross_entropy(logits)`` on bf16 logits (log_softmax
and nll_loss in the logits' dtype): the logits the caller still holds (2: KempnerForge's loop keeps ``logits``
until the micro-batch ends, kempnerforge/training/loop.py text_step), the saved log-probabilities (2), and in
backward nll_loss's gradient of them (2) and log_softmax's gradient of the logits (2)."""
COMPILED_LOSS_BYTES = 4.0
"""Bytes per token per vocabulary entry at the peak of the compiled loss: the bf16 logits its backward reads (2,
kept by the compiled graph whatever the caller drops) and their bf16 gradient (2); no fp32 copy is made. On
torchao's torchtitan benchmarks of Llama 3.1 8B (8 GPUs, FSDP, one 8,192-token sequence, per-op SAC, compile) the
peak goes from 47.65 GiB (H100, torchtitan 0.0.2 of 2025-03: loss eager) to 39.09 GiB (MI300X, 2025-08: loss
compiled), 8.6 GiB, where 12 - 4 bytes on its 8,192 x 128,256 logits are 7.8 GiB."""
FUSED_LOSS_CHUNKS = 8
"""Token chunks of a chunked cross-entropy (torchtune's CEWithChunkedOutputLoss default)."""


class Selective(StrEnum):
    """What ``--recompute selective`` recomputes, as each stack defines it."""

    CORE_ATTENTION = "core-attention"
    """Megatron's selective: the attention core (scores, softmax, dropout) only (Korthikanti et al. 2022)."""
    OP = "op"
    """torchtitan's per-op selective checkpointing: keeps the layer input, every second matmul output and the
    attention output (with its log-sum-exp); recomputes norms, activations and the other matmuls."""
    LAYER = "layer"
    """torchtitan's per-layer selective checkpointing (ac_freq 2): every second layer fully recomputed."""
    MODULES = "modules"
    """Megatron's --recompute-modules: the listed modules (``Conditions.recompute_modules``) are recomputed."""
    KEEP = "keep"
    """A save list (``Conditions.recompute_keep``): each layer keeps its input and the named tensors, and backward
    reruns every other op of its forward (torch.utils.checkpoint with a selective policy that saves the named
    ops' outputs and prefers to recompute the rest)."""


class Fp8Recipe(StrEnum):
    """How FP8 matmuls scale their operands (with --precision fp8 or deepseek-fp8)."""

    TENSORWISE = "tensorwise"
    """One dynamic scale per tensor (torchao Float8 'tensorwise', TE current scaling): the one recipe whose
    weights FSDP2 can all-gather in FP8 (torchao enable_fsdp_float8_all_gather)."""
    ROWWISE = "rowwise"
    """One scale per row (torchao Float8 'rowwise'): finer, no FP8 all-gather."""
    DELAYED = "delayed"
    """Scales from an amax history of past steps (Transformer Engine's DelayedScaling, Megatron's default
    --fp8-recipe delayed)."""
    MXFP8 = "mxfp8"
    """OCP Microscaling: a power-of-two (E8M0) scale per block of 32 elements along the reduction dimension, so
    each operand is cast twice, row- and column-wise (Transformer Engine's MXFP8BlockScaling, Megatron's
    --fp8-recipe mxfp8, torchao's MX recipe). The tensor cores apply the scales inside the matmul, at the FP8
    rate, on kinds that have block-scaled MMA only (``GPU.block_scaled_mma``: Blackwell)."""


class Zero3Unit(StrEnum):
    """What one ZeRO-3 / FSDP all-gather and reduce-scatter carries."""

    LAYER = "layer"
    """A transformer layer's parameters in one flat collective (FSDP / FSDP2 units, Megatron-FSDP buckets)."""
    MODULE = "module"
    """Each weight matrix on its own, in one flat buffer (DeepSpeed ZeRO-3 since 0.5: sub-module hooks fetch
    every partitioned parameter, and the recomputed forward of full recompute fetches them again)."""
    PARAMETER = "parameter"
    """As module, through torch.distributed's list all_gather and reduce_scatter (DeepSpeed 0.3): each collective
    builds a view per rank of the group and copies every rank's slice to or from the flat buffer apart, two host
    operations per rank, each a launch gap; and after every optimizer step the persistent parameters (biases and
    norms below 1e5 elements) are gathered again and unflattened a parameter and a rank at a time."""


class Zero3GradReduce(StrEnum):
    """How ZeRO-3 reduces a unit's gradients over the shard group."""

    REDUCE_SCATTER = "reduce-scatter"
    """Each rank receives its shard of the sum (ZeRO Sec. 7.2; FSDP, DeepSpeed with contiguous_gradients)."""
    ALL_REDUCE = "all-reduce"
    """Every rank receives the whole sum, twice the bus bytes, and keeps its shard: DeepSpeed 0.3's stage 3 with
    contiguous_gradients off, its default (stage3.py reduce_ipg_grads -> buffered_reduce_fallback -> allreduce_bucket:
    flatten the bucket, divide by the group size, all_reduce, copy back)."""


class ZeroGradReduce(StrEnum):
    """How ZeRO-1 and ZeRO-2 reduce the gradients over the data-parallel group."""

    REDUCE_SCATTER = "reduce-scatter"
    """Each rank receives its shard of the sum (ZeRO Sec. 5; Megatron's distributed optimizer, PyTorch's FSDP)."""
    ALL_REDUCE = "all-reduce"
    """Buckets all-reduced whole, twice the bus bytes, each rank keeping its shard: DeepSpeed since
    use_multi_rank_bucket_allreduce (on by default; stage_1_and_2.py average_tensor -> allreduce_and_scatter) and its
    BF16_Optimizer (the engine's buffered all-reduce)."""
    REDUCE = "reduce"
    """One reduce per destination rank, each of that rank's 1/D of the gradients: DeepSpeed's stage_1_and_2.py
    average_tensor before use_multi_rank_bucket_allreduce (dist.reduce per rank_and_offsets). D calls a reduction,
    each paying a ring's D - 1 hops: the latency grows as D^2, the reason that option was added ("useful when the
    model is small and we want to scale it on too many GPUs", DeepSpeed's zero/config.py)."""


class EpDispatch(StrEnum):
    """How MoE tokens travel to their experts and back (Megatron-Core's --moe-token-dispatcher-type, and with
    ``flex`` its DeepEP backend; torchtitan's expert parallelism)."""

    ALLTOALL = "alltoall"
    """NCCL all-to-all of one row per (token, expert) pair: k copies of a token, each on its own (Megatron-Core's
    alltoall dispatcher, torchtitan's all_to_all_single)."""
    DEEPEP = "deepep"
    """DeepEP's normal kernels (Megatron-Core's flex dispatcher): a token goes once to each node holding one of its
    experts over RDMA, then on by NVLink to each GPU holding one, with a fixed budget of SMs taken from compute."""


class CapacityScheduler(StrEnum):
    """How TensorRT-LLM admits a request against its KV cache (its CapacitySchedulerPolicy: trtllm-bench
    --scheduler_policy, the LLM API's scheduler_config.capacity_scheduler_policy)."""

    GUARANTEED_NO_EVICT = "guaranteed-no-evict"
    """Room for the whole sequence reserved before admission (TensorRT-LLM's default)."""
    MAX_UTILIZATION = "max-utilization"
    """Admitted as the cache grows; requests paused when it runs out."""

    @property
    def trtllm(self) -> str:
        """TensorRT-LLM's own name: GUARANTEED_NO_EVICT, MAX_UTILIZATION."""
        return self.name

    @classmethod
    def from_trtllm(cls, name: str) -> CapacityScheduler | None:
        """The policy TensorRT-LLM names ``name`` (either case: the LLM API's MAX_UTILIZATION, trtllm-bench's
        max_utilization), None for one serve does not take (STATIC_BATCH)."""
        return cls.__members__.get(name.strip().upper())


class CpRotate(StrEnum):
    """How PyTorch's ring attention (torch.distributed.tensor.experimental context_parallel) moves the K/V blocks
    (its ``_cp_options.rotate_method``; torchtitan's --experimental.context_parallel_rotate_method)."""

    ALLTOALL = "alltoall"
    """Each ring step sends the block in hand to the next rank (``_AllToAllRotater``: ``permute_tensor``, an
    all_to_all_single), waited for before the next step: every exchange hides behind one block's attention."""
    ALLGATHER = "allgather"
    """One all-gather of every rank's K/V block, issued before the first block's attention and waited for before
    the second (``_AllGatherRotater``): it hides behind the first block alone. PyTorch's default
    (``_ContextParallelOptions.rotate_method``) and torchtitan's since its rotate option (Dec. 2024)."""


RECOMPUTE_KEEP = ("norm", "q", "k", "v", "attn", "o", "gate", "up", "act", "down")
"""Tensors ``--recompute-keep`` can name, per layer: both norms' outputs (the QKV and MLP inputs), the Q, K and V
projections' outputs, the attention kernel's output (with its log-sum-exp), the output projection's, the MLP's gate
and up projections' outputs, the activation's (act(gate) * up under SwiGLU, the GELU output otherwise: the down
projection's input) and the down projection's output."""
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mlp", "moe_act", "moe", "shared_experts", "mla_up_proj")
"""Megatron-Core's --recompute-modules names."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StageSplit:
    """Layers stated for the first and the last pipeline stage (Megatron-LM --decoder-first-pipeline-num-layers
    and --decoder-last-pipeline-num-layers); None: that stage takes its share of the even split. The stages
    not stated split the remaining layers as evenly as they go (``pipeline.stage_span``)."""

    first: int | None = None
    last: int | None = None

    @property
    def stated(self) -> int:
        """Stages whose layer count is stated (0, 1 or 2)."""
        return (self.first is not None) + (self.last is not None)

    @property
    def stated_layers(self) -> int:
        return (self.first or 0) + (self.last or 0)


EVEN_SPLIT = StageSplit()
"""Every stage takes its share of the even split."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Conditions:
    """The resolved conditions of one run (each from a flag, the stack, or meshplan's default)."""

    microbatch_group: int | None = None
    """N, micro-batches per group of the interleaved schedule (Megatron microbatch_group_size_per_vp_stage);
    None: pp (Megatron's default)."""
    grad_sync: bool = True
    """Gradients are reduced on every micro-batch; False: accumulation without sync (``no_sync`` /
    ``set_requires_gradient_sync(False)``), every rank holds the unsharded gradient until the last micro-batch."""
    reshard_after_forward: bool = True
    """FSDP / ZeRO-3 frees gathered parameters after each layer's forward; False keeps them until backward."""
    runtime_reserve_bytes: float = 0.0
    """What the runtime keeps beyond the allocator's peak: NCCL buffers and communicators, allocator caching
    the stack's logs count, graphs and workspaces outside the allocator."""
    loss: LossKind = LossKind.FRAMEWORK
    selective: Selective = Selective.CORE_ATTENTION
    routing_imbalance: float = 1.0
    """Tokens the busiest expert-parallel rank receives over the mean (1: perfectly balanced routing); scales
    the routed experts' activations under EP > 1."""
    recompute_modules: tuple[str, ...] = ("core_attn",)
    """Modules recomputed under ``Selective.MODULES`` (Megatron's default list is core_attn)."""
    recompute_keep: tuple[str, ...] = ()
    """Tensors each layer keeps under ``Selective.KEEP`` (``RECOMPUTE_KEEP``); the rest is recomputed."""
    recompute_layers: int | None = None
    """Under full recompute, only the first k layers of each stage are recomputed and the rest keep everything
    (Megatron --recompute-method block --recompute-num-layers k); None: every layer."""
    loss_parallel: bool | None = None
    """The loss is computed on vocabulary shards over the TP group; None: the framework's own default."""
    stage_split: StageSplit = EVEN_SPLIT
    """Layers stated for the first and last pipeline stage (the rest split evenly)."""
    doc_tokens: int | None = None
    """Sequences are packed documents of this many tokens on average, and attention stays inside each (a
    document mask, or variable-length kernels over cu_seqlens): a query reaches the keys of its own document only.
    None: one document a sequence."""
    offload_layers: int | None = None
    """Layers whose saved activations go to host memory during forward and come back for backward (Megatron's
    --cpu-offloading-num-layers through Transformer Engine's offload handler); None or 0: none."""
    fp8_recipe: Fp8Recipe | None = None
    """The FP8 scaling recipe, when the precision computes in FP8; None: not stated."""
    fp8_all_gather: bool = False
    """Parameter all-gathers carry the layers' matmul weights in FP8 (1 byte a parameter instead of 2): FSDP /
    ZeRO-3's (torchao's enable_fsdp_float8_all_gather) and ZeRO-1/2's after the optimizer step (Megatron's
    --fp8-param-gather with the distributed optimizer); one scale per tensor (tensorwise or delayed, or the
    recipe not stated), under FP8 matmuls only."""
    fp8_dispatch: bool = False
    """MoE dispatch all-to-alls carry the routed tokens in FP8, 1 byte an element and an fp32 scale per 128
    (DeepSeek-V3 Sec. 3.3.2, the input of the FP8 up-projections); the combine and the gradients stay bf16."""
    zero3_unit: Zero3Unit = Zero3Unit.LAYER
    """What one ZeRO-3 collective carries: a layer (FSDP) or one weight matrix (DeepSpeed, flat or listed)."""
    zero3_grad_reduce: Zero3GradReduce = Zero3GradReduce.REDUCE_SCATTER
    """How ZeRO-3 reduces each unit's gradients: a reduce-scatter, or an all-reduce of flat buckets."""
    zero_grad_reduce: ZeroGradReduce = ZeroGradReduce.REDUCE_SCATTER
    """How ZeRO-1/2 reduce the gradients: a reduce-scatter, all-reduced buckets, or one reduce per rank. Under a
    PyTorch-native stack anything but a reduce-scatter makes ZeRO-2 DeepSpeed's (parameters whole from one step to
    the next, gathered once after it) instead of FSDP's SHARD_GRAD_OP."""
    fsdp_copies: bool = False
    """ZeRO-3 is FSDP2 (per-parameter shards): each all-gather's output is copied into the parameters and the
    gradients into the reduce-scatter's input, on the compute stream; False: flat parameters (FSDP1, ZeRO-3
    buckets) gather into and reduce from the buffers the layer uses in place."""
    repeat_kv: bool = False
    """The attention receives K and V repeated to one head per query head (torchtitan's Llama calls repeat_kv
    before SDPA): context parallelism then passes them, and their gradients, at the query heads' width."""
    recompute_early_stop: bool = False
    """Full recompute is PyTorch's non-reentrant checkpoint (torch.utils.checkpoint, use_reentrant=False) with its
    early stop (on by default since PyTorch 2.1): the re-forward stops as soon as every tensor the block's
    backward needs is back, and autograd saves an op's inputs before it runs the op, so the block's last matmul
    (the MLP's down projection, whose inputs are the last tensors saved) is never recomputed. False: the whole
    forward is repeated (Megatron's reentrant checkpoint, the reentrant torch.utils.checkpoint)."""
    ep_dispatch: EpDispatch = EpDispatch.ALLTOALL
    """How MoE tokens reach their experts: NCCL all-to-all, or DeepEP's deduplicating kernels."""
    cp_rotate: CpRotate = CpRotate.ALLTOALL
    """How PyTorch's ring attention passes K/V blocks: block by block, or one all-gather after the first block
    (read only with the ring of PyTorch-native stacks; Megatron's ring is block by block)."""
    loss_fusion: bool = True
    """The framework's loss is fused (Megatron's --cross-entropy-loss-fusion, on in NeMo 2 and Megatron-Bridge):
    about four fp32 passes over the logits (compute.LOSS_BYTES); False: Megatron-LM's default, its unfused
    vocab-parallel loss on an fp32 upcast, pass by pass (compute.MEGATRON_CE_BYTES). Read only under the Megatron
    framework's own loss."""
    pp_scatter_gather: bool | None = None
    """Pipeline sends carry 1/tp of the stage's output from each TP rank and the next stage all-gathers it over
    NVLink (Megatron's scatter/gather, on by default there: --no-scatter-gather-tensors-in-pipeline turns it off);
    False: every TP rank sends the whole activation (DeepSpeed's pipeline engine, PyTorch's pipelining without
    sequence parallelism). None: the framework's own. With sequence parallelism the output is sharded already."""
    grad_accum_fusion: bool = True
    """Megatron's weight-gradient GEMM adds straight into the gradient it accumulates over micro-batches
    (--gradient-accumulation-fusion, on in Megatron-Core, and in Megatron-LM since 2022 when gradients accumulate
    in fp32); False: autograd adds every micro-batch's weight gradients after the first into the parameters'
    ``.grad`` in a separate pass (read both, write the sum, in the parameters' dtype), as Megatron-LM's fp16 runs
    did without contiguous gradient buffers (Narayanan et al. 2021). Read only under the Megatron framework."""
    pp_host_sync: bool = True
    """Each pipeline send ends in a host synchronize (Megatron-LM's batch_isend_irecv then
    torch.cuda.synchronize, p2p_communication.py), which costs every chunk ``pipeline_step_overhead_s``; False:
    overlapped sends of the interleaved schedule only order CUDA streams (Megatron-Core with
    --overlap-p2p-comm, which turns batch_p2p_comm and its synchronize off). Blocking sends always sync."""
    launch: str | None = None
    """How the host issues each layer's kernels (core/time/host.py ``Launch``: eager, compile, cudagraph); None: the
    stack's (``host.launch_of``)."""

    def __post_init__(self) -> None:
        if self.microbatch_group is not None and self.microbatch_group < 1:
            raise ValueError(f"microbatch_group must be >= 1, got {self.microbatch_group}")
        unknown = [m for m in self.recompute_modules if m not in RECOMPUTE_MODULES]
        if unknown:
            raise ValueError(f"unknown recompute module {unknown[0]!r} (modules: {', '.join(RECOMPUTE_MODULES)})")
        unknown = [m for m in self.recompute_keep if m not in RECOMPUTE_KEEP]
        if unknown:
            raise ValueError(f"unknown --recompute-keep tensor {unknown[0]!r} (tensors: {', '.join(RECOMPUTE_KEEP)})")
        if self.selective is Selective.KEEP and not self.recompute_keep:
            raise ValueError("--selective keep needs --recompute-keep (the tensors each layer keeps)")
        if self.recompute_keep and self.selective is not Selective.KEEP:
            raise ValueError(f"--recompute-keep is a selective policy of its own; --selective {self.selective.value} "
                             "recomputes otherwise")  # fmt: skip
        if self.routing_imbalance < 1:
            raise ValueError(f"routing_imbalance must be >= 1, got {self.routing_imbalance}")
        if self.doc_tokens is not None and self.doc_tokens < 1:
            raise ValueError(f"doc_tokens must be >= 1, got {self.doc_tokens}")
        if self.offload_layers is not None and self.offload_layers < 0:
            raise ValueError(f"offload_layers must be >= 0, got {self.offload_layers}")
        if self.recompute_layers is not None and self.recompute_layers < 0:
            raise ValueError(f"recompute_layers must be >= 0, got {self.recompute_layers}")
        for name in ("first", "last"):
            value = getattr(self.stage_split, name)
            if value is not None and value < 0:
                raise ValueError(f"{name}_stage_layers must be >= 0, got {value}")
        if self.fp8_all_gather and self.fp8_recipe in (Fp8Recipe.ROWWISE, Fp8Recipe.MXFP8):
            raise ValueError(
                f"fp8_all_gather needs one scale per tensor, fp8_recipe tensorwise or delayed (torchao gathers FP8 "
                f"weights with per-tensor scales only; Megatron's MXFP8 parameter gather moves bf16), got "
                f"{self.fp8_recipe}"
            )
        if self.runtime_reserve_bytes < 0:
            raise ValueError(f"runtime_reserve_bytes must be >= 0, got {self.runtime_reserve_bytes}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Stack:
    """A training stack: its name, where its defaults come from, and the defaults themselves."""

    name: str
    description: str
    source: str
    reports: str
    """What its memory logs report: 'reserved' (torch.cuda.max_memory_reserved) or 'allocated'."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """Schema field names to values: conditions, and workload fields the stack fixes (precision, kernels)."""

    def __post_init__(self) -> None:
        if self.reports not in ("reserved", "allocated"):
            raise ValueError(f"stack {self.name}: reports must be 'reserved' or 'allocated', got {self.reports!r}")
