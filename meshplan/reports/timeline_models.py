"""The shape of ``estimate``'s ``timeline`` key (reports/timeline.py) in the typed report models of
reports/models.py."""

from typing_extensions import TypedDict


class IntervalJSON(TypedDict):
    start_s: float
    end_s: float
    kind: str
    axis: str | None
    exposed: bool
    what: str
    micro_batch: int | None
    chunk: int | None
    count: int


class RowTotalsJSON(TypedDict):
    step_time_s: float
    compute_s: float
    bubble_s: float
    optimizer_s: float
    host_s: float
    exposed_comm_s: float
    exposed_tp_s: float
    exposed_cp_s: float
    exposed_ep_s: float
    exposed_pp_s: float
    exposed_dp_s: float


class StageRowJSON(TypedDict):
    stage: int
    intervals: list[IntervalJSON]
    hidden: list[IntervalJSON]
    totals: RowTotalsJSON


class StageMemoryJSON(TypedDict):
    stage: int
    peak_bytes: float
    base_bytes: float
    activations_bytes: float
    most_chunks_held: float
    points: list[list[float]]


class PlacementAxisJSON(TypedDict):
    size: int
    stride: int
    crosses_fabric: bool
    link: str
    group_of_rank_0: list[int]


class PlacementDrawingJSON(TypedDict):
    gpus: int
    gpus_per_node: int
    nodes: int
    ranks_drawn: int
    axis_order: list[str]
    axes: dict[str, PlacementAxisJSON]
    scale_up: str
    scale_out: str


class TimelineJSON(TypedDict):
    schedule: str
    drawn_as: str
    pp: int
    vpp: int
    micro_batches: int
    slot_send_s: float
    bubble_scale: float
    totals: RowTotalsJSON
    stages: list[StageRowJSON]
    memory: list[StageMemoryJSON]
    placement: PlacementDrawingJSON
