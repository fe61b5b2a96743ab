"""Megatron-LM export: the `pretrain_gpt.py` arguments and a torchrun launcher for a plan.

Target: Megatron-LM main at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22;
megatron-core 0.20.0 in development). Every flag below is an option of the parser that
megatron/training/arguments.py builds there (several are generated from dataclasses by
megatron/training/argument_utils.py). Megatron-LM's training scripts are not on the registry
(the megatron-core wheel ships megatron/core only), so the flags are pinned by tests/exports.

How the plan maps:
- ZeRO-1 is the distributed optimizer (--use-distributed-optimizer); ZeRO-2 and ZeRO-3 are
  Megatron-FSDP (--use-megatron-fsdp with --data-parallel-sharding-strategy optim_grads or
  optim_grads_params, which needs --ckpt-format fsdp_dtensor). HSDP's replicas are
  --num-distributed-optimizer-instances.
- Virtual pipeline stages: --num-virtual-stages-per-pipeline-rank. When the layers do not split
  evenly, embedding and loss count as one layer each (Llama 3's split), else an explicit
  --pipeline-model-parallel-layout is written. Stated first/last stage layers are
  --decoder-first/last-pipeline-num-layers where they divide into the chunks, else that layout.
- A stated FP8 recipe is --fp8-recipe (tensorwise or delayed; rowwise has no Megatron flag, nor has
  FSDP's torchao-style FP8 all-gather).
- --expert-tensor-parallel-size is the plan's expert TP: tp unless the plan folds EP over TP
  (MoE parallel folding, expert TP below tp), and --expert-model-parallel-size its EP.
"""

from __future__ import annotations

from collections.abc import Mapping

from meshplan.core.pipeline import stage_layers
from meshplan.exports.common import (
    RENDEZVOUS_ENDPOINT,
    Engine,
    Export,
    UnsupportedByEngine,
    check_experts,
    effective_zero,
    grad_accumulation_steps,
    nodes,
    shell_join,
    shell_script,
)
from meshplan.spec.conditions import EpDispatch, Fp8Recipe, StageSplit
from meshplan.spec.layout import ContextParallel, Layout, Recompute, Schedule, ZeroStage
from meshplan.spec.model import MlpKind, ModelSpec, NormKind
from meshplan.spec.workload import Attention, OptimizerKind, Workload
from meshplan.units import DType

ENGINE_VERSION = "Megatron-LM main d98e8a64ddf34856e74b24714e3bedb2f5a39553 (megatron-core 0.20.0.dev)"
ENGINE = Engine.MEGATRON
SCRIPT = "train_megatron.sh"

Args = list[str]

_FSDP_STRATEGY = {ZeroStage.GRADIENTS: "optim_grads", ZeroStage.PARAMETERS: "optim_grads_params"}


def _flag(name: str, value: object) -> Args:
    return [name, str(value)]


def _pipeline_split(num_layers: int, layout: Layout, split: StageSplit) -> Args:
    """How the layers are cut into pp * vpp stages."""
    stages = layout.pp * layout.vpp
    vpp = _flag("--num-virtual-stages-per-pipeline-rank", layout.vpp) if layout.vpp > 1 else []
    if split.stated:
        return _stated_split(num_layers, layout, split)
    if num_layers % stages == 0:
        return vpp
    if (num_layers + 2) % stages == 0:
        return ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split", *vpp]
    if num_layers < stages:
        raise ValueError(f"num_layers={num_layers} is fewer than the pp * vpp = {stages} pipeline stages")
    base, extra = divmod(num_layers, stages)
    counts = [base] * stages
    for index in [*range(1, stages - 1), 0, stages - 1][:extra]:  # spare layers go to the middle stages first
        counts[index] += 1
    return _layout_string(counts)


def _layout_string(counts: list[int]) -> Args:
    """--pipeline-model-parallel-layout from layers per virtual stage, listed chunk-major (embedding first, loss
    last); a stage with no layer is written empty."""
    parts = [f"t*{count}" if count else "" for count in counts]
    return _flag("--pipeline-model-parallel-layout", "|".join(["E" + parts[0], *parts[1:-1], parts[-1] + "L"]))


