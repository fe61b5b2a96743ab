"""TensorRT-LLM export: `trtllm-serve` options and an extra LLM-API YAML file for a serving plan.

Target: TensorRT-LLM at commit 00209af1 (option names read from tensorrt_llm/commands/serve.py: --tp_size,
--pp_size, --ep_size, --max_batch_size, --max_seq_len, --kv_cache_free_gpu_memory_fraction and
--extra_llm_api_options; `trtllm-serve MODEL` runs its default `serve` command). The KV-cache dtype,
attention data parallelism and the capacity scheduler a plan was timed with are LLM-API arguments, written to
the YAML file (kv_cache_config.dtype, enable_attention_dp, scheduler_config.capacity_scheduler_policy). Weight
quantization comes from the checkpoint (a ModelOpt FP8 or NVFP4 export), so the plan's quantization is a note,
not a flag. One server runs one replica: dp replicas are dp servers.
"""

from __future__ import annotations

from collections.abc import Mapping

from meshplan.exports.common import Engine, Export, ServingPlan, UnsupportedByEngine, shell_join, shell_script
from meshplan.spec.conditions import CapacityScheduler
from meshplan.units import DType

ENGINE_VERSION = "main@00209af1"
ENGINE = Engine.TRTLLM
SCRIPT = "serve_trtllm.sh"
OPTIONS = "extra_llm_api_options.yml"

KV_CACHE_DTYPES: dict[DType, str] = {DType.FP8: "fp8"}
"""meshplan dtype -> kv_cache_config.dtype (unset: auto, the model's dtype)."""


def trtllm_args(plan: ServingPlan) -> list[str]:
    """The `trtllm-serve` command line of one replica of a serving plan."""
    if plan.ep > 1 and plan.tp % plan.ep:
        raise UnsupportedByEngine(ENGINE, f"split experts over ep={plan.ep} outside a tp={plan.tp} group", "ep=tp")
    if plan.enforce_eager:  # the export writes no LLM-API key that turns its decode graphs off
        raise UnsupportedByEngine(ENGINE, "launch a plan timed op by op (--launch eager)", "the plan with CUDA graphs")
    args = ["trtllm-serve", plan.model_path, "--backend", "pytorch"]
    args += ["--tp_size", str(plan.tp), "--pp_size", str(plan.pp)]
    args += ["--ep_size", str(plan.ep)] if plan.ep > 1 else []
    args += ["--max_batch_size", str(plan.max_num_seqs), "--max_seq_len", str(plan.max_model_len)]
    args += ["--kv_cache_free_gpu_memory_fraction", f"{plan.gpu_memory_utilization:g}"]
    return [*args, "--extra_llm_api_options", OPTIONS]


def _options(plan: ServingPlan) -> str:
    lines = ["# LLM-API arguments trtllm-serve reads on top of its options"]
    if plan.kv_cache_dtype is not None and plan.kv_cache_dtype not in (DType.BF16, DType.FP16):
        if plan.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise UnsupportedByEngine(ENGINE, f"store the KV cache in {plan.kv_cache_dtype}", "kv_cache_dtype fp8")
        lines += ["kv_cache_config:", f"  dtype: {KV_CACHE_DTYPES[plan.kv_cache_dtype]}"]
    lines += [f"enable_attention_dp: {'true' if plan.dp_attention else 'false'}"]
    if plan.capacity_scheduler is not None:
        policy = CapacityScheduler(plan.capacity_scheduler).trtllm  # unset: GUARANTEED_NO_EVICT, its default
        lines += ["scheduler_config:", f"  capacity_scheduler_policy: {policy}"]
    return "\n".join(lines) + "\n"


def export_trtllm(plan: ServingPlan, *, predicted: Mapping[str, float] | None = None) -> Export:
    """A `trtllm-serve` launcher and its YAML options for a serving plan."""
    tokens = trtllm_args(plan)
    gpus = plan.tp * plan.pp
    title = f"TensorRT-LLM {ENGINE_VERSION} launcher from meshplan: {plan.model_path}, one replica on {gpus} GPUs"
    notes = [
        "--kv_cache_free_gpu_memory_fraction is the share of memory left after weights and buffers, "
        "not of the whole GPU (vLLM's gpu_memory_utilization)"
    ]
    if plan.quantization is not None:
        notes.append(f"load a checkpoint quantized as {plan.quantization} (TensorRT-LLM reads it from the checkpoint)")
    if plan.dp > 1:
        notes.append(f"start {plan.dp} such servers, one per replica, behind a load balancer")
    return Export(
        engine=ENGINE,
        engine_version=ENGINE_VERSION,
        files={SCRIPT: shell_script(title=title, predicted=predicted, env={}, tokens=tokens), OPTIONS: _options(plan)},
        command=shell_join(tokens),
        notes=tuple(notes),
    )
