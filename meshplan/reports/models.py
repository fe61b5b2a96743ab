"""The shape of every report: one typed model per command's JSON and API response.

The reports are plain dicts (what ``--json`` prints and the API sends, byte for byte); these TypedDicts say
which keys each holds and of what type. The API publishes them as its response schemas in the OpenAPI, and
tests/test_json_contract.py validates every command's real output against its model with unknown keys refused,
so the contract, its documentation (docs/json.md) and the code cannot drift apart. Names follow one rule:
quantity, unit, then scope.
"""

from typing import (
    Any,
    NotRequired,  # pydantic reads these on Python < 3.12 (the OpenAPI)
)

from typing_extensions import TypedDict

from meshplan.reports.cost_models import CheapestFleetJSON, CheckpointJSON, CostJSON, GoodputJSON
from meshplan.reports.serve_models import ServePlanReport, ServeReport, ServingReport
from meshplan.reports.timeline_models import TimelineJSON


class LayoutJSON(TypedDict):
    tp: int
    pp: int
    vpp: int
    cp: int
    ep: int
    expert_tp: int
    dp_shard: int
    dp_replicate: int
    zero: int
    sp: bool
    recompute: str
    schedule: str
    cp_kind: str
    micro_batch: int


class BillJSON(TypedDict):
    """One GPU's bill, by term (bytes)."""

    weights_bytes: float
    adapter_weights_bytes: float
    gradients_bytes: float
    master_weights_bytes: float
    optimizer_moments_bytes: float
    activations_bytes: float
    logits_bytes: float
    activation_workspace_bytes: float
    dequant_workspace_bytes: float
    comm_buffers_bytes: float
    framework_bytes: float
    fragmentation_bytes: float
    runtime_reserve_bytes: float
    optimizer_bytes: float
    total_bytes: float
    allocated_bytes: NotRequired[float]
    reserved_bytes: NotRequired[float]


class TermJSON(TypedDict):
    name: str
    title: str
    what: str
    formula: str
    source: str
    value_bytes: float


class FrozenJSON(TypedDict):
    embeddings: bool
    layers: int


class ConditionJSON(TypedDict):
    value: Any
    source: str


class StackJSON(TypedDict):
    """The training stack a report's numbers assume and how it differs from the stack's own defaults."""

    stack: str
    stack_source: str
    """flag, engine or default"""
    conditions: dict[str, ConditionJSON]
    differs_from_stack: list[str]


class TrainsJSON(StackJSON):
    """What trains and how the run was set up: every training report carries these."""

    finetune: str
    trainable_params: int
    lora_train_embeddings: NotRequired[bool]
    qlora_base: NotRequired[str]
    quant_group_size: NotRequired[int]
    lora_rank: NotRequired[int]
    lora_targets: NotRequired[list[str]]
    frozen: NotRequired[FrozenJSON]


class MemoryReport(TrainsJSON):
    model: str
    gpu: str
    gpus: int
    seq: int
    global_batch: int
    precision: str
    layout: LayoutJSON
    per_gpu: BillJSON
    heaviest_stage: int
    hbm_bytes_per_gpu: float
    free_bytes_per_gpu: float
    hbm_pressure: float
    fits: bool
    warnings: list[str]
    stages: list[BillJSON]
    terms: list[TermJSON]


class BreakdownJSON(TypedDict):
    compute_s: float
    exposed_comm_s: float
    bubble_s: float
    optimizer_s: float
    host_s: float
    exposed_tp_s: float
    exposed_cp_s: float
    exposed_ep_s: float
    exposed_pp_s: float
    exposed_dp_s: float


class CollectiveJSON(TypedDict):
    strategy: str
    op: str
    axis: str
    phase: str
    group_size: int
    size_bytes_per_call: float
    count_per_step: float
    link: str
    crosses_fabric: bool
    time_s_per_step: float
    exposed_s_per_step: float


class AxisPlacementJSON(TypedDict):
    size: int
    stride: int
    inside_domain: int
    domains: int
    link: str
    crosses_fabric: bool


