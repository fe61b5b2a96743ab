"""The planner's answers about the fleet's size, for ``plan`` and ``fit`` alike: the fewest GPUs on which a layout
fits, the fewest that train a token budget within a deadline, and what would fit when nothing does.

Every count named here was searched and a layout of it fitted (``search.fleet.fewest``); the sizes tried are
returned with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from meshplan.core.placement import DEFAULT_ORDER
from meshplan.reports.inputs import layout_dict
from meshplan.reports.pins import pinned_space
from meshplan.search.fleet import Fewest, Probe, fewest, fleet_sizes
from meshplan.search.order import Objective
from meshplan.search.rank import HEADROOM, SearchResult, search
from meshplan.spec.cluster import Cluster
from meshplan.spec.finetune import Finetune, FinetuneMode
from meshplan.spec.model import ModelSpec
from meshplan.spec.requests import MAX_GPUS
from meshplan.spec.workload import Workload

GROWTH = 64
"""How much larger than the fleet the search for the fewest GPUs that fit goes, when nothing fits."""

Fleet = Callable[..., Cluster]
"""The fleet of a size: ``fleet(gpus=n)``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchRules:
    """How a plan searches: the HBM kept free, TP across the scale-up domain, the axis order, and the pinned
    layout fields (schema names, values as parsed)."""

    headroom: float = HEADROOM
    allow_cross_node_tp: bool = False
    order: tuple[str, ...] = DEFAULT_ORDER
    pins: Mapping[str, Any] | None = None

    def search(
        self,
        spec: ModelSpec,
        cluster: Cluster,
        work: Workload,
        *,
        headroom: float | None = None,
        objective: Objective = Objective.STEP_TIME,
        lightest: bool = True,
    ) -> SearchResult:
        """``search.rank.search`` with these rules (``headroom`` replaces theirs where given)."""
        space, columns = pinned_space(self.pins)
        return search(
            spec,
            cluster,
            work,
            space=space,
            headroom=self.headroom if headroom is None else headroom,
            allow_cross_node_tp=self.allow_cross_node_tp,
            order=self.order,
            objective=objective,
            pins=columns,
            lightest=lightest,
        )

    def sizes(
        self, spec: ModelSpec, work: Workload, domain: int, *, batch_free: bool, low: int, high: int
    ) -> list[int]:
        """The fleet sizes in [low, high] whose meshes these rules let the search hold: TP within the scale-up
        domain unless it may cross it, the pinned degrees (``search.fleet.fleet_sizes``)."""
        _, columns = pinned_space(self.pins)
        return fleet_sizes(
            spec,
            seq=work.seq_len,
            global_batch=None if batch_free else work.global_batch,
            low=low,
            high=high,
            domain=domain,
            max_tp=high if self.allow_cross_node_tp else domain,
            pins=columns,
        )


def fewest_that_fit(
    spec: ModelSpec,
    fleet: Fleet,
    work: Workload,
    rules: SearchRules,
    *,
    start: int,
    include_start: bool,
    high: int,
    batch_free: bool = False,
) -> Fewest:
    """The fewest GPUs from ``start`` (the size itself tried where ``include_start``) up to ``high`` on which a
    layout fits. ``batch_free``: each size runs one sequence per GPU per step (``fit``, which states no batch:
    a full pipeline on every layout, and any data-parallel degree); otherwise the workload's batch."""
    domain = fleet(gpus=max(start, 1)).domain_size
    sizes = rules.sizes(spec, work, domain, batch_free=batch_free, low=max(start, 1), high=high)

    def test(n: int) -> Probe:
        w = dataclasses.replace(work, global_batch=n) if batch_free else work
        found = rules.search(spec, fleet(gpus=n), w, lightest=False)
        if not found.feasible:
            return Probe(gpus=n, passed=False)
        c = found.candidates
        return Probe(gpus=n, passed=True, value=float(np.min(c.tp * c.cp * c.pp * c.dp_shard)))

    return fewest(sizes, test, start=max(start, 1), include_start=include_start)


def fits_on(spec: ModelSpec, fleet: Fleet, work: Workload, rules: SearchRules, *, gpus: int, found: Fewest) -> bool:
    """Whether a layout fits on ``gpus`` GPUs, one sequence a GPU per step, given the fewest that fit (``found``,
    from ``fewest_that_fit`` with ``batch_free``). A fleet that a layout of the fewest divides into whole
    replicas (its tp x cp x pp x dp_shard, the smallest among those that fit there) fits: the same layout with
    more replicas holds the same bytes a GPU and runs the same micro-batches. Any other count is searched."""
    probes = {p.gpus: p for p in found.tried}
    if gpus in probes:
        return probes[gpus].passed
    unit = probes[found.gpus].value if found.gpus is not None else None
    if unit is not None and found.gpus is not None and gpus > found.gpus and gpus % int(unit) == 0:
        return True
    w = dataclasses.replace(work, global_batch=gpus)
    return rules.search(spec, fleet(gpus=gpus), w, lightest=False).feasible > 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Deadline:
    """Train ``tokens`` within ``days`` (the fewest-gpus objective)."""

    tokens: float
    days: float


