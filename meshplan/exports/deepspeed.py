"""DeepSpeed export: a JSON config (ZeRO, batch, precision, AutoTP, AutoEP) and its launcher line.

Target: DeepSpeed 0.19.8 (the registry's release); keys as read by deepspeed/runtime/config.py,
runtime/zero/config.py, runtime/tensor_parallel/config.py and module_inject/auto_ep_config.py.
DeepSpeed's own check is train_batch_size = micro batch x gradient accumulation x data-parallel size.

What stays out: pipeline stages are fixed in code (deepspeed.pipe.PipelineModule), not in the
config; ZeRO shards over the whole data-parallel group (MiCS, the sub-group sharding, was removed
in 0.19), so HSDP has no equivalent; DeepSpeed-Ulysses is all-to-all sequence parallelism, not
the ring / all-gather context parallelism meshplan models; its checkpointing API recomputes
whole blocks, so selective recomputation has no equivalent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from meshplan.exports.common import (
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
from meshplan.spec.layout import Layout, Recompute, ZeroStage
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload
from meshplan.units import DType

ENGINE_VERSION = "0.19.8"
ENGINE = Engine.DEEPSPEED
CONFIG_FILE = "ds_config.json"
SCRIPT = "train_deepspeed.sh"
Json = dict[str, object]


def _check(model: ModelSpec, layout: Layout, workload: Workload) -> None:
    check_experts(ENGINE, model, layout, workload)
    if layout.pp > 1:
        raise UnsupportedByEngine(
            ENGINE,
            f"set pp={layout.pp} from its config (stages are built in code by deepspeed.pipe.PipelineModule)",
            "pp=1",
        )
    if layout.cp > 1:
        raise UnsupportedByEngine(ENGINE, "run ring or all-gather context parallelism", "cp=1")
    if layout.sp:
        raise UnsupportedByEngine(ENGINE, "split activations along the sequence inside AutoTP", "sp=False")
    if layout.dp_replicate > 1 and effective_zero(layout) is not ZeroStage.NONE:
        raise UnsupportedByEngine(
            ENGINE,
            f"shard over dp_shard={layout.dp_shard} and replicate over dp_replicate={layout.dp_replicate} (HSDP)",
            f"dp_shard={layout.dp}, dp_replicate=1",
        )
    if layout.recompute is Recompute.SELECTIVE:
        raise UnsupportedByEngine(ENGINE, "recompute only the attention core (selective)", "recompute=full")
    if workload.precision.compute not in (DType.BF16, DType.FP16, DType.FP32, DType.TF32):
        raise UnsupportedByEngine(ENGINE, f"run {workload.precision.compute} matmuls from its config", "precision bf16")


def _zero_section(model: ModelSpec, layout: Layout) -> Json:
    stage = effective_zero(layout)
    if stage is ZeroStage.NONE:
        return {"stage": 0}
    if stage is not ZeroStage.PARAMETERS:
        # DeepSpeed's documented defaults for stages 1 and 2 (5e8 elements per bucket).
        return {
            "stage": int(stage),
            "overlap_comm": True,
            "contiguous_gradients": True,
            "reduce_bucket_size": 500_000_000,
            "allgather_bucket_size": 500_000_000,
        }
    h = model.hidden
    # Sizes scaled by the hidden size, the rule of the Hugging Face DeepSpeed integration's "auto" values.
    return {
        "stage": 3,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": h * h,
        "stage3_prefetch_bucket_size": int(0.9 * h * h),
        "stage3_param_persistence_threshold": 10 * h,
        "stage3_gather_16bit_weights_on_model_save": True,
    }


def _precision_section(workload: Workload) -> Json:
    policy = workload.precision
    if policy.compute is DType.BF16:
        section: Json = {"bf16": {"enabled": True}}
    elif policy.compute is DType.FP16:
        section = {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}}
    else:
        return {}
    if policy.grads is DType.FP32:
        section["data_types"] = {"grad_accum_dtype": "fp32"}
    return section


def deepspeed_config(model: ModelSpec, layout: Layout, workload: Workload) -> Json:
    """The DeepSpeed JSON config of a plan, as a dict."""
    _check(model, layout, workload)
    config: Json = {
        "train_batch_size": workload.global_batch,
        "train_micro_batch_size_per_gpu": layout.micro_batch,
        "gradient_accumulation_steps": grad_accumulation_steps(layout, workload),
        "gradient_clipping": 1.0,
        **_precision_section(workload),
        "zero_optimization": _zero_section(model, layout),
    }
    if layout.tp > 1:
        config["tensor_parallel"] = {"autotp_size": layout.tp}
    if layout.ep > 1:
        config["expert_parallel"] = {"enabled": True, "autoep_size": layout.ep}
    if layout.recompute is Recompute.FULL:
        config["activation_checkpointing"] = {
            "partition_activations": False,
            "contiguous_memory_optimization": False,
            "number_checkpoints": model.num_layers,
            "cpu_checkpointing": False,
        }
    return config


def export_deepspeed(
    model: ModelSpec,
    layout: Layout,
    workload: Workload,
    *,
    model_path: str | None = None,
    predicted: Mapping[str, float] | None = None,
    gpus_per_node: int = 8,
) -> Export:
    """The DeepSpeed config and a `deepspeed` launcher line for a training script of the user's."""
    config = deepspeed_config(model, layout, workload)
    num_nodes, per_node = nodes(layout.num_gpus, gpus_per_node)
    tokens = ["deepspeed", "--num_nodes", str(num_nodes), "--num_gpus", str(per_node)]
    tokens += ["--hostfile", "hostfile"] if num_nodes > 1 else []
    tokens += ["train.py", "--deepspeed", "--deepspeed_config", CONFIG_FILE]
    tokens += ["--model_name_or_path", model_path] if model_path else []
    title = f"DeepSpeed {ENGINE_VERSION} launcher from meshplan: {model.name} on {layout.num_gpus} GPUs"
    notes = ["train.py is your script: it calls deepspeed.add_config_arguments and deepspeed.initialize"]
    if layout.recompute is Recompute.FULL:
        notes.append(
            "checkpoint every layer in the model code (deepspeed.checkpointing.checkpoint or "
            "gradient_checkpointing_enable()); the config section only tunes it"
        )
    if effective_zero(layout) is ZeroStage.PARAMETERS:
        notes.append("build the model under deepspeed.zero.Init so ZeRO-3 never holds it whole")
    if num_nodes > 1:
        notes.append(f"list the {num_nodes} nodes with slots={per_node} in ./hostfile")
    return Export(
        engine=ENGINE,
        engine_version=ENGINE_VERSION,
        files={
            CONFIG_FILE: json.dumps(config, indent=2) + "\n",
            SCRIPT: shell_script(title=title, predicted=predicted, env={}, tokens=tokens),
        },
        command=shell_join(tokens),
        notes=tuple(notes),
    )
