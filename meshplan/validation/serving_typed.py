"""Published serving rows typed as a user types ``meshplan serve``, and the bare roofline every row is held against.

The released sources beyond the engines' own tables (Splitwise's profiled static batches, NVIDIA NIM's sweep over
concurrency) are predicted through ``serve``'s own path with only what each source states: the model, the GPU
kind, the GPUs, TP, the weights where stated, the lengths and the load (``--batch N`` for a static batch,
``--concurrency C`` for a closed loop), and ``--engine`` where the source states the engine that ran. What a source
leaves unstated (the engine, the KV dtype, the engine's caps and memory fraction) is serve's default, as a user who
does not know them gets it: a row of a source that states no engine (Splitwise's CSV; NIM's page, which names the
container but not the backend inside it) is typed without ``--engine`` and takes the band of a question that states
none (TensorRT-LLM's constants, widened as for an unseen engine). Each row carries several
metrics; each is a row of its own metric class:

  phase_latency_profile   prefill_time_ms (the batch's TTFT: prefill)   decode_step_time_ms (TPOT: decode)
  serving_closed_loop     ttft_ms (mean TTFT: prefill)   itl_ms (decode)   output_tokens_per_s_total (throughput)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from meshplan.core.serving.load import Requests, load_point
from meshplan.core.serving.shape import Hardware
from meshplan.core.serving.static import static_batch
from meshplan.reports.serve_coverage import row_model
from meshplan.reports.serve_setup import Setup, resolve

TYPED_KINDS = ("phase_latency_profile", "serving_closed_loop")
"""Row kinds predicted as ``serve`` answers the flags a user types."""
METRIC_CLASS = {
    "prefill_time_ms": "prefill",
    "ttft_ms": "prefill",
    "decode_step_time_ms": "decode",
    "itl_ms": "decode",
}
"""The metric class of each metric of a typed row; a throughput is throughput-dense or -moe by its model."""
STATED_DTYPES = ("fp16", "bf16", "fp8", "fp4", "int8", "int4")
TYPED_BY_DEFAULTS = {
    "splitwise_perf_csv": "the CSV states no dtype (fp16 inferred by the transcriber: serve's bf16 default, the "
    "same bytes and speed), left to serve's default as a user who does not know it leaves it",
}
"""Released sources the shared file marks unclean only for settings ``serve`` fills with its defaults: counted as
typed (their rows are what a user of serve gets), the unstated settings named in each row's reason."""


STATED_ELSEWHERE = {
    "splitwise_perf_csv": (
        {"engine": "vllm-0.2"},
        "the paper the CSV comes with states the engine (Patel et al. 2024, Sec. 3: 'Unless stated otherwise, we run "
        "BLOOM-176B and Llama-70B on vLLM'), and its time the release: its first version (arXiv 2311.18677v1, 30 "
        "November 2023) predates vLLM's CUDA graphs (vllm-project/vllm pull request 1926, December 2023) and its "
        "NCCL control plane (pull request 2221): vLLM 0.2 (--engine vllm-0.2: op by op, Ray workers)",
    ),
}
"""Conditions a source's own publication states beside its data file (the shared file's row leaves them out), as
``serve`` flags, with where each is stated: a user reading that publication types them."""


def stated_elsewhere(source_id: str) -> tuple[dict[str, str], str]:
    """The ``serve`` flags a source's publication states beyond its data file, and where (none: empty)."""
    return STATED_ELSEWHERE.get(source_id, ({}, ""))


ENGINE_FLAGS = {"tensorrt-llm": "trtllm", "vllm": "vllm", "sglang": "sglang", "gpt-fast": "gpt-fast"}
"""The ``--engine`` a user types for an engine a source names (by the start of its name, lowercased)."""


def stated_engine_flag(row: dict[str, Any]) -> str | None:
    """The row's ``--engine``: None where its source states no engine (the shared file lists the engine among what
    the row leaves unstated: ``missing``)."""
    elsewhere, _ = stated_elsewhere(row["source"]["id"])
    if "engine" in elsewhere:
        return str(elsewhere["engine"])
    if any(m.startswith("engine") for m in row.get("missing", [])):
        return None
    name = str(row["engine"].get("name", "")).lower()
    for start, flag in ENGINE_FLAGS.items():
        if name.startswith(start):
            return flag
    raise ValueError(
        f"{row['id']}: the source names the engine {row['engine'].get('name')!r}, which serve has no flag for"
    )