class TimeToTrainJSON(TypedDict):
    tokens_total: float
    wall_time_days: float
    gpu_hours_total: float


class PublishedMfuJSON(TypedDict):
    gpu: str
    layout_class: str
    matmul: str
    runs: int
    sources: int
    mfu_min: float | None
    mfu_max: float | None
    highest_run: str | None
    above: bool | None


class HostJSON(TypedDict):
    launch: str
    bound: bool
    host_s_per_layer: float
    gpu_s_per_layer: float


class EstimateReport(MemoryReport):
    step_time_s: float
    mfu: float
    hfu: float
    mfu_fp8_peak: float | None
    mfu_convention: str
    tokens_per_s_per_gpu: float
    attention_kernel: str
    breakdown: BreakdownJSON
    host: HostJSON
    collectives: list[CollectiveJSON]
    placement: dict[str, AxisPlacementJSON]
    axis_order: list[str]
    published_mfu: PublishedMfuJSON
    time_to_train: NotRequired[TimeToTrainJSON]
    cost: NotRequired[CostJSON]
    checkpoint: NotRequired[CheckpointJSON]
    goodput: NotRequired[GoodputJSON]
    timeline: NotRequired[TimelineJSON]
    step_time_s_p10: float
    step_time_s_p90: float
    step_time_band_sources: int | None
    uncertainty: str


class ComponentsJSON(TypedDict):
    embedding: int
    attention: int
    mlp: int
    routed_experts: int
    shared_experts: int
    router: int
    norms: int
    lm_head: int


class ParamsReport(TypedDict):
    model: str
    total_params: int
    active_params_per_token: int
    by_component: ComponentsJSON
    mtp_params: int
    finetune: NotRequired[str]
    trainable_params: NotRequired[int]
    frozen_params: NotRequired[int]
    adapter_params: NotRequired[int]
    trainable_fraction: NotRequired[float]
    lora_rank: NotRequired[int]
    lora_targets: NotRequired[list[str]]
    frozen: NotRequired[FrozenJSON]


class VariantJSON(TypedDict):
    change: str
    layout: LayoutJSON
    step_time_s: float


class FitNothingJSON(TypedDict):
    fewest_gpus_that_fit: int | None
    variants: list[str]


class WeightSplitJSON(TypedDict):
    tp: int
    pp: int
    weights_bytes_per_gpu: float


class FitTriedJSON(TypedDict):
    gpus: int
    fits: bool


class FitLayoutJSON(TypedDict):
    dp_shard: int
    zero: int


class FitReport(StackJSON):
    model: str
    gpu: str
    gpus: int
    dtype: str
    precision: str
    weights_bytes_total: float
    weights_bytes_per_gpu_even_split: float
    hbm_bytes_per_gpu: float
    hbm_fraction_per_gpu: float
    free_bytes_per_gpu: float
    free_bytes_total: float
    headroom_fraction: float
    seq: int
    fits: bool
    weights_split: WeightSplitJSON | None
    min_gpus_for_weights: int | None
    min_gpus_for_weights_split: WeightSplitJSON | None
    training_state_bytes_per_param: float
    training_state_bytes_total: float
    training_fits: bool
    min_gpus_for_training: int | None
    min_gpus_for_training_tried: list[FitTriedJSON]
    training_variants: list[VariantJSON]
    finetune: NotRequired[str]
    trainable_params: NotRequired[int]
    lora_rank: NotRequired[int]
    lora_targets: NotRequired[list[str]]
    frozen: NotRequired[FrozenJSON]
    layout: NotRequired[FitLayoutJSON]
    max_micro_batch: NotRequired[int]
    max_seq_len: NotRequired[int]
    max_micro_batch_with_recompute: NotRequired[int]
    max_seq_len_with_recompute: NotRequired[int]
    nothing_fits: NotRequired[FitNothingJSON]


