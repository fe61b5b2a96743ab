"""Independent readers for the export tests.

They parse each export the simple way a person would (shlex, ast, json) and rebuild the plan's
degrees, batch and recompute from it, without the export code's own tables.
"""

from __future__ import annotations

import ast
import json
import math
import shlex
from dataclasses import dataclass

from meshplan.exports import Export
from meshplan.spec.layout import Recompute, ZeroStage
from meshplan.spec.model import ModelSpec


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
