"""Pinned layout fields (``plan --tp 8 ...``, the stated fields of ``plan --compare``): the search space and
column filters that keep only layouts with them, and the refusal of pins no layout of the fleet can have."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NoReturn

from meshplan.core.constraints import failed_rules
from meshplan.reports.inputs import LayoutRequest, choice, resolve_layout
from meshplan.search.space import SearchSpace
from meshplan.spec.cluster import Cluster
from meshplan.spec.layout import ContextParallel, Recompute, Schedule
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload


def pinned_space(pins: Mapping[str, Any] | None) -> tuple[SearchSpace | None, dict[str, int]]:
    """The search space and column filters that keep only layouts with the pinned layout fields (schema names,
    values as parsed; None or a False ``sp`` pins nothing)."""
    given = {k: v for k, v in (pins or {}).items() if v is not None and not (k == "sp" and v is False)}
    if not given:
        return None, {}
    space, columns = SearchSpace(), {}
    for name, value in given.items():
        if name == "vpp":
            space = dataclasses.replace(space, vpp_choices=(value,))
        elif name == "micro_batch":
            space = dataclasses.replace(space, micro_batch_choices=(value,), micro_batch_ladder=False)
        elif name == "zero":
            space = dataclasses.replace(space, zero_choices=(value,))
        elif name == "recompute":
            space = dataclasses.replace(space, recompute_choices=(int(choice(Recompute, value, "recompute")),))
        elif name == "cp_kind":
            space = dataclasses.replace(space, cp_kind=choice(ContextParallel, value, "cp kind"), cp_all_gather=False)
        elif name == "schedule":
            schedule = choice(Schedule, value, "schedule")
            if schedule is Schedule.GPIPE:
                raise ValueError(
                    "the planner does not search the gpipe schedule (1F1B's bubble with every micro-batch's "
                    "activations held); pin 1f1b, interleaved, zero-bubble or dualpipe"
                )
            space = dataclasses.replace(
                space, zero_bubble=schedule is Schedule.ZERO_BUBBLE, dualpipe=schedule is Schedule.DUALPIPE
            )
            columns["schedule"] = int(schedule)
        elif name == "expert_tp":
            columns["etp"] = int(value)  # the search's resolved column
        else:  # tp, pp, cp, ep, dp, dp_shard, dp_replicate, sp
            columns[name] = int(value)
    return space, columns


def _stated(pins: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in pins.items() if v is not None and not (k == "sp" and v is False))


def refuse_pins(
    spec: ModelSpec, work: Workload, cluster: Cluster, pins: Mapping[str, Any], *, allow_cross_node_tp: bool
) -> NoReturn:
    """A ValueError saying why no layout of the fleet has the pinned fields (the search found none that passes
    its rules and the pins): the fleet's arithmetic, the model's rule that the pinned layout breaks, TP across
    the scale-up domain, or the planner's space."""
    given = {k: v for k, v in pins.items() if v is not None}
    gpus = cluster.num_gpus
    degrees = {k: int(given.get(k, 1)) for k in ("tp", "pp", "cp")}
    model_ranks = degrees["tp"] * degrees["pp"] * degrees["cp"]
    if gpus % model_ranks:
        raise ValueError(
            f"tp*pp*cp = {degrees['tp']}*{degrees['pp']}*{degrees['cp']} = {model_ranks} does not divide gpus = {gpus}"
        )
    try:
        broken = failed_rules(spec, resolve_layout(LayoutRequest(**given), gpus=gpus), work, gpus)
    except ValueError as err:
        broken = [str(err)]
    if not broken and degrees["tp"] > cluster.domain_size and not allow_cross_node_tp:
        broken = [
            f"tp={degrees['tp']} crosses the {cluster.domain_size}-GPU scale-up domain (add --allow-cross-node-tp)"
        ]
    why = broken[0] if broken else "the planner's space holds none (TP within 4 scale-up domains, CP up to 64)"
    raise ValueError(f"no layout of {gpus:,} GPUs has {_stated(pins)}: {why}")
