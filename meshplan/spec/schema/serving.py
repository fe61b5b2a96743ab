"""The fields of serving: how a served model is stored, and the requests, load, engine and latency targets of
``serve`` and ``serve-plan``."""

from __future__ import annotations

from meshplan.spec.conditions import CapacityScheduler
from meshplan.spec.schema.field import MAX_BATCH, MAX_CONTEXT, MAX_GPUS, Field, Group

SERVING_FIELDS: tuple[Field, ...] = (
    Field(
        name="weights_dtype",
        deprecated="dtype",
        type=str,
        default="bf16",
        group=Group.SERVING,
        choices=("bf16", "fp16", "fp8", "int8", "int4", "fp4"),
        help="weight dtype",
    ),
    Field(
        name="kv_dtype",
        type=str,
        default="bf16",
        group=Group.SERVING,
        choices=("bf16", "fp16", "fp8"),
        help="KV-cache dtype (serve, left out: the engine's default for the weights, FP8 with FP8/FP4 weights in "
        "TensorRT-LLM, else the model's 16-bit dtype)",
    ),
    Field(
        name="context",
        type=int,
        default=None,
        group=Group.SERVING,
        unit="tokens",
        lo=1,
        hi=MAX_CONTEXT,
        suffixes=True,
        help="tokens per sequence (default: the model's maximum)",
    ),
    Field(
        name="gpu_memory_utilization",
        type=float,
        default=0.9,
        group=Group.SERVING,
        unit="share",
        lo=0,
        hi=1,
        exclusive_lo=True,
        help=(
            "the engine's memory fraction, read as the engine reads it: vLLM --gpu-memory-utilization (of HBM), "
            "TensorRT-LLM kv_cache_free_gpu_mem_fraction (of what is free after load), SGLang "
            "--mem-fraction-static (of HBM, for weights and KV)"
        ),
    ),
)
_V = Group.SERVE
MAX_LOAD = 1e7
"""Users or requests per second: above any single deployment's traffic."""
SERVE_FIELDS: tuple[Field, ...] = (
    Field(
        name="input_len",
        type=int,
        default=None,
        group=_V,
        unit="tokens",
        lo=1,
        hi=MAX_CONTEXT,
        suffixes=True,
        help="prompt tokens per request",
    ),
    Field(
        name="output_len",
        type=int,
        default=None,
        group=_V,
        unit="tokens",
        lo=1,
        hi=MAX_CONTEXT,
        suffixes=True,
        help="generated tokens per request",
    ),
    Field(
        name="concurrency",
        type=float,
        default=None,
        group=_V,
        unit="users",
        lo=0,
        hi=MAX_LOAD,
        exclusive_lo=True,
        help="users in a closed loop, each sending its next request when the last one ends",
    ),
    Field(
        name="rate",
        type=float,
        default=None,
        group=_V,
        unit="requests/s",
        lo=0,
        hi=MAX_LOAD,
        exclusive_lo=True,
        help="requests arriving per second (Poisson), open loop",
    ),
    Field(
        name="dp_attention", type=bool, default=False, group=_V, help="attention data-parallel over the TP ranks (MoE)"
    ),
    Field(
        name="replicas",
        type=int,
        default=None,
        group=_V,
        unit="replicas",
        lo=1,
        hi=MAX_GPUS,
        help="model replicas (default: gpus / (tp x pp))",
    ),
    Field(
        name="quant",
        type=str,
        default=None,
        group=_V,
        choices=("weight-only", "w-a", "none"),
        help=(
            "weight-only or weight-and-activation quantization, none for 16-bit weights (the quant serve-plan writes "
            "in a layout) (default: W-A where the GPU computes in the dtype)"
        ),
    ),
    Field(
        name="engine",
        type=str,
        default=None,
        group=_V,
        choices=("trtllm", "vllm", "sglang", "gpt-fast", "vllm-0.2"),
        help=(
            "serving engine whose calibrated shares apply (left out: trtllm's, the band widened as for an engine no "
            "published row ran; vllm-0.2: vLLM as it ran in late 2023, op by op, its host work between steps)"
        ),
    ),
    Field(
        name="max_batch",
        type=int,
        default=None,
        group=_V,
        unit="sequences",
        lo=1,
        hi=MAX_BATCH,
        help="cap on sequences per replica",
    ),
    Field(
        name="max_num_tokens",
        type=int,
        default=None,
        group=_V,
        unit="tokens",
        lo=1,
        hi=MAX_CONTEXT,
        suffixes=True,
        help="tokens one forward may carry (decode tokens and prompt chunks; engine default otherwise)",
    ),
    Field(
        name="num_requests",
        type=int,
        default=None,
        group=_V,
        unit="requests",
        lo=1,
        hi=int(MAX_LOAD),
        help=(
            "serve: an offline run of this many identical requests queued at once (trtllm-bench throughput): "
            "the steady state at that concurrency, and the whole run, ramp and drain included"
        ),
    ),
    Field(
        name="batch",
        type=int,
        default=None,
        group=_V,
        unit="sequences",
        lo=1,
        hi=MAX_BATCH,
        help=(
            "serve: a static batch of this many identical prompts (over all replicas), prefilled together in the "
            "engine's tokens-per-step chunks and then decoded together, as benchmark scripts and profilers run "
            "them: TTFT is the whole batch's prefill, TPOT the decode step at that batch"
        ),
    ),
    Field(
        name="int4_group_size",
        type=int,
        default=None,
        group=_V,
        unit="weights",
        lo=1,
        hi=1 << 20,
        help=(
            "int4 weights: weights per quantization group, each with a 16-bit scale and zero (AWQ/GPTQ and "
            "TensorRT-LLM's int4_awq: 128; gpt-fast's quantize.py: 32; default: the engine's)"
        ),
    ),
    Field(
        name="allow_quantization",
        type=bool,
        default=False,
        group=_V,
        help=(
            "serve-plan: also search weights quantized below the model's published dtype (fp8, int8, int4, fp4), "
            "which changes the model's quality"
        ),
    ),
    Field(
        name="cuda_graph_padding",
        type=bool,
        default=False,
        group=_V,
        help=(
            "decode-only steps replay CUDA graphs padded to the captured batch sizes 1, 2, 4 ... 256, 384, 512, "
            "1024 ... 8192 (TensorRT-LLM cuda_graph_config enable_padding)"
        ),
    ),
    Field(
        name="capacity_scheduler",
        type=str,
        default=None,
        group=_V,
        choices=tuple(p.value for p in CapacityScheduler),
        help=(
            "TensorRT-LLM's capacity scheduler policy: guaranteed-no-evict admits a request only with KV room for "
            "its whole sequence (trtllm-bench's and the LLM API's default), max-utilization as its cache grows, "
            "pausing requests when it runs out (trtllm-bench --scheduler_policy, scheduler_config "
            "capacity_scheduler_policy); unset: the engine's own (paging engines always grow)"
        ),
    ),
    Field(
        name="speculative",
        type=str,
        default=None,
        group=_V,
        help=(
            "serve: speculative decoding, METHOD:K with K drafted tokens a step: draft:K (a smaller model, "
            "--draft-model), mtp:K (the model's multi-token-prediction layer) or eagle:K (an EAGLE head); needs "
            "--spec-acceptance"
        ),
    ),
    Field(
        name="spec_acceptance",
        type=float,
        default=None,
        group=_V,
        unit="share",
        lo=0,
        hi=1,
        help="serve --speculative: the chance each drafted token is accepted (as measured for the drafter and data)",
    ),
    Field(
        name="draft_model",
        type=str,
        default=None,
        group=_V,
        help="serve --speculative draft:K: the draft model (a catalog name or a model file)",
    ),
    Field(
        name="prefix_hit_rate",
        type=float,
        default=None,
        group=_V,
        unit="share",
        lo=0,
        hi=1,
        help=(
            "serve: share of each prompt found in the engine's prefix cache (vLLM, SGLang): prefill computes the "
            "rest, at least the last token; the cached prefix still takes KV memory"
        ),
    ),
    Field(
        name="disaggregate",
        type=str,
        default=None,
        group=_V,
        help="serve: P:D, GPUs of the prefill pool and of the decode pool",
    ),
    Field(
        name="ttft_p99",
        type=float,
        default=None,
        group=_V,
        unit="s",
        lo=0,
        hi=1e6,
        exclusive_lo=True,
        help="p99 time-to-first-token target",
    ),
    Field(
        name="tpot_p99",
        type=float,
        default=None,
        group=_V,
        unit="s",
        lo=0,
        hi=1e6,
        exclusive_lo=True,
        help="p99 time-per-output-token target",
    ),
    Field(
        name="serve_objective",
        alias="objective",
        type=str,
        default="throughput",
        group=_V,
        choices=("throughput", "latency", "fewest-gpus"),
        help="what ranks the serving plans",
    ),
    Field(
        name="weights_dtypes",
        type=str,
        default=None,
        group=_V,
        help="weight dtypes serve-plan searches, comma-separated (default: every one the GPU runs)",
    ),
    Field(
        name="search_disaggregated",
        type=bool,
        default=False,
        group=_V,
        help="serve-plan: also split replicas into prefill and decode pools",
    ),
)
