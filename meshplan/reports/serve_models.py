"""The shape of the serving reports (``serving``, ``serve``, ``serve-plan`` and the explorer's serving bar): typed
models like those of reports/models.py, held to the same contract by tests/test_json_contract.py."""

from typing import (
    Any,
    NotRequired,  # pydantic reads these on Python < 3.12 (the OpenAPI)
)

from typing_extensions import TypedDict

from meshplan.reports.cost_models import ServeCostJSON


class ServingReport(TypedDict):
    model: str
    gpu: str
    gpus: int
    tp: int
    pp: int
    ep: int
    replicas: int
    dtype: str
    kv_dtype: str
    context: int
    engine: str
    memory_fraction: float
    memory_fraction_of: str
    weights_bytes_per_gpu: float
    kv_bytes_per_token_per_gpu: float
    kv_bytes_per_token_total: float
    kv_bytes_per_sequence_per_gpu: float
    activations_bytes_per_gpu: float
    runtime_reserve_bytes_per_gpu: float
    engine_headroom_bytes_per_gpu: float
    usable_bytes_per_gpu: float
    kv_budget_bytes_per_gpu: float
    kv_capacity_tokens_per_replica: int
    max_concurrent_sequences_total: int
    max_concurrent_sequences_per_replica: int
    fits: bool
    warnings: list[str]


class ServingBarJSON(TypedDict):
    sequences: int
    terms: list[dict[str, Any]]
    total_bytes: float


class ServingBarReport(ServingReport):
    """``GET /api/serving``: the serving report and the explorer's bar for ``sequences`` sequences."""

    bill: ServingBarJSON


class ServeLayoutJSON(TypedDict):
    tp: int
    pp: int
    ep: int
    dp_attention: bool
    replicas: NotRequired[int]
    weights_dtype: NotRequired[str]
    kv_dtype: NotRequired[str]
    quant: NotRequired[str]


class StepPartsJSON(TypedDict):
    weights_read_s: float
    kv_read_s: float
    compute_s: float
    communication_s: float
    overhead_s: float
    host_wait_s: float
    """The GPU waiting for the host to issue its kernels (--launch eager or compile); 0 under CUDA graphs"""


class OfflineRunJSON(TypedDict):
    num_requests: int
    steps: int
    run_s: float
    tokens_per_s_per_gpu: float
    tokens_per_s_total: float
    mean_batch_per_replica: float
    decode_only_share: float


class StaticBatchJSON(TypedDict):
    batch: int
    batch_per_replica: int
    prefill_forwards: int
    ttft_s: float
    ttft_s_p10: float
    ttft_s_p90: float
    decode_s: float
    run_s: float


class DefaultAppliedJSON(TypedDict):
    setting: str
    value: str
    source: str


