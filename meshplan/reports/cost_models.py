"""The shape of the cost, checkpoint and goodput keys (reports/cost.py, reports/plan_cost.py) in the typed report
models of reports/models.py and reports/serve_models.py."""

from typing import NotRequired  # pydantic reads these on Python < 3.12 (the OpenAPI)

from typing_extensions import TypedDict


class CostJSON(TypedDict):
    price_per_gpu_hour: float
    cost_per_million_tokens: float
    cost_total: NotRequired[float]


class CheckpointJSON(TypedDict):
    bytes_total: float
    bytes_per_gpu: float
    weight_bytes_per_param: float
    optimizer_bytes_per_param: float
    bandwidth_bytes_per_s_per_node: float
    nodes: int
    save_s: float


class GoodputJSON(TypedDict):
    mtbf_gpu_hours: float
    job_mtbf_hours: float
    restart_s: float
    interval_s: float
    interval_steps: float
    interval_source: str
    optimal_interval_s: float
    waste_s_per_failure: float
    checkpoint_overhead_fraction: float
    failure_overhead_fraction: float
    goodput_fraction: float
    wall_time_days: NotRequired[float | None]
    gpu_hours_total: NotRequired[float | None]
    failures_total: NotRequired[float | None]
    cost_total: NotRequired[float | None]


class FleetCostJSON(TypedDict):
    gpus: int
    fits: bool
    step_time_s: NotRequired[float]
    tokens_per_s_per_gpu: NotRequired[float]
    wall_time_days: NotRequired[float | None]
    gpu_hours_total: NotRequired[float | None]
    goodput_fraction: NotRequired[float]
    cost_total: NotRequired[float | None]
    meets_deadline: NotRequired[bool | None]


class CheapestFleetJSON(TypedDict):
    gpus: int
    searched_from: int
    tokens: float
    days: float | None
    fleets: list[FleetCostJSON]


class ServeCostJSON(TypedDict):
    price_per_gpu_hour: float
    cost_per_million_output_tokens: float | None
