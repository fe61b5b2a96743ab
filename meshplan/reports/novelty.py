"""What no published run has used: the GPU kind, the stack and the parallelism mix a layout runs on.

The step-time band (catalog/held_out.toml, validation/band.py) is built from the held-out errors of the published
runs. A layout whose GPU kind, stack or mix of parallel axes none of those runs used is outside what the band has
seen, and takes the widest band the published runs support instead (validation/band.py, step 4; reports/estimate.py
``uncertainty``). A published run's stack is the one it names, else the one its source ran with its conditions
typed one by one (the run file's ``[source] ran_on_stack``: the papers a catalog stack was built from, DeepSpeed's
runs, NeMo's), else the default stack (reports/conditions.py ``DEFAULT_STACK``) under which ``meshplan validate``
evaluates it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

from meshplan import io
from meshplan.reports.conditions import DEFAULT_STACK

MIX_AXES = ("tp", "pp", "cp", "ep")
"""The parallel axes whose mix sorts layouts (data parallelism and ZeRO are in every run and in none's way)."""


def mix_of(*, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1) -> str:
    """A layout's parallelism mix: its axes of degree above 1, joined (``tp+pp``; "" for data parallelism only)."""
    degrees = {"tp": tp, "pp": pp, "cp": cp, "ep": ep}
    return "+".join(axis for axis in MIX_AXES if int(degrees[axis]) > 1)


def run_kinds(data: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Each case of a catalog/runs file as its (GPU kind, stack, parallelism mix)."""
    defaults, ran_on = data.get("defaults", {}), data["source"].get("ran_on_stack", DEFAULT_STACK)
    out = []
    for raw in data["case"]:
        case = {**defaults, **raw}
        layout = {k: int(v) for k, v in case.get("layout", {}).items() if k in MIX_AXES}
        out.append((str(case["gpu"]), str(case.get("stack", ran_on)), mix_of(**layout)))
    return out


def kinds_of(sources: Iterable[Mapping[str, Any]]) -> dict[str, frozenset[str]]:
    """The GPU kinds, stacks and parallelism mixes the runs of ``sources`` (catalog/runs files) used."""
    kinds = [k for data in sources for k in run_kinds(data)]
    return {name: frozenset(k[i] for k in kinds) for i, name in enumerate(("gpu", "stack", "mix"))}


@cache
def published_kinds() -> dict[str, frozenset[str]]:
    """The GPU kinds, stacks and parallelism mixes the published training runs of catalog/runs used."""
    return kinds_of(io.run_sources().values())


def unseen(
    *, gpu: str | None, stack: str | None, mix: str | None, seen: Mapping[str, frozenset[str]] | None = None
) -> list[str]:
    """What of a layout no published run used (or none of ``seen``'s), as words (empty when each was used; None:
    not checked)."""
    seen = published_kinds() if seen is None else seen
    out = []
    if gpu is not None and gpu not in seen["gpu"]:
        out.append(f"the GPU kind {gpu}")
    if stack is not None and stack not in seen["stack"]:
        out.append(f"the stack {stack}")
    if mix is not None and mix not in seen["mix"]:
        out.append(f"the parallelism mix {mix.upper() or 'data parallelism alone'}")
    return out
