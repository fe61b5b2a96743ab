"""What the published serving measurements cover: the GPU kinds and model classes they ran, and what ``serve`` and
``serve-plan`` say of a question outside them (as ``estimate`` says of a GPU kind no training run ran on).

The measurements are catalog/serving/runs.json and runs_moe.json, the rows ``meshplan validate --serving`` predicts
and whose held-out errors make the serving band (catalog/serving/held_out.toml); a row counts here when meshplan
can predict it (its GPU kind and model are in the catalog).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from meshplan import io
from meshplan.reports.serve_band import FEW_MOE
from meshplan.spec.model import ModelSpec

RUN_FILES = ("runs.json", "runs_moe.json")


@cache
def serving_rows() -> tuple[dict[str, Any], ...]:
    """Every published serving row of the catalog, runs.json first, each marked ``shared`` when it is from the
    shared set (runs.json) rather than transcribed by meshplan (runs_moe.json)."""
    folder = resources.files("meshplan") / "catalog" / "serving"
    rows: list[dict[str, Any]] = []
    for name in RUN_FILES:
        text = (folder / name).read_text(encoding="utf-8")
        rows += [r | {"shared": name == "runs.json"} for r in json.loads(text)]
    return tuple(rows)


def row_model(row: dict[str, Any]) -> str | None:
    """The catalog model a row ran: its ``catalog`` name, else the first word of its name where that is a catalog
    model (Splitwise's 'bloom-176b (Splitwise perf_model.csv)'), else None."""
    named = row["model"].get("catalog")
    if named:
        return str(named)
    first = str(row["model"].get("name", "")).split(" ")[0]
    return first if first in io.list_models() else None


def model_class(spec: ModelSpec) -> str:
    """The serving class of a model: dense or MoE, with its attention where the decode kernels differ (MLA, sliding
    windows)."""
    base = "MoE model" if spec.moe is not None else "dense model"
    if spec.mla is not None:
        return f"{base} with MLA"
    if spec.sliding_window:
        return f"{base} with sliding-window attention"
    return base


@cache
def _coverage() -> tuple[dict[str, int], dict[str, int]]:
    """(rows per GPU kind, rows per model class) of the rows meshplan predicts."""
    gpus: dict[str, int] = {}
    classes: dict[str, int] = {}
    known_gpus = set(io.list_gpus())
    for row in serving_rows():
        gpu, model = row["hardware"].get("catalog"), row_model(row)
        if gpu not in known_gpus or model is None:
            continue
        gpus[gpu] = gpus.get(gpu, 0) + 1
        cls = model_class(io.load_model(model))
        classes[cls] = classes.get(cls, 0) + 1
    return dict(sorted(gpus.items())), dict(sorted(classes.items()))


def serving_rows_by_gpu() -> dict[str, int]:
    return _coverage()[0]


def serving_rows_by_class() -> dict[str, int]:
    return _coverage()[1]


def coverage_warnings(spec: ModelSpec, gpu: str) -> list[str]:
    """What the published serving measurements say of a GPU kind or a model class none of them ran (estimate's
    gpu_warning, for serving)."""
    out = []
    by_gpu, by_class = _coverage()
    total = sum(by_gpu.values())
    if gpu not in by_gpu:
        out.append(
            f"{gpu}: none of the {total} published serving measurements meshplan is checked against ran on this GPU "
            f"kind (they ran on {', '.join(by_gpu)}): its constants come from its datasheet, kernel benchmarks and "
            "the kinds it shares a die with (its catalog file's sources) and the engine's shares set on those kinds, "
            "unchecked on its own runs, and the serving band is the errors of those kinds, not its own"
        )
    cls = model_class(spec)
    if cls not in by_class:
        out.append(
            f"{spec.name} is a {cls}: none of the {total} published serving measurements meshplan is checked "
            f"against ran one (they ran a {', a '.join(by_class)}): its kernels are priced with the shares set on "
            "those, unchecked on its own runs, and the serving band is the errors of those classes, not its own"
        )
    return out


SMALL_MOE_DECODE_BATCH = 8
"""Sequences a step per replica at or below which a MoE model's decode step is set by the engine release's own
per-step host and dispatch costs more than by the GPU: InferenceX's automated runs of DeepSeek-R1 (NVFP4) on the same
16 B200s at TP 4 / EP 4 moved 1.79 times in output per GPU at concurrency 4 (508 -> 907 tokens/s a GPU, 8K in / 1K
out) when only the image changed from SGLang 0.5.5 to 0.5.6 (piecewise CUDA graphs for DeepSeek's MLA path, one
event loop), and 1.03 times at concurrency 64 (SemiAnalysis, 'SGLang 0.5.6 on B200 DeepSeek R1 FP4: Up to 1.8x at
Low Concurrency', InferenceX blog): concurrency 4 and 8 are the levels the source names."""


def small_moe_decode_warnings(
    spec: ModelSpec, *, batch_per_replica: float, engine: str, who: str | None = None
) -> list[str]:
    """What the published runs say of a MoE model decoding a few sequences a step: its speed there is a property of
    the engine's release, which meshplan's engine constants (one per family, none per release) do not carry.
    ``who`` names what decodes them (the model's name, or serve-plan's best plan of it)."""
    if spec.moe is None or batch_per_replica > SMALL_MOE_DECODE_BATCH:
        return []
    seqs = f"{batch_per_replica:.3g} sequence{'' if batch_per_replica == 1 else 's'}"
    band = io.serving_held_out_band()
    spread = ""
    if f"{FEW_MOE}_time_ratio_p10" in band:  # validation/serving_few_moe.py
        spread = (
            f"; serve's TPOT band at so few sequences spans the published such steps, x"
            f"{band[f'{FEW_MOE}_time_ratio_p10']:.2f}-{band[f'{FEW_MOE}_time_ratio_p90']:.2f} of meshplan's "
            f"figure over {int(band[f'{FEW_MOE}_sources'])} sources (validate --serving)"
        )
    return [
        f"{who or spec.name} decodes {seqs} a step per replica: at so few, a MoE model's step is set by the engine "
        "release's host and dispatch costs (scheduler, graph replay, routing kernels), which meshplan prices once per "
        "engine family, not per release; one image change (SGLang 0.5.5 -> 0.5.6, DeepSeek-R1 on the same 16 B200s) "
        "moved output per GPU 1.79 times at concurrency 4 and 1.03 times at 64. The TPOT takes "
        f"{engine}'s family constants{spread}: time the release you run"
    ]
