"""Hugging Face accelerate: the YAML ``accelerate config`` writes (FSDP, DeepSpeed or plain DDP), with the
model named beside it.

Keys as accelerate's ClusterConfig and FullyShardedDataParallelPlugin read them (accelerate 1.x):
``num_processes`` is the GPU count; FSDP's ``fsdp_sharding_strategy`` (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD,
HYBRID_SHARD) or FSDP2's ``fsdp_reshard_after_forward`` the ZeRO stage; ``fsdp_version`` 1 is FSDP1's flat
parameters (no copy-out), 2 is FSDP2; ``fsdp_activation_checkpointing`` recomputes whole blocks.
"""

from __future__ import annotations

from typing import Any

from meshplan.configs.reading import NO_EFFECT, UNKNOWN, ConfigRead, Reading, integer
from meshplan.configs.yamlish import parse_yaml

TOP = {
    "compute_environment",
    "debug",
    "distributed_type",
    "downcast_bf16",
    "enable_cpu_affinity",
    "gpu_ids",
    "machine_rank",
    "main_process_ip",
    "main_process_port",
    "main_training_function",
    "mixed_precision",
    "num_machines",
    "num_processes",
    "rdzv_backend",
    "same_network",
    "tpu_env",
    "tpu_use_cluster",
    "tpu_use_sudo",
    "use_cpu",
    "fsdp_config",
    "deepspeed_config",
    "dynamo_config",
    "megatron_lm_config",
    "parallelism_config",
}
SHARDING = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2, "NO_SHARD": 0, "HYBRID_SHARD": 3, "HYBRID_SHARD_ZERO2": 2}
SHARDING |= {"1": 3, "2": 2, "3": 0, "4": 3, "5": 2}  # the enum's numbers, as older files write them
FSDP_EFFECTS = {
    "fsdp_offload_params": "parameters, gradients and optimizer state in host memory: not modelled",
    "fsdp_cpu_ram_efficient_loading": "how the checkpoint is loaded: not billed",
    "fsdp_sync_module_states": "start-up broadcast only",
    "fsdp_state_dict_type": "checkpoint format only",
    "fsdp_backward_prefetch": "which all-gather the backward issues early: overlap detail, not modelled",
    "fsdp_forward_prefetch": "which all-gather the forward issues early: overlap detail, not modelled",
    "fsdp_use_orig_params": "FSDP1 bookkeeping: not billed",
    "fsdp_transformer_layer_cls_to_wrap": "the class of the wrapped layers",
    "fsdp_min_num_params": "size-based wrapping: units of that many parameters (billed as layers)",
}


def read_accelerate(text: str, label: str) -> ConfigRead:
    data = parse_yaml(text, label)
    if not isinstance(data, dict):
        raise ValueError(f"{label} must hold a YAML mapping (an accelerate config)")
    for key in data:
        if key not in TOP:
            raise ValueError(
                f"{label}: {str(key)[:60]!r} is not a key of accelerate's config (known: {', '.join(sorted(TOP))})"
            )
    r = Reading("accelerate", label)
    kind = str(data.get("distributed_type", "NO")).upper()
    if "num_processes" in data:
        r.take("gpus", data["num_processes"], "num_processes")
    precision = _mixed_precision(r, data.get("mixed_precision"))
    if kind == "FSDP":
        _fsdp(r, data.get("fsdp_config") or {})
    elif kind == "DEEPSPEED":
        _deepspeed(r, data.get("deepspeed_config") or {})
    elif kind in ("MULTI_GPU", "NO"):
        r.take("stack", "fsdp2", f"distributed_type = {kind} (PyTorch DDP: the fsdp2 stack, no sharding)")
        r.take("zero", 0, f"distributed_type = {kind}")
        r.take("fsdp_copies", "off", f"distributed_type = {kind}")
    else:
        raise ValueError(
            f"{label}: distributed_type {kind[:40]!r} is not one meshplan reads (FSDP, DEEPSPEED, MULTI_GPU)"
        )
    if precision is not None:
        autocast = "fsdp2-bf16" if precision == "bf16" and kind != "DEEPSPEED" else precision
        r.take("precision", autocast, "mixed_precision (autocast over fp32 weights and gradients)")
    read = {"distributed_type", "num_processes", "mixed_precision", "fsdp_config", "deepspeed_config"}
    for key, value in data.items():
        if key in read:
            continue
        if key == "dynamo_config" and isinstance(value, dict) and value.get("dynamo_backend"):
            r.take("kernels", "eager" if str(value["dynamo_backend"]).upper() == "NO" else "fused", "dynamo_config")
            continue
        r.skip(key, value, NO_EFFECT if key not in ("megatron_lm_config", "parallelism_config") else UNKNOWN)
    return r.done()