def _stated_split(num_layers: int, layout: Layout, split: StageSplit) -> Args:
    """Stated first/last stage layers: Megatron's --decoder-first/last-pipeline-num-layers where every count
    divides into the vpp chunks (its get_num_layers_to_build requires it), else the explicit layout of the stage
    table, each rank's layers spread over its chunks as meshplan bills them (short chunks first on the first
    half of the ranks, last on the others)."""
    rows = [int(stage_layers(num_layers, pp=layout.pp, stage=i, split=split)) for i in range(layout.pp)]
    rest_stages = layout.pp - split.stated
    stated = [v for v in (split.first, split.last) if v is not None]
    rest = num_layers - split.stated_layers
    if all(v % layout.vpp == 0 for v in stated) and rest_stages and rest % (rest_stages * layout.vpp) == 0:
        args = _flag("--decoder-first-pipeline-num-layers", split.first) if split.first is not None else []
        args += _flag("--decoder-last-pipeline-num-layers", split.last) if split.last is not None else []
        return args + (_flag("--num-virtual-stages-per-pipeline-rank", layout.vpp) if layout.vpp > 1 else [])
    chunks = []
    for rank, layers in enumerate(rows):
        base, short = -(-layers // layout.vpp), -(-layers // layout.vpp) * layout.vpp - layers
        shorts = range(short) if rank < layout.pp / 2 else range(layout.vpp - short, layout.vpp)
        chunks.append([base - (c in shorts) for c in range(layout.vpp)])
    return _layout_string([chunks[rank][c] for c in range(layout.vpp) for rank in range(layout.pp)])


def _schedule(layout: Layout) -> None:
    if layout.pp > 1 and layout.schedule not in (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED):
        raise UnsupportedByEngine(
            ENGINE,
            f"run the {layout.schedule.name.lower()} pipeline schedule (it runs 1F1B and interleaved 1F1B)",
            "schedule=1f1b, or interleaved with vpp > 1",
        )


def _parallel_args(model: ModelSpec, layout: Layout, split: StageSplit) -> Args:
    _schedule(layout)
    args = _flag("--tensor-model-parallel-size", layout.tp) + _flag("--pipeline-model-parallel-size", layout.pp)
    args += ["--sequence-parallel"] if layout.sp else []
    args += _pipeline_split(model.num_layers, layout, split) if layout.pp > 1 else []
    if layout.cp > 1:
        kind = "p2p" if layout.cp_kind is ContextParallel.RING else "allgather"
        args += _flag("--context-parallel-size", layout.cp) + _flag("--cp-comm-type", kind)
    if model.moe is not None:
        args += _flag("--expert-model-parallel-size", layout.ep) + _flag("--expert-tensor-parallel-size", layout.etp)
    zero = effective_zero(layout)
    if zero is ZeroStage.OPTIMIZER:
        args += ["--use-distributed-optimizer"]
    elif zero in _FSDP_STRATEGY:
        args += ["--use-megatron-fsdp", *_flag("--data-parallel-sharding-strategy", _FSDP_STRATEGY[zero])]
        args += _flag("--ckpt-format", "fsdp_dtensor")
    if zero is not ZeroStage.NONE:
        args += ["--overlap-grad-reduce", "--overlap-param-gather"]
        if layout.dp_replicate > 1:
            args += _flag("--num-distributed-optimizer-instances", layout.dp_replicate)
    elif layout.dp > 1:
        args += ["--overlap-grad-reduce"]
    return args


def _recompute_args(layout: Layout) -> Args:
    if layout.recompute is Recompute.SELECTIVE:
        return _flag("--recompute-granularity", "selective")
    if layout.recompute is Recompute.FULL:
        # Uniform with one layer per group: each layer keeps only its input.
        return [
            *_flag("--recompute-granularity", "full"),
            *_flag("--recompute-method", "uniform"),
            *_flag("--recompute-num-layers", 1),
        ]
    return []


def _precision_args(workload: Workload) -> Args:
    policy = workload.precision
    compute = {DType.BF16: ["--bf16"], DType.FP16: ["--fp16"], DType.FP8: ["--bf16", "--fp8-format", "hybrid"]}
    if policy.compute not in (*compute, DType.FP32, DType.TF32):
        raise UnsupportedByEngine(ENGINE, f"train with {policy.compute} matmuls", "precision bf16 or fp8")
    args = compute.get(policy.compute, []) + _fp8_recipe_args(workload)
    if policy.compute in (DType.BF16, DType.FP8):
        grads = policy.grads is DType.FP32
        args += ["--accumulate-allreduce-grads-in-fp32"] if grads else _flag("--main-grads-dtype", "bf16")
    if policy.moments is DType.BF16:
        args += ["--use-precision-aware-optimizer", *_flag("--exp-avg-dtype", "bf16")]
        args += _flag("--exp-avg-sq-dtype", "bf16")
    kind = workload.optimizer.kind
    if kind is OptimizerKind.ADAFACTOR:
        raise UnsupportedByEngine(ENGINE, "run Adafactor", "optimizer=adamw (--optimizer adam)")
    args += _flag("--optimizer", "adam" if kind is OptimizerKind.ADAMW else "sgd")
    args += _flag("--sgd-momentum", 0) if kind is OptimizerKind.SGD else []
    # Megatron-Core's AttnBackend: flash (FlashAttention), fused (cuDNN), unfused; FA3 is TE's flash on Hopper
    backends = {
        Attention.EAGER: "unfused",
        Attention.FA1: "flash",
        Attention.FA_TRITON: "flash",
        Attention.FA2: "flash",
        Attention.FA3: "flash",
        Attention.CUDNN: "fused",
    }
    backend = backends.get(workload.attention)
    args += _flag("--attention-backend", backend) if backend is not None else []
    return args


def _fp8_recipe_args(workload: Workload) -> Args:
    """--fp8-recipe for a stated recipe (Megatron's choices: tensorwise, delayed, mxfp8, blockwise)."""
    cond = workload.conditions
    if cond.fp8_all_gather:
        raise UnsupportedByEngine(
            ENGINE,
            "all-gather FSDP's weights in FP8 as torchao does (its --fp8-param-gather also keeps the primary "
            "weights in FP8, which meshplan does not bill)",
            "fp8_all_gather off",
        )
    if cond.fp8_recipe is None:
        return []
    if cond.fp8_recipe is Fp8Recipe.ROWWISE:
        raise UnsupportedByEngine(ENGINE, "scale FP8 row by row", "fp8_recipe tensorwise or delayed")
    return _flag("--fp8-recipe", cond.fp8_recipe.value)


def _attention_args(model: ModelSpec) -> Args:
    args = _flag("--num-attention-heads", model.num_heads) + _flag("--kv-channels", model.head_dim)
    if model.num_kv_heads != model.num_heads:
        args += ["--group-query-attention", *_flag("--num-query-groups", model.num_kv_heads)]
    if model.mla is not None:
        mla = model.mla
        args += ["--multi-latent-attention", *_flag("--kv-lora-rank", mla.kv_lora_rank)]
        args += _flag("--qk-head-dim", mla.qk_nope_head_dim) + _flag("--qk-pos-emb-head-dim", mla.qk_rope_head_dim)
        args += _flag("--v-head-dim", mla.v_head_dim)
        args += _flag("--q-lora-rank", mla.q_lora_rank) if mla.q_lora_rank else []
    args += ["--qk-layernorm"] if model.qk_norm else []
    if not (model.qkv_bias or model.out_bias or model.mlp_bias):
        args += ["--disable-bias-linear"]
    elif not (model.out_bias and model.mlp_bias):
        args += ["--disable-bias-linear", *(["--add-qkv-bias"] if model.qkv_bias else [])]
    return args


def _moe_args(model: ModelSpec, workload: Workload) -> Args:
    moe = model.moe
    if moe is None:
        return []
    args = _flag("--num-experts", moe.num_experts) + _flag("--moe-router-topk", moe.experts_per_token)
    args += _flag("--moe-ffn-hidden-size", moe.expert_ffn_hidden)
    if moe.num_shared_experts:
        args += _flag("--moe-shared-expert-intermediate-size", moe.num_shared_experts * moe.shared_hidden)
        args += ["--moe-shared-expert-gate"] if moe.shared_expert_gate else []
    if moe.num_dense_layers:
        dense, sparse = moe.num_dense_layers, model.num_layers - moe.num_dense_layers
        args += _flag("--moe-layer-freq", f"([0]*{dense}+[1]*{sparse})")
    args += ["--moe-router-enable-expert-bias"] if moe.router_bias else []
    # DeepEP: the flex dispatcher, whose backend (--moe-flex-dispatcher-backend) defaults to deepep
    dispatcher = "flex" if workload.conditions.ep_dispatch is EpDispatch.DEEPEP else "alltoall"
    return [*args, "--moe-grouped-gemm", *_flag("--moe-token-dispatcher-type", dispatcher)]


def _model_args(model: ModelSpec, workload: Workload) -> Args:
    args = _flag("--num-layers", model.num_layers) + _flag("--hidden-size", model.hidden)
    args += _flag("--ffn-hidden-size", model.ffn_hidden) + _attention_args(model)
    args += ["--swiglu"] if model.mlp is MlpKind.GATED else []
    args += _flag("--normalization", "RMSNorm" if model.norm is NormKind.RMSNORM else "LayerNorm")
    args += [] if model.tied_embeddings else ["--untie-embeddings-and-output-weights"]
    if model.learned_positions:
        args += _flag("--position-embedding-type", "learned_absolute")
        args += _flag("--max-position-embeddings", model.learned_positions)
    else:
        args += _flag("--position-embedding-type", "rope")
        args += _flag("--max-position-embeddings", max(workload.seq_len, model.max_seq_len))
    if not model.dropout:
        args += _flag("--attention-dropout", 0.0) + _flag("--hidden-dropout", 0.0)
    args += _flag("--mtp-num-layers", model.mtp_layers) if model.mtp_layers else []
    return args + _moe_args(model, workload)


def megatron_args(model: ModelSpec, layout: Layout, workload: Workload, *, model_path: str | None = None) -> list[str]:
    """The `pretrain_gpt.py` arguments of a plan (without the launcher)."""
    check_experts(ENGINE, model, layout)
    grad_accumulation_steps(layout, workload)
    args = _parallel_args(model, layout, workload.conditions.stage_split)
    args += _flag("--micro-batch-size", layout.micro_batch) + _flag("--global-batch-size", workload.global_batch)
    args += _flag("--seq-length", workload.seq_len)
    if workload.conditions.doc_tokens is not None:  # packed documents attend within themselves
        args += ["--reset-position-ids", "--reset-attention-mask"]
    args += _recompute_args(layout) + _precision_args(workload) + _model_args(model, workload)
    if model_path:
        return args + _flag("--tokenizer-type", "HuggingFaceTokenizer") + _flag("--tokenizer-model", model_path)
    return args + _flag("--tokenizer-type", "NullTokenizer") + _flag("--vocab-size", model.vocab_size)


def export_megatron(
    model: ModelSpec,
    layout: Layout,
    workload: Workload,
    *,
    model_path: str | None = None,
    predicted: Mapping[str, float] | None = None,
    gpus_per_node: int = 8,
) -> Export:
    """A torchrun launcher of Megatron-LM's pretrain_gpt.py for the plan."""
    args = megatron_args(model, layout, workload, model_path=model_path)
    num_nodes, per_node = nodes(layout.num_gpus, gpus_per_node)
    launcher = ["torchrun", *_flag("--nnodes", num_nodes), *_flag("--nproc-per-node", per_node)]
    if num_nodes > 1:
        launcher += ["--rdzv-backend", "c10d", "--rdzv-endpoint", RENDEZVOUS_ENDPOINT]
    tokens = [*launcher, "pretrain_gpt.py", *args]
    fsdp = effective_zero(layout) in _FSDP_STRATEGY
    # TP/SP/CP overlap wants one CUDA connection on Hopper; Megatron-FSDP refuses exactly that.
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if (layout.tp > 1 or layout.cp > 1) and not fsdp else {}
    title = f"{ENGINE_VERSION}: launcher from meshplan for {model.name} on {layout.num_gpus} GPUs"
    notes = ["run from the Megatron-LM checkout; add --data-path (or --mock-data) and --save/--load for checkpoints"]
    biases = (model.qkv_bias, model.out_bias, model.mlp_bias)
    if biases not in ((False, False, False), (True, False, False), (True, True, True)):
        notes.append("megatron switches linear biases all at once (--disable-bias-linear, --add-qkv-bias): check them")
    if model.sliding_window:
        notes.append("sliding-window layers are not exported: add --window-size for them by hand")
    if num_nodes > 1:
        notes.append(f"run the script on each of the {num_nodes} nodes with MASTER_ADDR/MASTER_PORT set")
    return Export(
        engine=ENGINE,
        engine_version=ENGINE_VERSION,
        files={SCRIPT: shell_script(title=title, predicted=predicted, env=env, tokens=tokens)},
        command=shell_join(tokens),
        notes=tuple(notes),
    )
