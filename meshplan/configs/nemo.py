"""NeMo 2 recipes and Megatron-Bridge configs, as YAML.

A NeMo 2 recipe serialized to YAML nests its values under ``trainer`` (``strategy``, ``plugins``), ``data``,
``model.config`` and ``optim.config``; a Megatron-Bridge ``ConfigContainer`` under ``model``, ``train``,
``optimizer``, ``ddp``, ``mixed_precision`` (``model_config``, ``train_config`` ... in its older override files).
Both spell each value with Megatron-Core's attribute name (ModelParallelConfig, TransformerConfig,
DistributedDataParallelConfig, OptimizerConfig), so a value is read by that name wherever it sits, and two
places that state it differently are refused. The model is the NeMo config class the recipe names
(``Llama3Config8B``) or the catalog model of the dimensions the file states. Absent values are NeMo's:
bf16-mixed reduces gradients in fp32 (MegatronMixedPrecision's grad_reduce_in_fp32 default).
"""

from __future__ import annotations

import re
from typing import Any

from meshplan.configs.reading import NO_EFFECT, UNKNOWN, ConfigRead, Reading
from meshplan.configs.yamlish import parse_yaml

VALUES = {
    "tensor_model_parallel_size": "tp",
    "pipeline_model_parallel_size": "pp",
    "virtual_pipeline_model_parallel_size": "vpp",
    "context_parallel_size": "cp",
    "expert_model_parallel_size": "ep",
    "expert_tensor_parallel_size": "expert_tp",
    "sequence_parallel": "sp",
    "micro_batch_size": "micro_batch",
    "global_batch_size": "global_batch",
    "seq_length": "seq",
    "num_layers_in_first_pipeline_stage": "first_stage_layers",
    "num_layers_in_last_pipeline_stage": "last_stage_layers",
}
SWITCHES = {
    "overlap_grad_reduce": "overlap_dp",
    "overlap_param_gather": "overlap_param_gather",
    "tp_comm_overlap": "overlap_tp",
    "cross_entropy_loss_fusion": "loss_fusion",
    "gradient_accumulation_fusion": "grad_accum_fusion",
}
SHAPE = {
    "num_layers": "num_layers",
    "hidden_size": "hidden",
    "ffn_hidden_size": "ffn_hidden",
    "num_attention_heads": "num_heads",
    "num_query_groups": "num_kv_heads",
    "vocab_size": "vocab_size",
}
MODELS = {
    "llama3config8b": "llama-3.1-8b",
    "llama31config8b": "llama-3.1-8b",
    "llama3config70b": "llama-3.1-70b",
    "llama31config70b": "llama-3.1-70b",
    "llama31config405b": "llama-3.1-405b",
    "llama2config7b": "llama-2-7b",
    "llama2config13b": "llama-2-13b",
    "llama2config70b": "llama-2-70b",
    "mixtralconfig8x7b": "mixtral-8x7b",
    "mixtralconfig8x22b": "mixtral-8x22b",
    "qwen3config8b": "qwen3-8b",
    "deepseekv3config": "deepseek-v3",
}
"""NeMo 2's model config classes (nemo/collections/llm/gpt/model/*.py) -> catalog models of the same shape."""
PRECISION_KEYS = ("bf16", "fp16", "fp8", "precision", "mixed_precision", "grad_reduce_in_fp32", "fp8_recipe")
PRECISION_KEYS += ("use_distributed_optimizer", "recompute_granularity", "recompute_method", "recompute_num_layers")
PRECISION_KEYS += ("recompute_modules", "optimizer", "num_nodes", "devices", "params_dtype", "pipeline_dtype")
PRECISION_KEYS += ("autocast_enabled", "num_gpus_per_node", "cp_comm_type")
NOTHING_BILLED = re.compile(
    r"(.*lr.*|.*log.*|.*save.*|.*load.*|.*eval.*|.*val.*|.*test.*|.*seed.*|.*warmup.*|.*decay.*|.*iters|max_steps|"
    r"clip_grad|weight_decay|adam_.*|sgd_momentum|.*ckpt.*|.*checkpoint.*|.*profil.*|.*dir|name|.*path|"
    r"accelerator|callbacks|use_distributed_sampler|limit_.*|num_workers|.*tokenizer.*|.*dataset.*|split|"
    r"check_for_.*|rerun_.*|gradient_as_bucket_view|.*nsys.*|.*_ranks|record_shapes|.*step_start|.*step_end|"
    r"use_pytorch_profiler|log_interval|.*_interval|accumulate_grad_batches|.*dropout.*|init_method_std|"
    r"position_embedding_type|rotary_.*|normalization|activation_func|gated_linear_unit|add_bias_linear|"
    r"share_embeddings_and_output_weights|make_vocab_size_divisible_by|layernorm_.*|kv_channels|.*_scaling.*|"
    r"seq_len_interpolation_factor|apply_rope_fusion|bias_.*_fusion|masked_softmax_fusion|persist_layer_norm|"
    r"use_cpu_initialization|perform_initialization|resume.*|restore_config|.*_target_|_partial_|.*reset_.*|"
    r"consumed_samples|exit_.*|manual_gc.*|fully_parallel_save|async_save|max_position_embeddings)"
)


