"""DeepSpeed: a ``ds_config.json`` (with the model named beside it: a Hugging Face ``config.json`` or a catalog
name, since DeepSpeed's config holds no model).

Keys as deepspeed/runtime/config.py and runtime/zero/config.py read them (DeepSpeed 0.19.8, the version
exports/deepspeed.py writes for). DeepSpeed's own identity gives the data-parallel size:
train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel ranks, and
AutoTP's ranks multiply it into the GPU count. An ``"auto"`` value (the Hugging Face Trainer fills it at run
time) is listed as not read.
"""

from __future__ import annotations

from typing import Any

from meshplan.configs.reading import NO_EFFECT, UNKNOWN, ConfigRead, Reading, integer
from meshplan.files import parse_json

BUCKETS = "bucket sizes: the transient communication buffers and how they overlap (meshplan bills whole layers)"
EFFECTS = {
    "zero_optimization.offload_optimizer": "optimizer state (and its step) in host or NVMe memory: its bytes "
    "leave the GPU bill; not modelled",
    "zero_optimization.offload_param": "parameters in host or NVMe memory between uses: not modelled",
    "zero_optimization.contiguous_gradients": "gradients copied into one buffer as they are produced: "
    "fragmentation only",
    "zero_optimization.reduce_bucket_size": BUCKETS,
    "zero_optimization.allgather_bucket_size": BUCKETS,
    "zero_optimization.stage3_prefetch_bucket_size": BUCKETS,
    "zero_optimization.stage3_param_persistence_threshold": "small parameters kept whole under ZeRO-3: a few MB",
    "zero_optimization.stage3_max_live_parameters": BUCKETS,
    "zero_optimization.stage3_max_reuse_distance": BUCKETS,
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": "checkpoint saving only",
    "zero_optimization.round_robin_gradients": NO_EFFECT,
    "zero_optimization.sub_group_size": BUCKETS,
    "activation_checkpointing.partition_activations": "checkpointed activations split over the TP ranks: less "
    "memory, not modelled",
    "activation_checkpointing.cpu_checkpointing": "checkpointed activations in host memory: not modelled",
    "activation_checkpointing.contiguous_memory_optimization": "fragmentation only",
    "activation_checkpointing.number_checkpoints": "how many checkpoints the contiguous buffer holds",
    "activation_checkpointing.synchronize_checkpoint_boundary": NO_EFFECT,
    "activation_checkpointing.profile": NO_EFFECT,
    "fp16.loss_scale": NO_EFFECT,
    "fp16.initial_scale_power": NO_EFFECT,
    "fp16.loss_scale_window": NO_EFFECT,
    "fp16.hysteresis": NO_EFFECT,
    "fp16.min_loss_scale": NO_EFFECT,
    "gradient_clipping": NO_EFFECT,
    "steps_per_print": NO_EFFECT,
    "wall_clock_breakdown": NO_EFFECT,
    "zero_allow_untested_optimizer": NO_EFFECT,
    "scheduler": NO_EFFECT,
    "optimizer.params": NO_EFFECT,
    "tensorboard": NO_EFFECT,
    "wandb": NO_EFFECT,
    "csv_monitor": NO_EFFECT,
    "flops_profiler": NO_EFFECT,
    "comms_logger": NO_EFFECT,
    "checkpoint": NO_EFFECT,
    "seed": NO_EFFECT,
    "prescale_gradients": NO_EFFECT,
    "gradient_predivide_factor": NO_EFFECT,
    "dump_state": NO_EFFECT,
}
"""Keys (or whole sections) not read, and what each would change."""


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and name not in EFFECTS:
            out |= _flatten(value, name + ".")
        else:
            out[name] = value
    return out


def _gradient_reduce(r: Reading, get: Any, stage: Any) -> None:
    """How ZeRO-1/2 reduce the gradients (runtime/zero/stage_1_and_2.py average_tensor): ``reduce_scatter`` false
    all-reduces each bucket whole; true with ``use_multi_rank_bucket_allreduce`` (both DeepSpeed's defaults)
    all-reduces buckets of several ranks' slices; true without it reduces to each rank in turn."""
    scatter, multi = get("zero_optimization.reduce_scatter"), get("zero_optimization.use_multi_rank_bucket_allreduce")
    if stage not in (1, 2) or (scatter is None and multi is None):
        return
    if scatter is False:
        r.take("zero_grad_reduce", "all-reduce", "zero_optimization.reduce_scatter = false")
    elif multi is False:
        r.take("zero_grad_reduce", "reduce", "zero_optimization.use_multi_rank_bucket_allreduce = false")
    else:
        r.take("zero_grad_reduce", "all-reduce", "zero_optimization.use_multi_rank_bucket_allreduce (default true)")


