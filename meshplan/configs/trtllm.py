"""TensorRT-LLM's LLM-API options: the YAML ``trtllm-serve`` and ``trtllm-bench`` read with
``--extra_llm_api_options`` (what ``meshplan export trtllm`` writes beside its launcher, and what NVIDIA's
deployment recipes publish), with the model named beside it.

Keys as TensorRT-LLM's LlmArgs name them (tensorrt_llm/llmapi/llm_args.py): the parallel sizes
(``tensor_parallel_size``, ``pipeline_parallel_size``, ``moe_expert_parallel_size``), the caps (``max_batch_size``,
``max_num_tokens``, ``max_seq_len``), ``enable_attention_dp``, ``kv_cache_config`` (``dtype``,
``free_gpu_memory_fraction``), ``cuda_graph_config`` (``enable_padding``) and ``scheduler_config``
(``capacity_scheduler_policy``). One process runs one replica: the GPU count is tp x pp.
"""

from __future__ import annotations

from typing import Any

from meshplan.configs.reading import NO_EFFECT, UNKNOWN, ConfigRead, Reading, short
from meshplan.configs.speculative import trtllm_speculative
from meshplan.configs.yamlish import parse_yaml
from meshplan.spec.conditions import CapacityScheduler

TOP = {
    "tensor_parallel_size": "tp",
    "pipeline_parallel_size": "pp",
    "moe_expert_parallel_size": "ep",
    "max_batch_size": "max_batch",
    "max_num_tokens": "max_num_tokens",
    "max_seq_len": "context",
}
"""Top-level keys read as one request field each."""
KV_DTYPES = {"fp8": "fp8", "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16"}
LOGGING = {"print_iter_log", "enable_iter_perf_stats", "enable_iter_req_stats", "return_perf_metrics", "backend"}
LOGGING |= {"stream_interval", "num_postprocess_workers", "trust_remote_code", "skip_tokenizer_init"}
EFFECTS = {
    "moe_config": "the MoE kernels' backend: the engine family's expert share stands for them",
    "disable_overlap_scheduler": "the host's step work beside the GPU's: the engine family's constants stand for it",
    "enable_chunked_prefill": "prompts cut to the token budget: serve chunks them at --max-num-tokens",
}
KV_EFFECTS = {
    "enable_block_reuse": "prefix caching: its hit rate is serve's --prefix-hit-rate",
    "max_tokens": "a cap on the cache's tokens: the memory fraction sizes it here",
}


def read_trtllm_options(text: str, label: str) -> ConfigRead:
    data = parse_yaml(text, label)
    if not isinstance(data, dict):
        raise ValueError(f"{label} must hold a YAML mapping (TensorRT-LLM's LLM-API options)")
    r = Reading("trtllm", label)
    r.take("engine", "trtllm", "the file's kind (trtllm: LLM-API options)")
    for key, value in data.items():
        if key in TOP:
            r.take(TOP[key], value, key)
        elif key == "enable_attention_dp":
            r.take("dp_attention", value, key)
        elif key == "kv_cache_config":
            _kv_cache(r, _mapping(r, key, value))
        elif key == "cuda_graph_config":
            _graphs(r, value)
        elif key == "scheduler_config":
            _scheduler(r, _mapping(r, key, value))
        elif key == "speculative_config":
            trtllm_speculative(r, value)
        elif key in LOGGING:
            r.skip(key, value, NO_EFFECT)
        else:
            r.skip(key, value, EFFECTS.get(key, UNKNOWN))
    tp, pp = int(r.values.get("tp", 1)), int(r.values.get("pp", 1))
    if "tp" in r.values or "pp" in r.values:
        r.take("gpus", tp * pp, "tensor_parallel_size x pipeline_parallel_size (one replica a process)")
    return r.done()


def _mapping(r: Reading, key: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{r.label}: {key} must be a mapping, got {short(value)}")
    return value


def _kv_cache(r: Reading, cfg: dict[str, Any]) -> None:
    for key, value in cfg.items():
        where = f"kv_cache_config.{key}"
        if key == "dtype":
            text = str(value).lower()
            if text in KV_DTYPES:
                r.take("kv_dtype", KV_DTYPES[text], where)
            elif text != "auto":
                r.skip(where, value, "a KV-cache dtype meshplan does not bill (bf16, fp16, fp8)")
            else:
                r.skip(where, value, "the engine's own KV dtype for the weights (serve's default)")
        elif key == "free_gpu_memory_fraction":
            r.take("gpu_memory_utilization", value, where)
        else:
            r.skip(where, value, KV_EFFECTS.get(key, UNKNOWN))


def _graphs(r: Reading, value: Any) -> None:
    if value is None:
        r.skip("cuda_graph_config", value, "CUDA graphs off: type serve's --launch eager")
        return
    cfg = _mapping(r, "cuda_graph_config", value)
    for key, item in cfg.items():
        where = f"cuda_graph_config.{key}"
        if key == "enable_padding":
            if item is True:
                r.take("cuda_graph_padding", True, where)
            else:
                r.skip(where, item, "no padding: serve's default")
        else:
            r.skip(where, item, "the captured batch sizes: serve pads to 1, 2, 4, ... under --cuda-graph-padding")


def take_policy(r: Reading, value: Any, key: str) -> None:
    """TensorRT-LLM's capacity scheduler policy, as the LLM API (MAX_UTILIZATION) or trtllm-bench
    (max_utilization) names it, read as serve's --capacity-scheduler; STATIC_BATCH is serve's --batch."""
    policy = CapacityScheduler.from_trtllm(str(value))
    if policy is None:
        names = ", ".join(p.trtllm for p in CapacityScheduler)
        why = "either case; STATIC_BATCH: serve's --batch"
        raise ValueError(f"{r.label}: {key} {short(value)} is not one of {names} ({why})")
    r.take("capacity_scheduler", policy.value, key)


def _scheduler(r: Reading, cfg: dict[str, Any]) -> None:
    for key, value in cfg.items():
        where = f"scheduler_config.{key}"
        if key == "capacity_scheduler_policy":
            take_policy(r, value, where)
        else:
            r.skip(where, value, UNKNOWN)
