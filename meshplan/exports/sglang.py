"""SGLang export: `python -m sglang.launch_server` arguments for a serving plan.

Target: SGLang 0.5.23 (flag names and choices read from sglang/srt/arg_groups/fields/{parallel,
model,schedule}.py of that release and checked by its own ServerArgs.add_cli_args parser).
SGLang carves expert parallelism out of each replica's TP group: when ep > 1 it requires
ep_size x moe_dp_size = tp_size (sglang/srt/arg_groups/parallel_hook.py), so ep must divide tp.

The inputs share vLLM's names so one plan feeds both: max_model_len -> --context-length,
gpu_memory_utilization -> --mem-fraction-static, max_num_seqs -> --max-running-requests. Note that
SGLang's static fraction covers weights and the KV pool only, not activations.
"""

from __future__ import annotations

from collections.abc import Mapping

from meshplan.exports.common import Engine, Export, UnsupportedByEngine, check_serving, shell_join, shell_script
from meshplan.units import DType

ENGINE_VERSION = "0.5.23"
ENGINE = Engine.SGLANG
SCRIPT = "serve_sglang.sh"

KV_CACHE_DTYPES: dict[DType, str] = {
    DType.BF16: "bf16",
    DType.FP8: "fp8_e4m3",
    DType.FP4: "nvfp4",
}
"""meshplan dtype -> --kv-cache-dtype choice (unset: auto, the model's dtype)."""

QUANTIZATION_METHODS: tuple[str, ...] = (
    "awq",
    "fp8",
    "mxfp8",
    "gptq",
    "gptq_marlin",
    "awq_marlin",
    "bitsandbytes",
    "gguf",
    "modelopt",
    "modelopt_fp8",
    "modelopt_fp4",
    "nvfp4_online",
    "modelopt_mixed",
    "petit_nvfp4",
    "w8a8_int8",
    "w8a8_fp8",
    "moe_wna16",
    "w4afp8",
    "mxfp4",
    "auto-round",
    "auto-round-int8",
    "compressed-tensors",
    "modelslim",
    "mxfp_w4a8",
    "quark",
    "quark_int4fp8_moe",
    "quark_mxfp4",
    "mlx_q4",
    "mlx_q8",
    "unquant",
    "humming",
)
"""--quantization choices of SGLang 0.5.23."""


def sglang_args(
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
    """The launch_server command line of a serving plan."""
    check_serving(
        tp=tp,
        pp=pp,
        ep=ep,
        dp=dp,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        gpu_memory_utilization=gpu_memory_utilization,
    )
    if tp % ep:
        raise UnsupportedByEngine(
            ENGINE, f"spread experts over ep={ep} GPUs outside a tp={tp} group (ep must divide tp)", f"ep={tp}"
        )
    args = ["python", "-m", "sglang.launch_server", "--model-path", model_path]
    args += ["--tp-size", str(tp), "--pp-size", str(pp), "--dp-size", str(dp), "--ep-size", str(ep)]
    if 1 < ep < tp:
        args += ["--moe-dp-size", str(tp // ep)]  # experts replicated over tp / ep groups
    args += ["--context-length", str(max_model_len), "--mem-fraction-static", f"{gpu_memory_utilization:g}"]
    args += ["--max-running-requests", str(max_num_seqs)]
    if kv_cache_dtype is not None:
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise UnsupportedByEngine(ENGINE, f"store the KV cache in {kv_cache_dtype}", "kv_cache_dtype bf16 or fp8")
        args += ["--kv-cache-dtype", KV_CACHE_DTYPES[kv_cache_dtype]]
    if quantization is not None:
        if quantization not in QUANTIZATION_METHODS:
            raise UnsupportedByEngine(ENGINE, f"load {quantization!r} quantized weights", "quantization=None or fp8")
        args += ["--quantization", quantization]
    return args


def export_sglang(
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
    """An SGLang server launcher for a serving plan (same inputs as export_vllm)."""
    tokens = sglang_args(
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
    title = f"SGLang {ENGINE_VERSION} launcher from meshplan: {model_path} on {tp * pp * dp} GPUs"
    notes = ["--mem-fraction-static covers weights and KV cache; leave room for activations and CUDA graphs"]
    if tp * pp * dp > 8:
        notes.append("more than one node: add --nnodes, --node-rank and --dist-init-addr on every node")
    return Export(
        engine=ENGINE,
        engine_version=ENGINE_VERSION,
        files={SCRIPT: shell_script(title=title, predicted=predicted, env={}, tokens=tokens)},
        command=shell_join(tokens),
        notes=tuple(notes),
    )
