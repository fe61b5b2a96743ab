"""Plans and independent readers for the export tests.

The readers parse each export the simple way a person would (shlex, ast, json) and rebuild the
plan's degrees, batch and recompute from it, without the export code's own tables.
"""

from __future__ import annotations

import ast
import json
import math
import shlex
from dataclasses import dataclass

from meshplan.exports import Export
from meshplan.spec.layout import ContextParallel, Layout, Recompute, Schedule, ZeroStage
from meshplan.spec.model import MLASpec, MlpKind, ModelSpec, MoESpec, NormKind
from meshplan.spec.workload import PRECISIONS, Attention, Optimizer, OptimizerKind, Workload

LLAMA_405B = ModelSpec(
    name="llama-3.1-405b",
    num_layers=126,
    hidden=16384,
    num_heads=128,
    num_kv_heads=8,
    head_dim=128,
    ffn_hidden=53248,
    vocab_size=128256,
    max_seq_len=131072,
)
LLAMA_70B = ModelSpec(
    name="llama-3.3-70b",
    num_layers=80,
    hidden=8192,
    num_heads=64,
    num_kv_heads=8,
    head_dim=128,
    ffn_hidden=28672,
    vocab_size=128256,
    max_seq_len=131072,
)
LLAMA_8B = ModelSpec(
    name="llama-3.1-8b",
    num_layers=32,
    hidden=4096,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    ffn_hidden=14336,
    vocab_size=128256,
    max_seq_len=131072,
)
LLAMA2_7B = ModelSpec(
    name="llama-2-7b",
    num_layers=32,
    hidden=4096,
    num_heads=32,
    num_kv_heads=32,
    head_dim=128,
    ffn_hidden=11008,
    vocab_size=32000,
    max_seq_len=4096,
)
QWEN3_30B_A3B = ModelSpec(
    name="qwen3-30b-a3b",
    num_layers=48,
    hidden=2048,
    num_heads=32,
    num_kv_heads=4,
    head_dim=128,
    ffn_hidden=6144,
    vocab_size=151936,
    qk_norm=True,
    max_seq_len=40960,
    moe=MoESpec(num_experts=128, experts_per_token=8, expert_ffn_hidden=768),
)

DEEPSEEK_V3 = ModelSpec(
    name="deepseek-v3",
    num_layers=61,
    hidden=7168,
    num_heads=128,
    num_kv_heads=128,
    head_dim=128,
    ffn_hidden=18432,
    vocab_size=129280,
    mtp_layers=1,
    moe=MoESpec(
        num_experts=256,
        experts_per_token=8,
        expert_ffn_hidden=2048,
        num_shared_experts=1,
        num_dense_layers=3,
        router_bias=True,
    ),
    mla=MLASpec(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, q_lora_rank=1536),
)
GPT3_XL = ModelSpec(
    name="gpt3-xl",
    num_layers=24,
    hidden=2048,
    num_heads=16,
    num_kv_heads=16,
    head_dim=128,
    ffn_hidden=8192,
    vocab_size=50257,
    mlp=MlpKind.PLAIN,
    norm=NormKind.LAYERNORM,
    tied_embeddings=True,
    learned_positions=2048,
    qkv_bias=True,
    out_bias=True,
    mlp_bias=True,
    dropout=True,
)
QWEN2_MOE = ModelSpec(
    name="qwen2-57b-a14b-like",
    num_layers=24,
    hidden=2048,
    num_heads=16,
    num_kv_heads=16,
    head_dim=128,
    ffn_hidden=5632,
    vocab_size=151936,
    qkv_bias=True,
    moe=MoESpec(
        num_experts=60, experts_per_token=4, expert_ffn_hidden=1408, num_shared_experts=4, shared_expert_gate=True
    ),
)

