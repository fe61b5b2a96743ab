"""What an export refusal tells the user to run instead, and which checkpoint a server loads.

Each refusal ends in advice that works as written (tests/exports/test_export_advice.py runs it): the closest plan
in flags, the planner's command for a layout the engine runs, and the other engines that run the plan as it is.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from meshplan import io
from meshplan.exports import (
    SERVING_EXPORTERS,
    TRAINING_EXPORTERS,
    Engine,
    Export,
    ServingPlan,
    UnsupportedByEngine,
    check_model_path,
)
from meshplan.spec.layout import Layout
from meshplan.spec.model import ModelSpec
from meshplan.spec.requests import BY_NAME
from meshplan.spec.workload import Workload


def served_checkpoint(model: str, model_path: str | None) -> tuple[str, str | None]:
    """(what the server loads, a note saying where it came from or None): ``--model-path``, else the checkpoint
    MODEL names: a catalog model's public repository (``hf_repo`` in its ``[meta]``), the folder of a
    config.json. A model with no known checkpoint (a catalog entry without ``hf_repo``, a model TOML) is refused
    with a line asking for --model-path."""
    if model_path is not None:
        return check_model_path(model_path, what="--model-path"), None
    path = Path(model)
    if path.is_dir() or path.suffix == ".json":
        folder = str(path if path.is_dir() else path.parent)
        return check_model_path(folder, what="the folder of MODEL (or give --model-path)"), None
    repo = io.model_meta(model).get("hf_repo")
    if not isinstance(repo, str):
        raise ValueError(
            f"meshplan knows no public checkpoint of {model}: give --model-path (a Hugging Face repository id or a "
            "checkpoint folder)"
        )
    note = (
        f"serves {repo}, the public repository of {model} whose config.json the catalog was read from; "
        "give --model-path for another checkpoint (an Instruct one, a local folder)"
    )
    return check_model_path(repo, what=f"hf_repo of {model}"), note


def replan_command(
    engine: str,
    model: str,
    *,
    gpu: str,
    gpus: int,
    seq: int,
    global_batch_tokens: int,
    precision: str | None = None,
    pins: tuple[str, ...] = (),
) -> str:
    """The ``meshplan plan ... --engine ENGINE --save`` command (``pins``: more plan flags) and the export of
    its file: what a refusal tells a user to run to get a layout ``engine`` accepts."""
    out = f"{engine}-plan.json"
    words = ["meshplan", "plan", model, "--gpu", gpu, "--gpus", str(gpus), "--seq", str(seq)]
    words += ["--global-batch-tokens", str(global_batch_tokens)]
    words += ["--precision", precision] if precision and precision != "bf16" else []
    words += [*pins, "--engine", engine, "--save", out]
    return f"`{shlex.join(words)}`, then `meshplan export {engine} --from-plan {out}`"


_ASSIGNMENT = re.compile(r"\b([a-z_]+)=([\w.-]+)")


def as_flags(text: str) -> str:
    """An exporter's ``closest`` (``zero=2``, ``sp=False``, ``kv_cache_dtype fp8``) in the flags that ask for it."""
    for word, flag in (("kv_cache_dtype ", "--kv-dtype "), ("quantization=None", "--weights-dtype bf16")):
        text = text.replace(word, flag)
    text = re.sub(r"^precision ", "--precision ", text)

    def flag(m: re.Match[str]) -> str:
        name, value = m.groups()
        f = BY_NAME.get(name)
        if f is None:
            return m.group()
        if f.type is bool:
            return f.flag if value.lower() in ("true", "1", "on") else f"no {f.flag}"
        return f"{f.flag} {value}"

    return _ASSIGNMENT.sub(flag, text)


def _runs(engine: Engine, spec: ModelSpec, lay: Layout, work: Workload) -> bool:
    try:
        TRAINING_EXPORTERS[engine](spec, lay, work)
    except ValueError:
        return False
    return True


def training_refusal(
    exc: UnsupportedByEngine,
    eng: Engine,
    spec: ModelSpec,
    lay: Layout,
    work: Workload,
    *,
    where: tuple[str, str, int, str | None],
    plan_file: str | None,
) -> UnsupportedByEngine:
    """The refusal with advice that works: where a layout of the engine's would run (the engine takes the plain
    single-GPU layout with this workload), the planner's command for one (``--engine``); other engines that run
    the plan as it is."""
    others = [e.value for e in TRAINING_EXPORTERS if e is not eng and _runs(e, spec, lay, work)]
    elsewhere = f"; {' and '.join(others)} {'runs' if len(others) == 1 else 'run'} it as it is" if others else ""
    if plan_file is not None and others:
        elsewhere += f": `meshplan export {others[0]} --from-plan {shlex.quote(plan_file)}`"
    if not _runs(eng, spec, Layout(), work):  # the workload or the model, not the layout: no layout helps
        return exc.with_advice(f"closest: {as_flags(exc.closest)}{elsewhere}")
    model, gpu, gpus, precision = where
    replan = replan_command(
        eng.value, model, gpu=gpu, gpus=gpus, seq=work.seq_len, global_batch_tokens=work.tokens_per_step,
        precision=precision,
    )  # fmt: skip
    if plan_file is not None:
        return exc.with_advice(f"the plan in {plan_file} asks for it; re-plan for {eng.value}: {replan}{elsewhere}")
    return exc.with_advice(f"closest: {as_flags(exc.closest)}; or let the planner pick a layout: {replan}{elsewhere}")


def serve_with_advice(
    eng: Engine, plan: ServingPlan, predicted: Mapping[str, float], *, plan_file: str | None
) -> Export:
    """``eng``'s launcher for ``plan``; a refusal names the flags of the closest plan the engine runs and the
    serving engines that run this one as it is."""
    try:
        export = SERVING_EXPORTERS[eng](plan, predicted=predicted)
    except UnsupportedByEngine as exc:
        others = [e.value for e, export in SERVING_EXPORTERS.items() if e is not eng and _serves(export, plan)]
        verb = "runs" if len(others) == 1 else "run"
        if plan_file is not None:
            how = f": `meshplan export {others[0]} --from-plan {shlex.quote(plan_file)}`" if others else ""
            elsewhere = f"; {' and '.join(others)} {verb} this plan as it is{how}" if others else ""
            raise exc.with_advice(f"closest: {exc.closest}{elsewhere}") from None
        elsewhere = f"; {' and '.join(others)} {verb} it with the same flags" if others else ""
        raise exc.with_advice(f"closest: {as_flags(exc.closest)}{elsewhere}") from None
    return with_admission_note(eng, plan.capacity_scheduler, export)


def with_admission_note(eng: Engine, capacity_scheduler: str | None, export: Export) -> Export:
    """``export`` with a note where the plan was timed with TensorRT-LLM's capacity scheduler and ``eng`` is a paging
    engine, which has no flag for it."""
    if capacity_scheduler is None or eng is Engine.TRTLLM:
        return export
    note = (
        f"the plan was timed with TensorRT-LLM's {capacity_scheduler} admission, which {eng.value} has no flag for: "
        f"{eng.value} admits requests as their KV cache grows, up to the plan's batch cap"
    )
    return dataclasses.replace(export, notes=(*export.notes, note))


def _serves(export: Any, plan: ServingPlan) -> bool:
    try:
        export(plan)
    except ValueError:
        return False
    return True
