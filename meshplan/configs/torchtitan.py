"""torchtitan: a job TOML (``[training]``, ``[parallelism]``, ``[activation_checkpoint]``, ...) or the Python
config module ``meshplan export torchtitan`` writes for torchtitan 0.3.0.

The sections and keys are those of torchtitan's job config: the dataclasses of torchtitan 0.3.0
(torchtitan/config/configs.py, trainer.py: ``TrainingConfig``, ``ParallelismConfig``, ``CompileConfig``) and the
TOML files of the releases before it, whose sections those dataclasses carry on (``training.batch_size`` is
0.3.0's ``local_batch_size``). A section torchtitan does not have, or an unknown key in a section meshplan
reads, is refused: torchtitan refuses it too. The Python module is read without running it: only its
``config.SECTION.KEY = literal`` lines, the recipe it calls and the activation-checkpointing policy it sets.

What the keys mean (torchtitan/distributed/parallel_dims.py, fsdp.py): FSDP2 shards over dp_shard x cp, so a
data_parallel_shard_degree of -1 (the rest of the GPUs) or above 1 is ZeRO-3, or ZeRO-2 with
``fsdp_reshard_after_forward = "never"`` (and by default under pipeline parallelism); context parallelism
all-gathers K/V; sequence parallelism is on whenever TP is (``enable_sequence_parallel`` defaults to true).
"""

from __future__ import annotations

import ast
from typing import Any

from meshplan.configs.reading import NO_EFFECT, ConfigRead, Reading, integer
from meshplan.files import parse_toml