class ServeReport(TypedDict):
    model: str
    gpu: str
    gpus: int
    engine: str
    engine_source: str
    """flag (--engine given) or default (none stated: trtllm's constants, the band widened as for an unseen engine)"""
    launch: str
    """cudagraph (the engines' default), eager or compile: how the host issues each layer's kernels (--launch)"""
    kv_admission: str
    """whole-sequence (TensorRT-LLM's GUARANTEED_NO_EVICT) or growing (the paging engines; --capacity-scheduler
    max-utilization): what the KV cache reserves for a request, as the batch cap counts it"""
    layout: ServeLayoutJSON
    weights_dtype: str
    kv_dtype: str
    quant: str
    input_len: int
    output_len: int
    concurrency_total: float | None
    rate_per_s_total: float | None
    weights_bytes_per_gpu: float
    kv_bytes_per_token_per_gpu: float
    activations_bytes_per_gpu: float
    runtime_reserve_bytes_per_gpu: float
    engine_headroom_bytes_per_gpu: float
    kv_budget_bytes_per_gpu: float
    memory_fraction: float
    memory_fraction_of: str
    ttft_s_p50: float
    ttft_s_p99: float
    ttft_s_mean: float
    ttft_s_unloaded: float
    queue_s_p50: float
    queue_s_p99: float
    tpot_s: float
    tpot_s_p50: float
    tpot_s_p99: float
    itl_s: float
    itl_s_p99: float
    tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float
    tokens_per_s_total: float
    requests_per_s_total: float
    batch_per_replica: float
    batch_limit: str
    batch_cap_per_replica: int
    batch_cap_limit: NotRequired[str]
    """What sets the cap: kv-cache, max-batch or max-tokens (the engine's caps, or the user's --max-batch)."""
    kv_sequences_per_replica: int
    saturated: bool
    knee_batch_per_replica: int
    max_tokens_per_s_per_gpu: float
    step_s: StepPartsJSON
    calibration_source: str
    tpot_s_p10: float
    tpot_s_p90: float
    ttft_s_unloaded_p10: float
    ttft_s_unloaded_p90: float
    tokens_per_s_per_gpu_p10: float
    tokens_per_s_per_gpu_p90: float
    load_band: NotRequired[dict[str, list[float | None]]]
    """P10 and P90 of each figure under load (TTFT and TPOT percentiles, the batch in flight): the load on a machine
    that much slower or faster, re-solved under Poisson arrivals; None where it cannot keep up (colocated loads)."""
    band_sources: dict[str, int]
    """Sources behind each band (tpot, ttft, tokens_per_s): the engine family's in its class, else the class's."""
    band_widened: list[str]
    """Why a band is wider than its rows give: an engine, GPU kind or model class no published row ran."""
    uncertainty: str
    defaults_applied: list[DefaultAppliedJSON]
    warnings: list[str]
    disaggregated: NotRequired[dict[str, Any]]
    offline: NotRequired[OfflineRunJSON]
    cost: NotRequired[ServeCostJSON]
    static_batch: NotRequired[StaticBatchJSON]
    speculative: NotRequired[dict[str, Any]]
    prefix_cache: NotRequired[dict[str, Any]]


class ServePlanItemJSON(TypedDict):
    layout: ServeLayoutJSON
    batch_cap_per_replica: int
    kv_sequences_per_replica: int
    ttft_s_p99: float
    tpot_s: float
    tpot_s_p99: float
    tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float
    gpus: int
    replicas: int
    prefill_replicas: int


class ServeParetoJSON(TypedDict):
    layout: ServeLayoutJSON
    batch_cap_per_replica: int
    tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float


class RejectedJSON(TypedDict):
    layout: ServeLayoutJSON
    reason: str


class TargetsJSON(TypedDict):
    ttft_s_p99: float | None
    tpot_s_p99: float | None


class ServePlanReport(TypedDict):
    model: str
    gpu: str
    gpus: int
    engine: str
    objective: str
    best: ServePlanItemJSON | None
    top: list[ServePlanItemJSON]
    pareto: list[ServeParetoJSON]
    pareto_points_total: int
    rejected: list[RejectedJSON]
    layouts_evaluated: int
    points_evaluated: int
    layouts_meeting_targets: int
    elapsed_s: float
    input_len: int
    output_len: int
    targets: TargetsJSON
    disaggregate_searched: bool
    concurrency_total: float | None
    engine_source: str
    """flag (--engine given) or default (none stated: trtllm's constants, the band widened as for an unseen engine)"""
    launch: str
    """cudagraph (the engines' default), eager or compile: how every layout was timed launching its kernels"""
    node_size: int | None
    """the fleet's node (--node-size; null: the GPU kind's own scale-up domain)"""
    capacity_scheduler: str | None
    """TensorRT-LLM's admission policy every layout was timed with (--capacity-scheduler; null: the engine's own)"""
    uncertainty: str
    weights_dtypes_searched: list[str]
    prefix_hit_rate: float | None
    speculative: str | None
    spec_acceptance: float | None
    warnings: list[str]
    fewest_gpus: NotRequired[dict[str, Any]]