FEATURE_CASES: list[tuple[str, ModelSpec, Layout, Workload]] = [
    (
        "mla-moe-mtp-bf16-moments",
        DEEPSEEK_V3,
        Layout(tp=8, pp=8, dp_shard=16, ep=16, zero=ZeroStage.OPTIMIZER, sp=True),
        Workload(seq_len=4096, global_batch=1024, precision=PRECISIONS["deepseek-fp8"]),
    ),
    (
        "learned-positions-fp16-sgd-eager",
        GPT3_XL,
        Layout(tp=2, dp_replicate=4),
        Workload(
            seq_len=2048,
            global_batch=64,
            precision=PRECISIONS["fp16"],
            attention=Attention.EAGER,
            optimizer=Optimizer(kind=OptimizerKind.SGD),
        ),
    ),
    (
        "shared-experts-fsdp-hsdp",
        QWEN2_MOE,
        Layout(dp_shard=4, ep=4, zero=ZeroStage.GRADIENTS, dp_replicate=2),
        Workload(seq_len=4096, global_batch=64, optimizer=Optimizer(kind=OptimizerKind.SGD_MOMENTUM)),
    ),
    (
        "ring-cp-fp8-selective",
        LLAMA_8B,
        Layout(cp=2, dp_shard=2, zero=ZeroStage.PARAMETERS, recompute=Recompute.SELECTIVE),
        Workload(seq_len=8192, global_batch=8, precision=PRECISIONS["fp8"]),
    ),
    (
        "allgather-cp-uneven-pp-fp32",
        LLAMA_8B,
        Layout(cp=2, cp_kind=ContextParallel.ALL_GATHER, tp=2, pp=3, dp_replicate=2, recompute=Recompute.FULL),
        Workload(seq_len=8192, global_batch=8, precision=PRECISIONS["fp32"]),
    ),
    (
        "interleaved-ddp",
        QWEN3_30B_A3B,
        Layout(pp=4, vpp=2, schedule=Schedule.INTERLEAVED, dp_replicate=2),
        Workload(seq_len=8192, global_batch=8),
    ),
]
"""Megatron plans that between them use every model, precision and parallel flag the export can write."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadBack:
    """What a reader recovers from an export."""

    tp: int
    pp: int
    vpp: int
    cp: int
    ep: int
    dp_shard: int
    dp_replicate: int
    zero: ZeroStage
    recompute: Recompute
    micro_batch: int
    global_batch: int
    seq_len: int


def flags(tokens: list[str]) -> dict[str, str | bool]:
    """--flag value pairs (a flag with no value is True); tokens before the first flag are ignored."""
    out: dict[str, str | bool] = {}
    key = None
    for token in tokens:
        if token.startswith("--"):
            key = token
            out[key] = True
        elif key is not None and out[key] is True:
            out[key] = token
    return out


def script_tokens(export: Export, program: str) -> list[str]:
    """The arguments after `program` in the export's command line."""
    tokens = shlex.split(export.command)
    return tokens[tokens.index(program) + 1 :]


def launcher_gpus(export: Export, nodes_flag: str, per_node_flag: str) -> int:
    args = flags(shlex.split(export.command))
    return int(args[nodes_flag]) * int(args[per_node_flag])


def read_megatron(export: Export) -> ReadBack:
    args = flags(script_tokens(export, "pretrain_gpt.py"))
    tp, pp = int(args["--tensor-model-parallel-size"]), int(args["--pipeline-model-parallel-size"])
    cp = int(args.get("--context-parallel-size", 1))
    vpp = int(args.get("--num-virtual-stages-per-pipeline-rank", 1))
    if "--pipeline-model-parallel-layout" in args:
        vpp = (str(args["--pipeline-model-parallel-layout"]).count("|") + 1) // pp
    dp = launcher_gpus(export, "--nnodes", "--nproc-per-node") // (tp * pp * cp)
    zero = ZeroStage.OPTIMIZER if "--use-distributed-optimizer" in args else ZeroStage.NONE
    strategy = args.get("--data-parallel-sharding-strategy")
    zero = {"optim_grads": ZeroStage.GRADIENTS, "optim_grads_params": ZeroStage.PARAMETERS}.get(str(strategy), zero)
    replicas = int(args.get("--num-distributed-optimizer-instances", 1 if zero else dp))
    granularity = args.get("--recompute-granularity")
    return ReadBack(
        tp=tp,
        pp=pp,
        vpp=vpp,
        cp=cp,
        ep=int(args.get("--expert-model-parallel-size", 1)),
        dp_shard=dp // replicas,
        dp_replicate=replicas,
        zero=zero,
        recompute={"full": Recompute.FULL, "selective": Recompute.SELECTIVE}.get(str(granularity), Recompute.NONE),
        micro_batch=int(args["--micro-batch-size"]),
        global_batch=int(args["--global-batch-size"]),
        seq_len=int(args["--seq-length"]),
    )