MODELS = {
    ("llama3", "8b"): "llama-3.1-8b",
    ("llama3", "70b"): "llama-3.1-70b",
    ("llama3", "405b"): "llama-3.1-405b",
    ("qwen3", "8b"): "qwen3-8b",
    ("qwen3", "30b-a3b"): "qwen3-30b-a3b",
    ("qwen3", "235b-a22b"): "qwen3-235b-a22b",
    ("deepseek_v3", "671b"): "deepseek-v3",
    ("gpt_oss", "20b"): "gpt-oss-20b",
    ("gpt_oss", "120b"): "gpt-oss-120b",
}
"""torchtitan's (model name, flavor) -> the catalog model of the same shape (Llama 3's flavors are 3.1's)."""
RECIPES = {
    "llama3_8b": ("llama3", "8b"),
    "llama3_70b": ("llama3", "70b"),
    "llama3_405b": ("llama3", "405b"),
    "qwen3_8b": ("qwen3", "8b"),
    "qwen3_30b_a3b": ("qwen3", "30b-a3b"),
    "qwen3_235b_a22b": ("qwen3", "235b-a22b"),
    "deepseek_v3_671b": ("deepseek_v3", "671b"),
    "gpt_oss_20b": ("gpt_oss", "20b"),
    "gpt_oss_120b": ("gpt_oss", "120b"),
}
"""torchtitan 0.3.0's recipe functions (config_registry.py) -> (model name, flavor)."""
SCHEDULES = {
    "gpipe": "gpipe",
    "1f1b": "1f1b",
    "interleaved1f1b": "interleaved",
    "interleavedzerobubble": "zero-bubble",
    "zbvzerobubble": "zero-bubble",
    "dualpipev": "dualpipe",
}
_TRAINING = {"local_batch_size", "batch_size", "global_batch_size", "seq_len", "mixed_precision_param", "compile"}
_TRAINING |= {"mixed_precision_reduce", "enable_cpu_offload", "dtype", "max_norm", "steps", "gc_freq", "gc_debug"}
_TRAINING |= {"disable_cuda_graphs", "dataset", "dataset_path", "warmup_steps", "seed", "deterministic", "lr"}
_PARALLEL = {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward"}
_PARALLEL |= {"tensor_parallel_degree", "enable_sequence_parallel", "pipeline_parallel_degree"}
_PARALLEL |= {"pipeline_parallel_schedule", "pipeline_parallel_layers_per_stage", "pipeline_parallel_microbatch_size"}
_PARALLEL |= {"pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers"}
_PARALLEL |= {"context_parallel_degree", "context_parallel_rotate_method", "expert_parallel_degree"}
_PARALLEL |= {"expert_tensor_parallel_degree", "enable_async_tensor_parallel", "disable_loss_parallel"}
_PARALLEL |= {"enable_fsdp_symm_mem", "spmd_backend", "module_fqns_per_model_part", "pipeline_parallel_schedule_csv"}
_PARALLEL |= {"context_parallel_load_balancer", "context_parallel_ptrr_mask_key", "pipeline_parallel_split_points"}
_PARALLEL |= {"enable_compiled_autograd"}
READ_SECTIONS: dict[str, set[str]] = {
    "training": _TRAINING,
    "parallelism": _PARALLEL,
    "activation_checkpoint": {"mode", "selective_ac_option", "per_op_sac_force_recompute_mm_shapes_by_fqns"}
    | {"early_stop", "memory_budget", "visualize_memory_budget_pareto", "preserve_rng_state", "determinism_check"},
    "model": {"name", "flavor", "tokenizer_path", "hf_assets_path", "converters", "print_after_conversion"},
    "compile": {"enable", "components", "backend", "enable_async_tensor_parallel"},
    "float8": {"enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp", "recipe_name"}
    | {"filter_fqns", "emulate", "force_recompute_fp8_weight_in_bwd", "moe_fqns_prototype"},
    "optimizer": {"name", "lr", "eps", "beta1", "beta2", "weight_decay", "implementation", "early_step_in_backward"},
}
OTHER_SECTIONS = {"job", "profiling", "profiler", "metrics", "tokenizer", "dataloader", "lr_scheduler", "checkpoint"}
OTHER_SECTIONS |= {"comm", "validator", "validation", "debug", "override", "loss", "mx", "experimental"}
OTHER_SECTIONS |= {"fault_tolerance", "memory_estimation", "quantize"}
TOP_KEYS = {"hf_assets_path", "dump_folder"}


def read_torchtitan_toml(text: str, label: str) -> ConfigRead:
    return _read(_flatten(parse_toml(text, label), label), label)


def _flatten(data: dict[str, Any], label: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for section, table in data.items():
        if not isinstance(table, dict):
            if section not in TOP_KEYS:
                raise ValueError(f"{label}: {section!r} is not a key of torchtitan's job config")
            flat[section] = table
            continue
        if section not in READ_SECTIONS and section not in OTHER_SECTIONS:
            known = ", ".join(sorted([*READ_SECTIONS, *OTHER_SECTIONS]))
            raise ValueError(f"{label}: [{section[:40]}] is not a section of torchtitan's job config (known: {known})")
        for key, value in table.items():
            if section in READ_SECTIONS and key not in READ_SECTIONS[section]:
                raise ValueError(f"{label}: {section}.{key[:60]} is not a key of torchtitan's [{section}]")
            flat[f"{section}.{key}"] = value
    return flat


def read_torchtitan_module(text: str, label: str) -> ConfigRead:
    """The config module of ``meshplan export torchtitan`` (or one written like it), read without running it."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError) as exc:
        raise ValueError(f"{label} is not Python torchtitan can load: {str(exc).splitlines()[0][:120]}") from None
    flat: dict[str, Any] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = ast.unparse(node.targets[0])
        if target == "config" and isinstance(node.value, ast.Call):
            recipe = ast.unparse(node.value.func)
            if recipe not in RECIPES:
                raise ValueError(f"{label}: recipe {recipe[:60]}() is not one of torchtitan 0.3.0's: name the model")
            flat["model.name"], flat["model.flavor"] = RECIPES[recipe]
            flat["recipe"] = recipe
        elif target == "config.activation_checkpoint":
            policy = ast.unparse(node.value)
            modes = {"None": "none", "FullAC.Config()": "full", "SelectiveAC.Config()": "selective"}
            if policy not in modes:
                raise ValueError(f"{label}: activation_checkpoint = {policy[:60]} is not one meshplan reads")
            flat["activation_checkpoint.mode"] = modes[policy]
            flat["activation_checkpoint.selective_ac_option"] = "op"
        elif target == "config.model_spec":
            flat["model.converters"] = ["float8"] if "Float8" in ast.unparse(node.value) else []
        elif target.startswith("config.") and target.count(".") == 2:
            _, section, key = target.split(".")
            try:
                flat[f"{section}.{key}"] = ast.literal_eval(node.value)
            except (ValueError, SyntaxError, TypeError, RecursionError):
                raise ValueError(f"{label}: {target} is not a literal value") from None
        elif target.startswith("config."):
            flat[target.removeprefix("config.")] = ast.unparse(node.value)[:80]
    if "recipe" not in flat:
        raise ValueError(f"{label} calls no torchtitan recipe (config = llama3_8b() or the like)")
    return _read(flat, label, recipe=str(flat.pop("recipe")))


def _read(flat: dict[str, Any], label: str, *, recipe: str | None = None) -> ConfigRead:
    r = Reading("torchtitan", label)
    r.take("stack", "torchtitan", "the file's kind (torchtitan)")
    if recipe is not None:
        r.notes.append(
            f"the recipe {recipe}() sets what this file does not (compile, float8, optimizer): the stack's "
            "defaults stand for them"
        )
    get = flat.get
    _model(r, flat)
    pp = integer(get("parallelism.pipeline_parallel_degree", 1), "parallelism.pipeline_parallel_degree", label)
    tp = integer(get("parallelism.tensor_parallel_degree", 1), "parallelism.tensor_parallel_degree", label)
    cp = integer(get("parallelism.context_parallel_degree", 1), "parallelism.context_parallel_degree", label)
    for key, name in (
        ("parallelism.tensor_parallel_degree", "tp"),
        ("parallelism.pipeline_parallel_degree", "pp"),
        ("parallelism.context_parallel_degree", "cp"),
        ("parallelism.expert_parallel_degree", "ep"),
        ("parallelism.expert_tensor_parallel_degree", "expert_tp"),
        ("training.seq_len", "seq"),
    ):
        if key in flat:
            r.take(name, flat[key], key)
    if tp > 1:
        r.take("sp", get("parallelism.enable_sequence_parallel", True), "parallelism.enable_sequence_parallel")
    if cp > 1:
        r.take("cp_kind", "all-gather", "parallelism.context_parallel_degree (torchtitan all-gathers K/V)")
    for key in ("parallelism.enable_async_tensor_parallel", "compile.enable_async_tensor_parallel"):
        if flat.get(key) is True:
            r.take("overlap_tp", "on", f"{key} (async TP overlaps TP's collectives with its matmuls)")
            r.read_keys.add(key)
    if "parallelism.disable_loss_parallel" in flat:
        key = "parallelism.disable_loss_parallel"
        r.take("loss_parallel", "off" if flat[key] else "on", key)
        r.read_keys.add(key)
    _data_parallel(r, flat, pp=pp, cp=cp)
    _batch(r, flat, pp=pp)
    _pipeline(r, flat, pp=pp)
    _precision(r, flat)
    _checkpointing(r, flat)
    used = {
        "parallelism.tensor_parallel_degree",
        "parallelism.pipeline_parallel_degree",
        "parallelism.context_parallel_degree",
        "parallelism.expert_parallel_degree",
        "parallelism.expert_tensor_parallel_degree",
        "parallelism.enable_sequence_parallel",
        "training.seq_len",
        *r.read_keys,
    }
    for key, value in flat.items():
        if key not in used:
            r.skip(key, value, EFFECTS.get(key, NO_EFFECT))
    return r.done()


EFFECTS = {
    "training.enable_cpu_offload": "optimizer state and gradients in host memory (FSDP2 CPU offload): not billed",
    "training.mixed_precision_reduce": "gradients reduced in fp32: the precision policy's own (fsdp2-bf16)",
    "training.dtype": "the weights' dtype without FSDP: the precision policy decides it here",
    "parallelism.enable_fsdp_symm_mem": "FSDP collectives through symmetric memory: not modelled",
    "float8.precompute_float8_dynamic_scale_for_fsdp": "one amax all-reduce per step instead of per layer",
    "parallelism.context_parallel_load_balancer": "how sequence chunks are balanced over CP ranks: not modelled",
}


def _model(r: Reading, flat: dict[str, Any]) -> None:
    name, flavor = flat.get("model.name"), flat.get("model.flavor")
    if name is None:
        return
    key = (str(name).lower(), str(flavor).lower())
    if key in MODELS:
        r.name_model(MODELS[key], f"model.name = {name!r}, model.flavor = {flavor!r}")
        r.read_keys.update({"model.name", "model.flavor"})
    else:
        r.notes.append(f"torchtitan model {name} {flavor} has no catalog equivalent: name the model")


def _data_parallel(r: Reading, flat: dict[str, Any], *, pp: int, cp: int) -> None:
    shard = integer(flat.get(key := "parallelism.data_parallel_shard_degree", -1), key, r.label)
    replicate = flat.get("parallelism.data_parallel_replicate_degree")
    reshard = str(flat.get("parallelism.fsdp_reshard_after_forward", "default"))
    if shard == 1 and cp == 1:
        r.take("zero", 0, f"{key} = 1 (no FSDP)")
    else:
        zero = 2 if reshard == "never" or (reshard == "default" and pp > 1) else 3
        r.take("zero", zero, f"{key} with parallelism.fsdp_reshard_after_forward = {reshard!r}")
        r.read_keys.add("parallelism.fsdp_reshard_after_forward")
    if shard > 0 and not (shard == 1 and cp == 1):
        r.take("dp_shard", shard, key)
    r.read_keys.add(key)
    if replicate is not None:
        r.take("dp_replicate", replicate, "parallelism.data_parallel_replicate_degree")
        r.read_keys.add("parallelism.data_parallel_replicate_degree")


def _batch(r: Reading, flat: dict[str, Any], *, pp: int) -> None:
    local_key = "training.local_batch_size" if "training.local_batch_size" in flat else "training.batch_size"
    if pp > 1:
        micro = flat.get("parallelism.pipeline_parallel_microbatch_size", 1)
        r.take("micro_batch", micro, "parallelism.pipeline_parallel_microbatch_size")
        r.read_keys.add("parallelism.pipeline_parallel_microbatch_size")
        if local_key in flat:
            r.skip(
                local_key,
                flat[local_key],
                "each rank's batch, split into micro-batches: with --gpus it is global_batch_size / dp",
            )
            r.read_keys.add(local_key)
    elif local_key in flat:
        r.take("micro_batch", flat[local_key], local_key)
        r.read_keys.add(local_key)
    glob = flat.get("training.global_batch_size", -1)
    if integer(glob, "training.global_batch_size", r.label, high=1 << 40) > 0:
        r.take("global_batch", glob, "training.global_batch_size")
    r.read_keys.add("training.global_batch_size")


def _pipeline(r: Reading, flat: dict[str, Any], *, pp: int) -> None:
    if pp <= 1:
        return
    schedule = str(flat.get("parallelism.pipeline_parallel_schedule", "1F1B"))
    if schedule.lower() not in SCHEDULES:
        raise ValueError(f"{r.label}: pipeline_parallel_schedule {schedule[:40]!r} is not one of torchtitan's")
    r.take("schedule", SCHEDULES[schedule.lower()], "parallelism.pipeline_parallel_schedule")
    r.read_keys.add("parallelism.pipeline_parallel_schedule")
    per_stage = flat.get("parallelism.pipeline_parallel_layers_per_stage")
    if per_stage is None or r.model is None:
        return
    from meshplan.io import load_model

    first_key, last_key = (f"parallelism.pipeline_parallel_{end}_stage_less_layers" for end in ("first", "last"))
    first = integer(flat.get(first_key, 1), first_key, r.label, low=0)
    last = integer(flat.get(last_key, 1), last_key, r.label, low=0)
    layers = load_model(r.model).num_layers + first + last
    stages = -(-layers // integer(per_stage, "parallelism.pipeline_parallel_layers_per_stage", r.label, low=1))
    if stages % pp:
        raise ValueError(f"{r.label}: {stages} pipeline stages do not divide over pipeline_parallel_degree {pp}")
    r.take("vpp", stages // pp, "parallelism.pipeline_parallel_layers_per_stage (stages / pp)")
    r.read_keys.update(
        {
            "parallelism.pipeline_parallel_layers_per_stage",
            "parallelism.pipeline_parallel_first_stage_less_layers",
            "parallelism.pipeline_parallel_last_stage_less_layers",
        }
    )


def _precision(r: Reading, flat: dict[str, Any]) -> None:
    converters = flat.get("model.converters", [])
    converters = [converters] if isinstance(converters, str) else converters if isinstance(converters, list) else []
    if "float8" in converters:
        r.take("precision", "fp8", "model.converters = ['float8']")
    elif str(flat.get("training.mixed_precision_param", "bfloat16")) == "float32":
        r.take("precision", "fp32", "training.mixed_precision_param = 'float32'")
    else:
        r.take("precision", "fsdp2-bf16", "training.mixed_precision_param (bfloat16, torchtitan's default)")
    r.read_keys.update({"model.converters", "training.mixed_precision_param"})
    if flat.get("float8.enable_fsdp_float8_all_gather") is True and "float8" in converters:
        r.take("fp8_all_gather", "on", "float8.enable_fsdp_float8_all_gather")
        r.read_keys.add("float8.enable_fsdp_float8_all_gather")
    if "float8.recipe_name" in flat and "float8" in converters:
        r.take("fp8_recipe", flat["float8.recipe_name"], "float8.recipe_name")
        r.read_keys.add("float8.recipe_name")
    compiled = flat.get("compile.enable", flat.get("training.compile"))
    if compiled is not None:
        key = "compile.enable" if "compile.enable" in flat else "training.compile"
        r.take("kernels", "fused" if compiled else "eager", key)
        r.read_keys.add(key)
        parts = flat.get("compile.components", ["model", "loss"])
        if compiled and isinstance(parts, list | str) and "loss" in parts:
            r.take("loss", "compiled", "compile.components (the loss compiled with the model)")
            r.read_keys.add("compile.components")
    name = str(flat.get("optimizer.name", "AdamW")).lower()
    if name in ("adamw", "adam"):
        r.take("optimizer", "adamw", "optimizer.name" if "optimizer.name" in flat else "the recipe's AdamW")
        r.read_keys.add("optimizer.name")


def _checkpointing(r: Reading, flat: dict[str, Any]) -> None:
    key = "activation_checkpoint.mode"
    mode = str(flat.get(key, "selective"))
    if mode not in ("none", "selective", "full"):
        raise ValueError(f"{r.label}: {key} {mode[:40]!r} is not none, selective or full")
    r.take("recompute", mode, key if key in flat else f"no {key} (torchtitan 0.3.0's default: SelectiveAC)")
    r.read_keys.add(key)
    if mode == "selective":
        option = str(flat.get("activation_checkpoint.selective_ac_option", "op"))
        r.take("selective", "op" if option == "op" else "layer", "activation_checkpoint.selective_ac_option")
        if option not in ("op", "2"):
            r.notes.append(f"selective_ac_option {option}: meshplan bills every second layer checkpointed")
        r.read_keys.add("activation_checkpoint.selective_ac_option")