class PlanItemJSON(TypedDict):
    layout: LayoutJSON
    step_time_s: float
    step_time_s_p10: float
    step_time_s_p90: float
    mfu: float
    hfu: float
    mfu_fp8_peak: float | None
    tokens_per_s_per_gpu: float
    per_gpu: BillJSON
    free_bytes_per_gpu: float
    hbm_pressure: float
    near_capacity: bool
    breakdown: dict[str, float]
    placement: dict[str, AxisPlacementJSON]
    ties_with_best: bool
    published_mfu: PublishedMfuJSON
    time_to_train_days: NotRequired[float]
    gpu_hours_total: NotRequired[float]
    cost: NotRequired[CostJSON]
    goodput: NotRequired[GoodputJSON]


class ParetoPointJSON(TypedDict):
    step_time_s: float
    memory_bytes_per_gpu: float
    layout: LayoutJSON


class ExplainRowJSON(TypedDict):
    term: str
    unit: str
    value_a: float
    value_b: float
    difference: float


class ExplainJSON(TypedDict):
    a: str
    b: str
    rows: list[ExplainRowJSON]
    why: str
    named: NotRequired[dict[str, Any]]
    filled: NotRequired[dict[str, Any]]
    filled_with: NotRequired[str]


class DeadlineTriedJSON(TypedDict):
    gpus: int
    meets_deadline: bool
    days: float | None


class FewestJSON(TypedDict):
    gpus: int
    searched_from: int
    tokens: float
    days: float
    tried: list[DeadlineTriedJSON]
    sizes_in_bracket: int
    sizes_untried_below: int


class NothingFitsJSON(TypedDict):
    lightest_layout: LayoutJSON | None
    lightest_bytes_per_gpu: float
    budget_bytes_per_gpu: float
    fewest_gpus_that_fit: int | None
    fleet_sizes_tried: list[FitTriedJSON]
    variants: list[VariantJSON]


class PlanReport(TrainsJSON):
    model: str
    gpu: str
    gpus: int
    seq: int
    global_batch: int
    global_batch_tokens: int
    objective: str
    engine: str | None
    mfu_convention: str
    headroom_fraction: float
    evaluated: int
    feasible: int
    elapsed_s: float
    plans: list[PlanItemJSON]
    pareto: list[ParetoPointJSON]
    rejections: dict[str, int]
    uncertainty: str
    not_searched: list[str]
    ties: str | None
    warnings: list[str]
    fewest_gpus: NotRequired[FewestJSON]
    explain: NotRequired[list[ExplainJSON]]
    nothing_fits: NotRequired[NothingFitsJSON]
    cheapest_fleet: NotRequired[CheapestFleetJSON]
    checkpoint: NotRequired[CheckpointJSON]


class LinkRaceJSON(TypedDict):
    link: str
    tier: str
    bandwidth_bytes_per_s: float
    bandwidth_only_s: float
    modeled_s: float
    ratio_bandwidth_only: float
    ratio_modeled: float


class CollectivesReport(TypedDict):
    model: NotRequired[str]
    op: str
    bus_factor: str
    group_size: int
    size_bytes: float
    links: list[LinkRaceJSON]
    tp_collectives_per_forward: NotRequired[int]
    tp_collectives_per_step_per_micro_batch: NotRequired[int]
    note: str


class ListItemJSON(TypedDict):
    name: str
    description: NotRequired[str]
    hbm_bytes_per_gpu: NotRequired[float]
    bandwidth_bytes_per_s_per_direction: NotRequired[float]
    params_total: NotRequired[int]
    layers: NotRequired[int]
    moe: NotRequired[bool]


class ListReport(TypedDict):
    kind: str
    items: list[ListItemJSON]


REPORTS: dict[str, type] = {
    "params": ParamsReport,
    "memory": MemoryReport,
    "fit": FitReport,
    "serving": ServingReport,
    "estimate": EstimateReport,
    "collectives": CollectivesReport,
    "plan": PlanReport,
    "list": ListReport,
    "serve": ServeReport,
    "serve-plan": ServePlanReport,
}
"""Command (and API endpoint) name to its report model."""
