"""The fields that say how a training run was set up: its stack and each condition the stack sets (every one
overridable; unset means the stack's own value)."""

from __future__ import annotations

from meshplan.spec.schema.field import MAX_BATCH, MAX_SEQ, Field, Group

_C = Group.CONDITIONS
STACKS = ("deepspeed", "fsdp2", "hf-trainer", "llm-foundry", "megatron-core", "megatron-lm-2021", "nemo", "torchtitan")
"""The catalog's training stacks (catalog/stacks/*.toml; a test keeps the two lists equal)."""
ON_OFF = ("on", "off")


def _switch(name: str, help: str) -> Field:
    """A condition that is on or off, unset (None) until a flag or the stack sets it."""
    return Field(name=name, type=str, default=None, group=_C, choices=ON_OFF, help=help)


CONDITION_FIELDS: tuple[Field, ...] = (
    Field(
        name="stack",
        type=str,
        default=None,
        group=_C,
        choices=STACKS,
        help="training stack whose defaults set every condition below (meshplan stacks lists them); unset: the "
        "engine's (plan --engine, export) or megatron-core",
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
        name="launch",
        type=str,
        default=None,
        group=_C,
        choices=("eager", "compile", "cudagraph"),
        help="how the host issues each layer's kernels: op by op (eager PyTorch, Megatron; in serve, vLLM "
        "--enforce-eager or SGLang --disable-cuda-graph), torch.compile's fused kernels, or CUDA graphs (Megatron "
        "--cuda-graph-impl); unset: compile for fused kernels under a PyTorch-native stack, eager otherwise, and "
        "in serve the engine's replayed CUDA graphs",
    ),
    Field(
        name="loss",
        type=str,
        default=None,
        group=_C,
        choices=("framework", "upcast", "bf16", "fused", "compiled"),
        help="cross-entropy: the framework's own, eager fp32 upcast, eager on the bf16 logits (no upcast), "
        "chunked/fused, or the upcast under torch.compile (torchtitan's with compile since 2025-04)",
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
        name="zero_grad_reduce",
        type=str,
        default=None,
        group=_C,
        choices=("reduce-scatter", "all-reduce", "reduce"),
        help="how ZeRO-1/2 reduce the gradients: a reduce-scatter (default; Megatron's distributed optimizer), "
        "all-reduced buckets (DeepSpeed's default since use_multi_rank_bucket_allreduce, and its BF16 optimizer) "
        "or one reduce per rank (DeepSpeed before that option: D calls, latency-bound at scale)",
    ),
    Field(
        name="selective",
        type=str,
        default=None,
        group=_C,
        choices=("core-attention", "layer", "modules", "op", "keep"),
        help="what --recompute selective recomputes: Megatron's core attention or its --recompute-modules list, "
        "torchtitan's per-op or every-second-layer checkpointing, or keep: the --recompute-keep tensors only",
    ),
    Field(
        name="recompute_keep",
        type=str,
        default=None,
        group=_C,
        help="with --recompute selective (sets --selective keep): the tensors each layer keeps, comma-separated, "
        "every other one recomputed in backward: norm, q, k, v, attn, o, gate, up, act, down (q,k,v: the Q/K/V "
        "projections only)",
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
        name="ep_dispatch",
        type=str,
        default=None,
        group=_C,
        choices=("alltoall", "deepep"),
        help="MoE token dispatcher: NCCL all-to-all, a row per token and expert (alltoall; Megatron-Core's "
        "--moe-token-dispatcher-type alltoall, torchtitan) or DeepEP's kernels, each token once per node over RDMA "
        "and on by NVLink, 20 SMs taken from compute (deepep; Megatron's flex dispatcher)",
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
)
