"""Search endpoints: the planner, the serving planner and the published recipes ranked.

A search takes from a fraction of a second to tens of seconds and a few GB of
memory on a large MoE fleet, so every search endpoint goes through one gate
(``SearchGate``): one search runs at a time, in the search process (worker.py,
so that it never holds the server's GIL), under one time limit
(``parse.SEARCH_TIME_LIMIT_S``, then 503), and stops when its client
disconnects (``run_while_connected``). A second request waits for the running
one (and is answered from the cache when it asked the same), and gets 429 if the
wait passes ``wait_s``; past ``max_waiting`` waiting requests the gate is full
and a new one gets 503 at once. The last answers are kept so that asking again
is instant.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from starlette.concurrency import run_in_threadpool

from meshplan.reports import serve_models as sm
from meshplan.reports.models import PlanReport
from meshplan.reports.plan import plan_report
from meshplan.reports.recipes import list_report, recipe_report, recipes
from meshplan.reports.typed import serve_plan_kwargs
from meshplan.server import parse
from meshplan.server.api import (
    ConditionsArg,
    CostArg,
    FinetuneArg,
    FleetShapeArg,
    GpuArg,
    Gpus,
    ModelArg,
    Seq,
    ServePlanArg,
    dependency,
    json_dict,
    ok,
    one,
)
from meshplan.server.worker import SEARCHES
from meshplan.spec.model import ModelSpec
from meshplan.spec.requests import Group, field
from meshplan.spec.requests import group as fields_of

router = APIRouter(prefix="/api")
CACHE_SIZE = 16
WAIT_S = 30.0
MAX_WAITING = 8
"""Searches that may wait behind the running one; past it the gate is full (503). Each waits in a worker thread,
so this also keeps the thread pool free for the cheap endpoints."""


class SearchGate:
    """One search at a time, at most ``max_waiting`` more waiting, and an LRU of answers keyed by their inputs."""

    def __init__(self, size: int = CACHE_SIZE, wait_s: float = WAIT_S, max_waiting: int = MAX_WAITING) -> None:
        self._lock = threading.Lock()
        self._cache_lock = threading.Lock()
        self._answers: OrderedDict[tuple[Any, ...], dict[str, Any]] = OrderedDict()
        self._size = size
        self._inside = 0  # searches running or waiting for the lock
        self.wait_s = wait_s
        self.max_waiting = max_waiting

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
        with self._cache_lock:
            if self._inside > self.max_waiting:
                queued = f"{self._inside} searches are running or waiting"
                raise HTTPException(503, f"the search queue is full ({queued}); try again later", {"Retry-After": "10"})
            self._inside += 1
        try:
            return self._run_in_turn(key, compute)
        finally:
            with self._cache_lock:
                self._inside -= 1

    def _run_in_turn(self, key: tuple[Any, ...], compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        if not self._lock.acquire(timeout=self.wait_s):
            waited = f"waited {self.wait_s:.0f} s behind the one running (and any queued before it)"
            raise HTTPException(429, f"the search {waited}; try again later")
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
PinsArg = Annotated[dict[str, Any], Depends(dependency(fields_of(Group.LAYOUT), dict, "pins_arg", unset=True))]


@router.get(
    "/plan",
    summary="Search every layout: the best that fit, the Pareto front, rejections (meshplan plan)",
    responses=ok(PlanReport),
    response_model=None,
)
async def plan(
    request: Request,
    model: ModelArg,
    gpu: GpuArg,
    gpus: Gpus,
    seq: Seq,
    finetune: FinetuneArg,
    search: SearchArg,
    shape: FleetShapeArg,
    pins: PinsArg,
    conditions: ConditionsArg,
    cost: CostArg,
    compare: Annotated[str | None, Query(max_length=parse.MAX_NAME_CHARS, description="e.g. tp=8,pp=4")] = None,
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "conditions": conditions,
        "cost": cost,
        "gpu": gpu,
        "gpus": gpus,
        "seq": seq,
        **search,
        **shape,
        "compare": compare.strip() if compare and compare.strip() else None,
        "finetune": finetune,
        "pins": pins,
    }
    key = ("plan", _model_key(model), *sorted((k, repr(v)) for k, v in kwargs.items()))
    gate: SearchGate = request.app.state.searches
    work = functools.partial(plan_report, model, explain=True, max_gpus=parse.MAX_FEWEST_GPUS, **kwargs)
    return await run_while_connected(request, lambda cancel: gate.run(key, lambda: _limited(work, cancel)))


@router.get("/recipes", summary="The published recipes and their parallel factors (meshplan recipe --list)")
def recipe_list() -> dict[str, Any]:
    return json_dict(list_report())


@router.get("/recipe/{name}", summary="One published recipe evaluated: placement, collectives, step time")
async def recipe(request: Request, name: str, rank: bool = False) -> dict[str, Any]:
    if name not in recipes():
        raise HTTPException(404, f"unknown recipe {name[: parse.MAX_NAME_CHARS]!r} (recipes: {', '.join(recipes())})")
    if not rank:
        return await run_in_threadpool(lambda: json_dict(recipe_report(name, rank=False)))
    gate: SearchGate = request.app.state.searches
    ranked = functools.partial(recipe_report, name, rank=True)
    return await run_while_connected(
        request, lambda cancel: gate.run(("recipe", name), lambda: _limited(ranked, cancel))
    )


@router.get(
    "/serve-plan",
    summary="Serving layouts ranked under TTFT/TPOT targets (meshplan serve-plan)",
    responses=ok(sm.ServePlanReport),
    response_model=None,
)
async def serve_plan(
    request: Request,
    model: ModelArg,
    gpu: GpuArg,
    gpus: Gpus,
    plan: ServePlanArg,
    top: Annotated[int, one("top")] = 5,
) -> dict[str, Any]:
    from meshplan.reports.serve_plan import serve_plan_report

    kwargs: dict[str, Any] = {"gpu": gpu, "gpus": gpus, "top": top, **serve_plan_kwargs(plan)}
    key = ("serve-plan", _model_key(model), *sorted((k, repr(v)) for k, v in kwargs.items()))
    gate: SearchGate = request.app.state.searches
    work = functools.partial(serve_plan_report, model, **kwargs)
    return await run_while_connected(request, lambda cancel: gate.run(key, lambda: _limited(work, cancel)))


def _limited(compute: Callable[[], Any], cancel: threading.Event) -> dict[str, Any]:
    """A search run in the search process under the API's time limit (SearchTimeout past it, or once cancelled:
    503), as JSON data."""
    answer: dict[str, Any] = SEARCHES.run(compute, seconds=parse.SEARCH_TIME_LIMIT_S, cancel=cancel)
    return answer


POLL_S = 0.25
"""How often a running search looks whether its client is still there."""


async def run_while_connected(request: Request, work: Callable[[threading.Event], dict[str, Any]]) -> dict[str, Any]:
    """``work(cancel)`` in a worker thread, off the event loop; ``cancel`` is set if the client disconnects, so
    the search stops at its next chunk instead of running on for nobody (and holding the one search slot)."""
    cancel = threading.Event()
    task = asyncio.ensure_future(run_in_threadpool(work, cancel))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                cancel.set()
    finally:
        cancel.set()  # the request ended (answered, failed or cancelled): a search still running stops