def _flatten(data: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(data, dict):
        for key, value in data.items():
            _flatten(value, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = data


def read_nemo(text: str, label: str) -> ConfigRead:
    data = parse_yaml(text, label)
    if not isinstance(data, dict):
        raise ValueError(f"{label} must hold a YAML mapping (a NeMo or Megatron-Bridge config)")
    data = data.get("ConfigContainer", data) if isinstance(data.get("ConfigContainer"), dict) else data
    flat: dict[str, Any] = {}
    _flatten(data, "", flat)
    r = Reading("nemo", label)
    r.take("stack", "nemo", "the file's kind (NeMo / Megatron-Bridge)")
    by_name: dict[str, tuple[str, Any]] = {}
    for key, value in flat.items():
        leaf = key.rsplit(".", 1)[-1]
        if leaf == "_target_" and isinstance(value, str):
            cls = value.rsplit(".", 1)[-1].lower()
            if cls in MODELS:
                r.name_model(MODELS[cls], f"{key} = {value}")
                continue
        if leaf in VALUES and value is not None:
            r.take(VALUES[leaf], value, key)
        elif leaf in SWITCHES and value is not None:
            r.take(SWITCHES[leaf], "on" if value else "off", key)
        elif leaf in SHAPE and value is not None:
            r.shape(SHAPE[leaf], value, key)
        elif leaf in PRECISION_KEYS:
            if leaf in by_name and by_name[leaf][1] != value:
                raise ValueError(f"{label}: {key} = {value!r} disagrees with {by_name[leaf][0]}")
            if leaf in by_name:
                r.skip(key, value, f"the same value as {by_name[leaf][0]}, read there")
            else:
                by_name[leaf] = (key, value)
        elif value is None or NOTHING_BILLED.fullmatch(leaf):
            r.skip(key, value, NO_EFFECT)
        else:
            r.skip(key, value, UNKNOWN)
    _precision(r, by_name)
    _recompute(r, by_name)
    _fleet(r, by_name)
    r.account(dict(by_name.values()), "read, and moot with the other values given")
    kinds = {"p2p": "ring", "all_gather": "all-gather", "allgather": "all-gather"}
    comm = _get(by_name, "cp_comm_type")
    if comm is None:
        r.take("cp_kind", "ring", "no cp_comm_type (Megatron-Core's default: p2p, a ring)")
    elif str(comm) in kinds:
        r.take("cp_kind", kinds[str(comm)], by_name["cp_comm_type"][0])
    else:
        r.skip(
            by_name["cp_comm_type"][0], comm, "a context-parallel exchange meshplan does not model (billed as a ring)"
        )
    return r.done()


def _get(by_name: dict[str, tuple[str, Any]], leaf: str) -> Any:
    return by_name[leaf][1] if leaf in by_name else None


def _precision(r: Reading, by_name: dict[str, tuple[str, Any]]) -> None:
    named = str(_get(by_name, "precision") or _get(by_name, "mixed_precision") or "").lower().replace("_", "-")
    fp8 = _get(by_name, "fp8")
    grads = _get(by_name, "grad_reduce_in_fp32")
    keys = [by_name[k][0] for k in ("precision", "mixed_precision", "bf16", "fp16", "fp8") if k in by_name]
    where = ", ".join(keys) or "NeMo's default (bf16-mixed)"
    if _get(by_name, "fp16") or named.startswith(("16", "fp16")):
        r.take("precision", "fp16", where)
    elif fp8:
        r.take("precision", "fp8", where)
        if grads is not False:
            r.take("grad_dtype", "fp32", by_name["grad_reduce_in_fp32"][0] if grads else "NeMo's fp32 reduction")
    elif _get(by_name, "bf16") or named.startswith("bf16") or not keys:
        fp32 = grads is not False
        src = by_name["grad_reduce_in_fp32"][0] if "grad_reduce_in_fp32" in by_name else "NeMo's grad_reduce_in_fp32"
        r.take("precision", "bf16-fp32-grads" if fp32 else "bf16", f"{where}; {src}")
    else:
        r.take("precision", "fp32", where)
    recipe = _get(by_name, "fp8_recipe")
    if recipe is not None:
        if recipe in ("tensorwise", "delayed", "mxfp8"):
            r.take("fp8_recipe", recipe, by_name["fp8_recipe"][0])
        else:
            r.skip(by_name["fp8_recipe"][0], recipe, "an FP8 scaling meshplan does not model (billed as tensorwise)")
    for leaf in ("params_dtype", "pipeline_dtype", "autocast_enabled"):
        if leaf in by_name:
            r.skip(by_name[leaf][0], by_name[leaf][1], "follows from the precision above")
    if _get(by_name, "use_distributed_optimizer"):
        r.take("zero", 1, by_name["use_distributed_optimizer"][0])
    elif "use_distributed_optimizer" in by_name:
        r.take("zero", 0, by_name["use_distributed_optimizer"][0])
    opt = _get(by_name, "optimizer")
    if opt is not None:
        if str(opt).lower() in ("adam", "adamw"):
            r.take("optimizer", "adamw", by_name["optimizer"][0])
        else:
            r.skip(by_name["optimizer"][0], opt, "an optimizer whose state meshplan bills as AdamW's")


def _recompute(r: Reading, by_name: dict[str, tuple[str, Any]]) -> None:
    granularity = _get(by_name, "recompute_granularity")
    if granularity is None:
        r.take("recompute", "none", "no recompute_granularity (Megatron-Core's default: none)")
        for leaf in ("recompute_method", "recompute_num_layers", "recompute_modules"):
            if leaf in by_name:
                r.skip(by_name[leaf][0], by_name[leaf][1], "applies only with recompute_granularity")
        return
    r.take("recompute", granularity, by_name["recompute_granularity"][0])
    modules = _get(by_name, "recompute_modules")
    if granularity == "selective" and modules:
        r.take("selective", "modules", by_name["recompute_modules"][0])
        text = ",".join(map(str, modules)) if isinstance(modules, list) else modules
        r.take("recompute_modules", text, by_name["recompute_modules"][0])
    method, layers = _get(by_name, "recompute_method"), _get(by_name, "recompute_num_layers")
    if granularity == "full" and method == "block" and layers is not None:
        r.take("recompute_layers", layers, by_name["recompute_num_layers"][0])
    elif granularity == "full" and layers not in (None, 1):
        r.skip(by_name["recompute_num_layers"][0], layers, "uniform groups of layers (billed as one per layer)")


def _fleet(r: Reading, by_name: dict[str, tuple[str, Any]]) -> None:
    per_node = _get(by_name, "devices") or _get(by_name, "num_gpus_per_node")
    nodes = _get(by_name, "num_nodes") or 1
    if isinstance(per_node, int) and isinstance(nodes, int):
        keys = [by_name[k][0] for k in ("devices", "num_gpus_per_node", "num_nodes") if k in by_name]
        r.take("gpus", per_node * nodes, " x ".join(keys))