def fewest_for_deadline(
    spec: ModelSpec, fleet: Fleet, work: Workload, rules: SearchRules, *, start: int, deadline: Deadline, high: int
) -> Fewest:
    """The fewest GPUs from ``start`` up to ``high`` whose best plan trains the deadline's tokens in its days.

    Each size's best plan (by step time) decides; the days it takes are kept with the size."""
    if start > high:
        raise ValueError(f"gpus={start:,} is above the limit of {high:,} for the fewest-gpus search")
    domain = fleet(gpus=start).domain_size
    sizes = rules.sizes(spec, work, domain, batch_free=False, low=start, high=high)

    def test(n: int) -> Probe:
        result = rules.search(spec, fleet(gpus=n), work, lightest=False)
        if not result.feasible:
            return Probe(gpus=n, passed=False)
        days = deadline.tokens / (float(np.asarray(result.step.tokens_per_s_per_gpu)[0]) * n) / 86400
        return Probe(gpus=n, passed=days <= deadline.days, value=days)

    found = fewest(sizes, test, start=start, include_start=True)
    if found.gpus is None:
        raise ValueError(
            f"no fleet of up to {high:,} {fleet(gpus=1).gpu.name} trains {deadline.tokens:.3g} tokens within "
            f"{deadline.days} days"
        )
    return found


def tried_json(found: Fewest, *, deadline: bool = False) -> list[dict[str, Any]]:
    """The sizes a ``fewest`` search tried, in order: whether each fit (or met the deadline, with its days)."""
    if deadline:
        return [{"gpus": p.gpus, "meets_deadline": p.passed, "days": p.value} for p in found.tried]
    return [{"gpus": p.gpus, "fits": p.passed} for p in found.tried]


def variants(
    spec: ModelSpec, cluster: Cluster, work: Workload, rules: SearchRules, *, finetune: Finetune | None
) -> list[dict[str, Any]]:
    """What fits on this fleet when the run does not: keeping no HBM free, and, where the run trains every
    weight (pre-training or a full fine-tune), LoRA and QLoRA; each with the best layout that fits."""
    options: list[tuple[str, Workload, float | None]] = []  # None: the rules' headroom
    if rules.headroom > 0:
        options.append(("--headroom 0 (keep no HBM free)", work, 0.0))
    if finetune is None or not finetune.adapted:
        for mode in (FinetuneMode.LORA, FinetuneMode.QLORA):
            options.append((f"--finetune {mode.value}", dataclasses.replace(work, finetune=Finetune(mode=mode)), None))
    out = []
    for change, w, room in options:
        found = rules.search(spec, cluster, w, headroom=room, lightest=False)
        if found.feasible:
            out.append(
                {
                    "change": change,
                    "layout": layout_dict(found.candidates.layout(0)),
                    "step_time_s": float(np.asarray(found.step.step_time_s)[0]),
                }
            )
    return out


def what_would_fit(
    spec: ModelSpec,
    fleet: Fleet,
    cluster: Cluster,
    work: Workload,
    result: SearchResult,
    rules: SearchRules,
    *,
    finetune: Finetune | None,
    max_gpus: int = MAX_GPUS,
) -> dict[str, Any]:
    """When no layout fits: the lightest valid layout by its whole bill, the fewest GPUs (up to GROWTH times the
    fleet) on which one fits and the sizes tried, and the nearest variants on this fleet."""
    found = fewest_that_fit(
        spec,
        fleet,
        work,
        rules,
        start=cluster.num_gpus,
        include_start=False,
        high=min(cluster.num_gpus * GROWTH, max_gpus),
    )
    return {
        "lightest_layout": layout_dict(result.lightest) if result.lightest is not None else None,
        "lightest_bytes_per_gpu": result.lightest_bytes,
        "budget_bytes_per_gpu": cluster.gpu.hbm_bytes * (1 - rules.headroom),
        "fewest_gpus_that_fit": found.gpus,
        "fleet_sizes_tried": tried_json(found),
        "variants": variants(spec, cluster, work, rules, finetune=finetune),
    }