def _mixed_precision(r: Reading, value: Any) -> str | None:
    if value is None:
        return None
    names = {"bf16": "bf16", "fp16": "fp16", "no": "fp32", "fp8": "fp8"}
    text = str(value).lower()
    if text not in names:
        raise ValueError(f"{r.label}: mixed_precision {text[:40]!r} is not bf16, fp16, fp8 or no")
    return names[text]


def _fsdp(r: Reading, cfg: dict[str, Any]) -> None:
    if not isinstance(cfg, dict):
        raise ValueError(f"{r.label}: fsdp_config must be a mapping")
    version = integer(cfg.get("fsdp_version", 1), "fsdp_config.fsdp_version", r.label, low=1, high=2)
    r.take("stack", "fsdp2", f"distributed_type = FSDP, fsdp_version = {cfg.get('fsdp_version', '1 (absent)')}")
    r.take("fsdp_copies", "on" if version == 2 else "off", "fsdp_version")
    if "fsdp_reshard_after_forward" in cfg and version == 2:
        r.take("zero", 3 if cfg["fsdp_reshard_after_forward"] else 2, "fsdp_config.fsdp_reshard_after_forward")
    else:
        strategy = str(cfg.get("fsdp_sharding_strategy", cfg.get("fsdp_reshard_after_forward", "FULL_SHARD")))
        strategy = {"True": "FULL_SHARD", "False": "SHARD_GRAD_OP"}.get(strategy, strategy).upper()
        if strategy not in SHARDING:
            raise ValueError(f"{r.label}: fsdp_sharding_strategy {strategy[:40]!r} is not one of FSDP's")
        r.take("zero", SHARDING[strategy], "fsdp_config.fsdp_sharding_strategy")
        if strategy in ("HYBRID_SHARD", "HYBRID_SHARD_ZERO2", "4", "5"):
            r.notes.append("hybrid sharding shards within a node and replicates across nodes: give --dp-shard")
    if "fsdp_activation_checkpointing" in cfg:
        on = bool(cfg["fsdp_activation_checkpointing"])
        r.take("recompute", "full" if on else "none", "fsdp_config.fsdp_activation_checkpointing")
    policy = str(cfg.get("fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP")).upper()
    if policy == "TRANSFORMER_BASED_WRAP":
        r.take("zero3_unit", "layer", "fsdp_config.fsdp_auto_wrap_policy")
    read = {"fsdp_version", "fsdp_reshard_after_forward", "fsdp_sharding_strategy", "fsdp_activation_checkpointing"}
    for key, value in cfg.items():
        if key in read or (key == "fsdp_auto_wrap_policy" and policy == "TRANSFORMER_BASED_WRAP"):
            continue
        r.skip(f"fsdp_config.{key}", value, FSDP_EFFECTS.get(key, UNKNOWN))


def _deepspeed(r: Reading, cfg: dict[str, Any]) -> None:
    if not isinstance(cfg, dict):
        raise ValueError(f"{r.label}: deepspeed_config must be a mapping")
    r.take("stack", "deepspeed", "distributed_type = DEEPSPEED")
    if "zero_stage" in cfg:
        r.take("zero", cfg["zero_stage"], "deepspeed_config.zero_stage")
    for key, value in cfg.items():
        if key == "zero_stage":
            continue
        effect = "host or NVMe offload: not modelled" if "offload" in key else UNKNOWN
        if key in ("gradient_accumulation_steps", "gradient_clipping", "zero3_save_16bit_model"):
            effect = NO_EFFECT
        r.skip(f"deepspeed_config.{key}", value, effect)
