"""Search endpoints: the planner and the published recipes.

A search takes from a fraction of a second to tens of seconds and a few GB of
memory on a large MoE fleet, so one runs at a time, each in a worker thread: a
second request waits for the running one (and is answered from the cache when
it asked the same), and gets 429 if the wait passes ``wait_s``. The last
answers are kept so that asking again is instant.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request

from meshplan.reports.plan import plan_report
from meshplan.reports.recipes import list_report, recipe_report, recipes
from meshplan.server import parse
from meshplan.server.api import (
    ConditionsArg,
    FinetuneArg,
    FleetShapeArg,
    GpuArg,
    Gpus,
    ModelArg,
    Seq,
    dependency,
    json_dict,
)
from meshplan.spec.model import ModelSpec
from meshplan.spec.requests import Group, field
from meshplan.spec.requests import group as fields_of

router = APIRouter(prefix="/api")
CACHE_SIZE = 16
WAIT_S = 30.0


class SearchGate:
    """One search at a time, and an LRU of finished answers keyed by their inputs."""

    def __init__(self, size: int = CACHE_SIZE, wait_s: float = WAIT_S) -> None:
        self._lock = threading.Lock()
        self._cache_lock = threading.Lock()
        self._answers: OrderedDict[tuple[Any, ...], dict[str, Any]] = OrderedDict()
        self._size = size
        self.wait_s = wait_s

    def _cached(self, key: tuple[Any, ...]) -> dict[str, Any] | None:
        with self._cache_lock:
            answer = self._answers.get(key)
            if answer is not None:
                self._answers.move_to_end(key)
            return answer

    def run(self, key: tuple[Any, ...], compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        answer = self._cached(key)
        if answer is not None:
            return answer
        if not self._lock.acquire(timeout=self.wait_s):
            raise HTTPException(429, f"another search has been running for over {self.wait_s:.0f} s; try again later")
        try:
            answer = self._cached(key)  # the search we waited for may have been this one
            if answer is None:
                answer = compute()
                with self._cache_lock:
                    self._answers[key] = answer
                    while len(self._answers) > self._size:
                        self._answers.popitem(last=False)
        finally:
            self._lock.release()
        return answer


def _model_key(model: ModelSpec | str) -> Any:
    return model if isinstance(model, str) else ("spec", model)


SEARCH_FIELDS = (
    *fields_of(Group.SEARCH),
    *(dataclasses.replace(field(name), default=None) for name in ("precision", "attention", "kernels")),
)
SearchArg = Annotated[dict[str, Any], Depends(dependency(SEARCH_FIELDS, dict, "search_arg"))]


@router.get("/plan", summary="Search every layout: the best that fit, the Pareto front, rejections (meshplan plan)")
def plan(
    request: Request,
    model: ModelArg,
    gpu: GpuArg,
    gpus: Gpus,
    seq: Seq,
    finetune: FinetuneArg,
    search: SearchArg,
    shape: FleetShapeArg,
    conditions: ConditionsArg,
    compare: Annotated[str | None, Query(max_length=parse.MAX_NAME_CHARS, description="e.g. tp=8,pp=4")] = None,
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "conditions": conditions,
        "gpu": gpu,
        "gpus": gpus,
        "seq": seq,
        **search,
        **shape,
        "compare": compare.strip() if compare and compare.strip() else None,
        "finetune": finetune,
    }
    key = ("plan", _model_key(model), *sorted((k, v) for k, v in kwargs.items() if k != "conditions"))
    key += tuple(sorted(conditions.items()))
    gate: SearchGate = request.app.state.searches
    return gate.run(key, lambda: json_dict(plan_report(model, explain=True, **kwargs)))


@router.get("/recipes", summary="The published recipes and their parallel factors (meshplan recipe --list)")
def recipe_list() -> dict[str, Any]:
    return json_dict(list_report())


@router.get("/recipe/{name}", summary="One published recipe evaluated: placement, collectives, step time")
def recipe(request: Request, name: str, rank: bool = False) -> dict[str, Any]:
    if name not in recipes():
        raise HTTPException(404, f"unknown recipe {name[: parse.MAX_NAME_CHARS]!r} (recipes: {', '.join(recipes())})")
    if not rank:
        return json_dict(recipe_report(name, rank=False))
    gate: SearchGate = request.app.state.searches
    return gate.run(("recipe", name), lambda: json_dict(recipe_report(name, rank=True)))