def torchtitan_assignments(source: str) -> dict[str, object]:
    """`config.a.b = literal` assignments of the config function, by dotted name."""
    values: dict[str, object] = {}
    function = next(node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef))
    for node in function.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute):
            name = ast.unparse(node.targets[0]).removeprefix("config.")
            try:
                values[name] = ast.literal_eval(node.value)
            except ValueError:
                values[name] = ast.unparse(node.value)
    return values


def read_torchtitan(export: Export, model: ModelSpec) -> ReadBack:
    values = torchtitan_assignments(export.files["meshplan_torchtitan.py"])

    def get(name: str, default: object) -> int:
        value = values.get(name, default)
        assert isinstance(value, int)
        return value

    pp = get("parallelism.pipeline_parallel_degree", 1)
    vpp = 1
    if pp > 1:
        extra = get("parallelism.pipeline_parallel_first_stage_less_layers", 1)
        stages = math.ceil((model.num_layers + 2 * extra) / get("parallelism.pipeline_parallel_layers_per_stage", 0))
        vpp = stages // pp
    dp_shard = get("parallelism.data_parallel_shard_degree", 1)
    reshard = values.get("parallelism.fsdp_reshard_after_forward")
    zero = {"never": ZeroStage.GRADIENTS, "always": ZeroStage.PARAMETERS}.get(str(reshard), ZeroStage.NONE)
    policy = str(values["activation_checkpoint"])
    local = get("training.local_batch_size", 0)
    return ReadBack(
        tp=get("parallelism.tensor_parallel_degree", 1),
        pp=pp,
        vpp=vpp,
        cp=get("parallelism.context_parallel_degree", 1),
        ep=get("parallelism.expert_parallel_degree", 1),
        dp_shard=dp_shard,
        dp_replicate=get("parallelism.data_parallel_replicate_degree", 1),
        zero=zero,
        recompute=Recompute.FULL
        if "FullAC" in policy
        else Recompute.SELECTIVE
        if "Selective" in policy
        else Recompute.NONE,
        micro_batch=get("parallelism.pipeline_parallel_microbatch_size", 1) if pp > 1 else local,
        global_batch=get("training.global_batch_size", 0),
        seq_len=get("training.seq_len", 0),
    )


def read_deepspeed(export: Export, *, seq_len: int) -> ReadBack:
    config = json.loads(export.files["ds_config.json"])
    micro, steps = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
    dp = config["train_batch_size"] // (micro * steps)
    tp = config.get("tensor_parallel", {}).get("autotp_size", 1)
    assert launcher_gpus(export, "--num_nodes", "--num_gpus") == dp * tp
    stage = ZeroStage(config["zero_optimization"]["stage"])
    return ReadBack(
        tp=tp,
        pp=1,
        vpp=1,
        cp=1,
        ep=config.get("expert_parallel", {}).get("autoep_size", 1),
        dp_shard=dp if stage else 1,
        dp_replicate=1 if stage else dp,
        zero=stage,
        recompute=Recompute.FULL if "activation_checkpointing" in config else Recompute.NONE,
        micro_batch=micro,
        global_batch=config["train_batch_size"],
        seq_len=seq_len,
    )
