"""SGLang export: `python -m sglang.launch_server` arguments for a serving plan.

Target: SGLang 0.5.23 (flag names and choices read from sglang/srt/arg_groups/fields/{parallel,
model,schedule}.py of that release and checked by its own ServerArgs.add_cli_args parser).
SGLang carves expert parallelism out of each replica's TP group: when ep > 1 it requires
ep_size x moe_dp_size = tp_size (sglang/srt/arg_groups/parallel_hook.py), so ep must divide tp.

One ServingPlan feeds both engines, so its fields carry vLLM's names: max_model_len -> --context-length,
gpu_memory_utilization -> --mem-fraction-static, max_num_seqs -> --max-running-requests. Note that
SGLang's static fraction covers weights and the KV pool only, not activations.
"""

from __future__ import annotations

from collections.abc import Mapping

from meshplan.exports.common import (
    DisaggregatedPlan,
    Engine,
    Export,
    ServingPlan,
    UnsupportedByEngine,
    launcher_export,
    pools_export,
    precision_flags,
)
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

POOL_PORTS = {"prefill": 30000, "decode": 30001}
BOOTSTRAP_PORT = 8998
"""The prefill server's bootstrap port (--disaggregation-bootstrap-port, its default; the router names it)."""
TRANSFER_BACKEND = "mooncake"
"""--disaggregation-transfer-backend's default (sglang/srt/arg_groups/fields/disagg.py)."""

KV_CACHE_CLOSEST = "kv_cache_dtype bf16 or fp8"
"""The plan named in place of a KV-cache dtype missing from KV_CACHE_DTYPES."""


def sglang_args(plan: ServingPlan) -> list[str]:
    """The launch_server command line of a serving plan."""
    tp, ep = plan.tp, plan.ep
    if tp % ep:
        raise UnsupportedByEngine(
            ENGINE, f"spread experts over ep={ep} GPUs outside a tp={tp} group (ep must divide tp)", f"ep={tp}"
        )
    if plan.dp_attention and plan.dp > 1:
        raise UnsupportedByEngine(
            ENGINE, f"run {plan.dp} attention-DP replicas from one launch", "dp=1 (one server per replica)"
        )
    dp = tp if plan.dp_attention else plan.dp  # attention-DP: one DP rank per TP rank, experts over all
    args = ["python", "-m", "sglang.launch_server", "--model-path", plan.model_path]
    args += ["--tp-size", str(tp), "--pp-size", str(plan.pp), "--dp-size", str(dp), "--ep-size", str(ep)]
    args += ["--enable-dp-attention"] if plan.dp_attention else []
    if 1 < ep < tp:
        args += ["--moe-dp-size", str(tp // ep)]  # experts replicated over tp / ep groups
    args += ["--context-length", str(plan.max_model_len)]
    args += ["--mem-fraction-static", f"{plan.gpu_memory_utilization:g}"]
    args += ["--max-running-requests", str(plan.max_num_seqs)]
    args += ["--disable-cuda-graph"] if plan.enforce_eager else []
    return args + precision_flags(
        ENGINE, plan, "--kv-cache-dtype", KV_CACHE_DTYPES, KV_CACHE_CLOSEST, "--quantization", QUANTIZATION_METHODS
    )


def export_sglang(plan: ServingPlan, *, predicted: Mapping[str, float] | None = None) -> Export:
    """An SGLang server launcher for a serving plan (the same plan export_vllm takes)."""
    tokens = sglang_args(plan)
    title = f"SGLang {ENGINE_VERSION} launcher from meshplan: {plan.model_path} on {plan.num_gpus} GPUs"
    notes = ["--mem-fraction-static covers weights and KV cache; leave room for activations and CUDA graphs"]
    if plan.num_gpus > 8:
        notes.append("more than one node: add --nnodes, --node-rank and --dist-init-addr on every node")
    return launcher_export(ENGINE, ENGINE_VERSION, SCRIPT, title=title, tokens=tokens, predicted=predicted, notes=notes)


def export_sglang_disaggregated(plan: DisaggregatedPlan, *, predicted: Mapping[str, float] | None = None) -> Export:
    """A prefill server, a decode server (--disaggregation-mode prefill | decode) and the router that joins
    them (sglang_router --pd-disaggregation; SGLang docs, PD Disaggregation)."""
    pd = ["--disaggregation-transfer-backend", TRANSFER_BACKEND]
    prefill = [*sglang_args(plan.prefill), "--port", str(POOL_PORTS["prefill"]), "--disaggregation-mode", "prefill"]
    prefill += [*pd, "--disaggregation-bootstrap-port", str(BOOTSTRAP_PORT)]
    decode = [*sglang_args(plan.decode), "--port", str(POOL_PORTS["decode"]), "--disaggregation-mode", "decode", *pd]
    router = ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    router += ["--prefill", f"http://127.0.0.1:{POOL_PORTS['prefill']}", str(BOOTSTRAP_PORT)]
    router += ["--decode", f"http://127.0.0.1:{POOL_PORTS['decode']}", "--host", "0.0.0.0", "--port", "8000"]
    title = f"SGLang {ENGINE_VERSION} launcher from meshplan: {plan.prefill.model_path}, disaggregated"
    notes = [
        f"prefill pool on {plan.prefill.num_gpus} GPUs, decode pool on {plan.decode.num_gpus} GPUs; the router "
        "(pip install sglang-router) serves on port 8000; replace 127.0.0.1 with each pool's host",
        "--mem-fraction-static covers weights and KV cache; leave room for activations and CUDA graphs",
    ]
    pools = {"prefill": prefill, "decode": decode, "router": router}
    return pools_export(ENGINE, ENGINE_VERSION, plan=plan, title=title, pools=pools, predicted=predicted, notes=notes)