def read_deepspeed(text: str, label: str) -> ConfigRead:
    data = parse_json(text, label, unique_keys=True)
    if not isinstance(data, dict):
        raise ValueError(f"{label} must hold a JSON object (a DeepSpeed config), got {type(data).__name__}")
    flat = _flatten(data)
    r = Reading("deepspeed", label)
    r.take("stack", "deepspeed", "the file's kind (DeepSpeed)")
    auto = {k for k, v in flat.items() if v == "auto"}
    for key in sorted(auto):
        r.skip(key, "auto", "set by the Hugging Face Trainer at run time: give the flag it becomes")
    get = {k: v for k, v in flat.items() if k not in auto}.get
    _batch(r, get)
    stage = get("zero_optimization.stage")
    if stage is not None:
        r.take("zero", stage, "zero_optimization.stage")
    _gradient_reduce(r, get, stage)
    overlap = get("zero_optimization.overlap_comm")
    if overlap is not None:
        r.take("overlap_dp", "on" if overlap else "off", "zero_optimization.overlap_comm")
        r.take("overlap_param_gather", "on" if overlap else "off", "zero_optimization.overlap_comm")
    _precision(r, get)
    if get("tensor_parallel.autotp_size") is not None:
        r.take("tp", get("tensor_parallel.autotp_size"), "tensor_parallel.autotp_size")
    if get("expert_parallel.enabled") and get("expert_parallel.autoep_size") is not None:
        r.take("ep", get("expert_parallel.autoep_size"), "expert_parallel.autoep_size")
    if any(k.startswith("activation_checkpointing.") for k in flat):
        r.take("recompute", "full", "activation_checkpointing (DeepSpeed checkpoints whole blocks)")
        r.notes.append("activation_checkpointing tunes the checkpointing the model code calls: read as full")
    else:
        r.take("recompute", "none", "no activation_checkpointing section (the model code may still checkpoint)")
    opt = get("optimizer.type")
    if opt is not None:
        kinds = {"adam": "adamw", "adamw": "adamw", "fusedadam": "adamw", "cpuadam": "adamw", "sgd": "sgd-momentum"}
        if str(opt).lower() in kinds:
            r.take("optimizer", kinds[str(opt).lower()], "optimizer.type")
        else:
            r.skip("optimizer.type", opt, "an optimizer whose state meshplan does not bill (billed as AdamW)")
    read = {
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "zero_optimization.stage",
        "zero_optimization.overlap_comm",
        "zero_optimization.reduce_scatter",
        "zero_optimization.use_multi_rank_bucket_allreduce",
        "bf16.enabled",
        "fp16.enabled",
        "bfloat16.enabled",
        "data_types.grad_accum_dtype",
        "communication_data_type",
        "tensor_parallel.autotp_size",
        "expert_parallel.enabled",
        "expert_parallel.autoep_size",
        "optimizer.type",
    }
    r.account({k: flat[k] for k in read if k in flat and k not in auto}, "read, and moot with the other keys given")
    for key, value in flat.items():
        if key in read or key in auto:
            continue
        known = EFFECTS.get(key) or EFFECTS.get(key.split(".")[0])
        r.skip(key, value, known or UNKNOWN)
    return r.done()


def _batch(r: Reading, get: Any) -> None:
    total, micro, accum = (
        get("train_batch_size"),
        get("train_micro_batch_size_per_gpu"),
        get("gradient_accumulation_steps"),
    )
    if micro is not None:
        r.take("micro_batch", micro, "train_micro_batch_size_per_gpu")
    if total is not None:
        r.take("global_batch", total, "train_batch_size")
    if total is not None and micro is not None:
        steps = accum if accum is not None else 1
        if not all(isinstance(x, int) and x > 0 for x in (total, micro, steps)) or total % (micro * steps):
            raise ValueError(
                f"{r.label}: train_batch_size {total} is not train_micro_batch_size_per_gpu {micro} x "
                f"gradient_accumulation_steps {steps} x data-parallel ranks"
            )
        tp = integer(get("tensor_parallel.autotp_size") or 1, "tensor_parallel.autotp_size", r.label, low=1)
        r.take(
            "gpus",
            total // (micro * steps) * tp,
            "train_batch_size / (train_micro_batch_size_per_gpu x gradient_accumulation_steps)"
            + (" x tensor_parallel.autotp_size" if tp > 1 else ""),
        )


def _precision(r: Reading, get: Any) -> None:
    if get("fp16.enabled"):
        r.take("precision", "fp16", "fp16.enabled")
        if get("data_types.grad_accum_dtype") is not None:
            r.skip("data_types.grad_accum_dtype", get("data_types.grad_accum_dtype"), "fp16's gradients: fp32 already")
    elif get("bf16.enabled") or get("bfloat16.enabled"):
        grads = get("data_types.grad_accum_dtype")
        key = "bf16.enabled" if grads is None else "bf16.enabled, data_types.grad_accum_dtype"
        r.take("precision", "bf16-fp32-grads" if grads == "fp32" else "bf16", key)
    else:
        r.take("precision", "fp32", "no fp16 or bf16 section (DeepSpeed trains in fp32)")
    comm = get("communication_data_type")
    if comm is not None:
        names = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "bfp16": "bf16"}
        if str(comm).lower() not in names:
            raise ValueError(f"{r.label}: communication_data_type {comm!r} is not fp32, bf16 or fp16")
        r.take("grad_dtype", names[str(comm).lower()], "communication_data_type")