def typed_flags(row: dict[str, Any], *, kv_dtype: str | None = None) -> dict[str, Any]:
    """``serve``'s keyword arguments for a typed row, with only what the source states (``kv_dtype``: a KV dtype to
    force, e.g. serve's earlier bf16 default; None: serve's default today)."""
    par, w = row["parallel"], row["workload"]
    flags: dict[str, Any] = {
        "gpu": row["hardware"]["catalog"],
        "gpus": par["tp"] * par["pp"],
        "tp": par["tp"],
        "pp": par["pp"],
        "input_len": int(w["isl"]),
        "output_len": int(w["osl"]),
    }
    weights = str(row["precision"].get("weights", ""))
    if weights in STATED_DTYPES:  # stated as such, not inferred
        flags["weights_dtype"] = weights
    if kv_dtype is not None:
        flags["kv_dtype"] = kv_dtype
    engine = stated_engine_flag(row)
    if engine is not None:
        flags["engine"] = engine
    launch = stated_elsewhere(row["source"]["id"])[0].get("launch")
    if launch is not None:
        flags["launch"] = launch
    if row["kind"] == "phase_latency_profile":
        flags["batch"] = int(w["batch"])
    else:
        flags["concurrency"] = float(w["concurrency"])
    return flags


def typed_setup(row: dict[str, Any], *, kv_dtype: str | None = None) -> tuple[Setup, dict[str, Any]]:
    """The setup ``serve`` resolves for the row's flags, and the flags."""
    flags = typed_flags(row, kv_dtype=kv_dtype)
    model = row_model(row)
    if model is None:
        raise ValueError(f"{row['id']}: no catalog model for {row['model'].get('name')!r}")
    setup = resolve(
        model,
        gpu=flags["gpu"],
        gpus=flags["gpus"],
        tp=flags["tp"],
        pp=flags["pp"],
        weights_dtype=flags.get("weights_dtype"),
        kv_dtype=flags.get("kv_dtype"),
        engine=flags.get("engine"),
        context=flags["input_len"] + flags["output_len"],
        launch=flags.get("launch"),
    )
    return setup, flags


def predict_typed(setup: Setup, flags: dict[str, Any], metric: str) -> float:
    """The row's ``metric`` as ``serve`` computes it for ``flags`` on ``setup`` (one replica: the rows' GPUs are one
    TP group)."""
    m, sh, hw, lay = setup.model, setup.shape, setup.hw, setup.layout
    isl, osl = flags["input_len"], flags["output_len"]
    if "batch" in flags:
        sb = static_batch(m, sh, hw, lay, batch=flags["batch"], input_len=isl, output_len=osl)
        return {"prefill_time_ms": 1e3 * sb.ttft_s, "decode_step_time_ms": 1e3 * sb.tpot_s}[metric]
    pt = load_point(m, sh, hw, lay, Requests(input_len=isl, output_len=osl, concurrency=flags["concurrency"]))
    if metric == "ttft_ms":
        return math.inf if pt.ttft_s_mean is None else 1e3 * pt.ttft_s_mean
    if metric == "itl_ms":
        return 1e3 * pt.tpot_s
    if metric == "output_tokens_per_s_total":
        return pt.output_tokens_per_s * setup.replicas
    raise ValueError(f"{metric!r} is no metric of a typed row")


def typed_metric_class(row: dict[str, Any], metric: str) -> str:
    if metric in METRIC_CLASS:
        return METRIC_CLASS[metric]
    return "throughput-moe" if row["model"]["arch"].startswith("moe") else "throughput-dense"


def ideal_setup(setup: Setup) -> Setup:
    """The bare roofline: ideal HBM and tensor cores, no overheads, free links, no shape penalty, no padded rows."""
    cal = dataclasses.replace(
        setup.hw.cal,
        hbm_efficiency=1.0,
        kv_read_share=1.0,
        weight_only_bandwidth_share={},
        matmul_share={},
        moe_matmul_share=1.0,
        attention_efficiency=1.0,
        step_overhead_s=0.0,
        layer_overhead_s=0.0,
        prefill_layer_overhead_s=0.0,
        allreduce_latency_s=0.0,
        allreduce_latency_per_rank_s=0.0,
        two_batch_overlap=False,
        ep_overlap=1.0,
        ep_overlap_decode=1.0,
        ep_imbalance=1.0,
        pp_efficiency=1.0,
        cuda_graph_padding=False,
    )
    gpu = dataclasses.replace(
        setup.hw.gpu,
        calibration=dataclasses.replace(
            setup.hw.gpu.calibration, matmul_half_dim=0.0, matmul_efficiency_max=1.0, fp8_matmul_ratio=1.0
        ),
    )
    free = dataclasses.replace(setup.hw.scale_up, bandwidth_bytes_per_s=1e30, latency_s=0.0)
    hw = Hardware(gpu=gpu, scale_up=free, scale_out=free, cal=cal)
    shape = dataclasses.replace(setup.shape, gemm_depth=1.0, expert_depth=1.0)  # every GEMM on the plateau
    return dataclasses.replace(setup, hw=hw, shape=shape)
