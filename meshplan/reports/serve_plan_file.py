"""A ``meshplan serve-plan --save`` file, read back for ``meshplan export ENGINE --from-plan``: checked, never trusted.

Every field is parsed through the request schema (meshplan/spec/requests.py) with its type and bounds; unknown
and missing keys, wrong types, non-finite numbers and control characters in any text are refused. The winning
plan's layout must pass the checks ``serve`` applies (the heads divide by TP, GPUs = replicas x TP x PP, experts
and attention-DP only for MoE, the dtypes the GPU runs) and be one that serve-plan searches; then its batch cap
and its predictions are computed again from the file's own request, and the file's numbers must be those. Each
refusal is a one-line ValueError naming the plan file and the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from meshplan import files, io
from meshplan.core.serving.search import Objective, Targets
from meshplan.core.serving.shape import Quant, ServeLayout
from meshplan.exports import check_model_path
from meshplan.reports.serve import resolve, serving_band_text
from meshplan.reports.serve_band import band_family
from meshplan.reports.serve_plan import PARETO_SHOWN, WEIGHT_DTYPES, layouts, plan_of_layout
from meshplan.reports.serve_setup import ENGINE_SOURCES
from meshplan.spec import requests
from meshplan.spec.cluster import GPU
from meshplan.spec.model import ModelSpec

FILE_KEYS = (
    "model",
    "gpu",
    "gpus",
    "engine",
    "objective",
    "best",
    "top",
    "pareto",
    "pareto_points_total",
    "rejected",
    "layouts_evaluated",
    "points_evaluated",
    "layouts_meeting_targets",
    "elapsed_s",
    "input_len",
    "output_len",
    "targets",
    "disaggregate_searched",
    "concurrency_total",
    "engine_source",
    "launch",
    "node_size",
    "capacity_scheduler",
    "uncertainty",
    "weights_dtypes_searched",
    "prefix_hit_rate",
    "speculative",
    "spec_acceptance",
    "warnings",
)
"""The keys ``serve-plan --save`` writes, no more and no fewer (a file written before ``engine_source`` existed
reads as one whose engine was stated: its band is the engine family's)."""
MAX_WARNINGS = 16
LAYOUT_KEYS = ("tp", "pp", "ep", "dp_attention", "weights_dtype", "kv_dtype", "quant")
PLAN_KEYS = (
    "layout",
    "batch_cap_per_replica",
    "kv_sequences_per_replica",
    "ttft_s_p99",
    "tpot_s",
    "tpot_s_p99",
    "tokens_per_s_per_gpu",
    "tokens_per_s_per_user",
    "gpus",
    "replicas",
    "prefill_replicas",
)
PREDICTED_KEYS = ("ttft_s_p99", "tpot_s", "tpot_s_p99", "tokens_per_s_per_gpu", "tokens_per_s_per_user")
"""The plan's predictions an export writes as comments."""
PARETO_KEYS = ("layout", "batch_cap_per_replica", "tokens_per_s_per_gpu", "tokens_per_s_per_user")
TARGET_KEYS = ("ttft_s_p99", "tpot_s_p99")
MAX_COUNT = 1 << 53
MAX_ELAPSED_S = 1e7
MAX_REJECTED = 1 << 16
REL_TOL = 1e-9
"""How far a recomputed prediction may differ from the file's: JSON keeps floats exactly, so only another
machine's last bits."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SavedServingPlan:
    """The winning plan of a checked serving plan file, its numbers recomputed."""

    model: str
    """The model as the file names it (a catalog name, or a model file's path)."""
    spec: ModelSpec
    layout: ServeLayout
    replicas: int
    prefill_replicas: int
    """Replicas that only prefill (0: every replica does both)."""
    batch_cap_per_replica: int
    max_model_len: int
    """Prompt and output tokens together."""
    predicted: Mapping[str, float] = field(default_factory=dict)
    launch: str = "cudagraph"
    """How the plan was timed launching its kernels (serve-plan --launch): eager plans export an engine's eager
    switch."""
    capacity_scheduler: str | None = None
    """TensorRT-LLM's admission policy the plan was timed with (serve-plan --capacity-scheduler; None: the
    engine's own), which the TensorRT-LLM export writes."""


class _Reader:
    """Typed reads from the parsed file; every refusal names the file and the field's path."""

    def __init__(self, label: str) -> None:
        self.label = label

    def fail(self, where: str, message: str) -> ValueError:
        return ValueError(f"{self.label}: {where} {message}")

    def table(self, value: Any, keys: tuple[str, ...], where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"must be a JSON object, got {_shown(value)}")
        unknown = [k for k in value if k not in keys]
        if unknown:
            raise self.fail(where, f"has an unknown key {unknown[0][:40]!r} (known: {', '.join(keys)})")
        missing = [k for k in keys if k not in value]
        if missing:
            raise self.fail(where, f"has no '{missing[0]}'")
        return value

    def array(self, value: Any, where: str, *, limit: int) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(where, f"must be a list, got {_shown(value)}")
        if len(value) > limit:
            raise self.fail(where, f"holds {len(value):,} entries; serve-plan writes at most {limit:,}")
        return value

    def schema(self, name: str, value: Any, where: str, *, optional: bool = False) -> Any:
        """``value`` as the request field ``name`` takes it: its JSON type, its bounds, its choices."""
        if value is None and optional:
            return None
        f = requests.field(name)
        kinds: dict[type, tuple[type, ...]] = {int: (int,), float: (int, float), bool: (bool,), str: (str,)}
        if (isinstance(value, bool) and f.type is not bool) or not isinstance(value, kinds[f.type]):
            words = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
            null = " or null" if optional else ""
            raise self.fail(where, f"must be {words[f.type]}{null}, got {_shown(value)}")
        try:
            f.check(value)
        except ValueError as exc:
            raise self.fail(where, f"is refused as {exc}") from None
        return value

    def count(self, value: Any, where: str, *, lo: int = 0, hi: int = MAX_COUNT) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, f"must be an integer, got {_shown(value)}")
        if not lo <= value <= hi:
            raise self.fail(where, f"= {_shown(value)} is outside [{lo:,}, {hi:,}]")
        return value

    def positive(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(where, f"must be a number, got {_shown(value)}")
        if not math.isfinite(value) or value <= 0:
            raise self.fail(where, f"must be a finite number above 0, got {_shown(value)}")
        return float(value)

    def layout(self, value: Any, where: str) -> dict[str, Any]:
        lay = self.table(value, LAYOUT_KEYS, where)
        for key in ("tp", "pp", "ep", "dp_attention", "weights_dtype", "kv_dtype"):
            self.schema(key, lay[key], f"{where}.{key}")
        quants = tuple(q.value for q in Quant)
        if not isinstance(lay["quant"], str) or lay["quant"] not in quants:
            raise self.fail(f"{where}.quant", f"must be one of {', '.join(quants)}, got {_shown(lay['quant'])}")
        return lay

    def plan(self, value: Any, where: str) -> dict[str, Any]:
        plan = self.table(value, PLAN_KEYS, where)
        self.layout(plan["layout"], f"{where}.layout")
        self.schema("max_batch", plan["batch_cap_per_replica"], f"{where}.batch_cap_per_replica")
        self.count(plan["kv_sequences_per_replica"], f"{where}.kv_sequences_per_replica", lo=1)
        for key in PREDICTED_KEYS:
            self.positive(plan[key], f"{where}.{key}")
        self.schema("gpus", plan["gpus"], f"{where}.gpus")
        self.schema("replicas", plan["replicas"], f"{where}.replicas")
        self.count(plan["prefill_replicas"], f"{where}.prefill_replicas", hi=requests.MAX_GPUS)
        return plan


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"


def _control_character(value: Any, where: str) -> tuple[str, str] | None:
    """(path, character) of the first text, key or value, holding a character that is not printable."""
    if isinstance(value, str):
        if value.isprintable():
            return None
        return where, next(ch for ch in value if not ch.isprintable())
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else key
            found = _control_character(key, where or "a key") or _control_character(item, path)
            if found:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = _control_character(item, f"{where}[{i}]")
            if found:
                return found
    return None


def load_serving_plan(path: str) -> SavedServingPlan:
    """The winning plan of ``path``, a ``serve-plan --save`` file, checked field by field and recomputed."""
    label = f"plan file {path}"
    data = files.parse_json(files.read_text_file(path, what="plan file"), label, unique_keys=True)
    return serving_plan_of(data, label)


def serving_plan_of(data: Any, label: str) -> SavedServingPlan:
    """The winning plan of ``data``, a serve-plan answer as ``serve-plan --save`` writes it (or as /api/serve-plan
    answers), checked field by field and recomputed; ``label`` names it in each refusal."""
    if not isinstance(data, dict) or data.get("best") is None:
        raise ValueError(f"{label} holds no serving plan (write one with meshplan serve-plan --save FILE)")
    found = _control_character(data, "")
    if found:
        where, ch = found
        raise ValueError(f"{label}: {where} holds the control character {ch!r}; a plan file holds none")
    r = _Reader(label)
    before = {"engine_source": "flag", "launch": "cudagraph", "node_size": None, "capacity_scheduler": None}
    data = before | data  # a file saved before these keys were written
    r.table(data, FILE_KEYS, "the file")
    spec, gpu = _fleet(r, data)
    request = _request(r, data)
    best = r.plan(data["best"], "best")
    _listings(r, data, best)
    plan = _recomputed(r, data, best, spec=spec, gpu=gpu, request=request)
    family = band_family(request["engine"], request["launch"])
    stated, batch = data["engine_source"] == "flag", data["best"]["batch_cap_per_replica"]
    if not isinstance(data["uncertainty"], str) or data["uncertainty"] != serving_band_text(
        spec, engine=family, gpu=gpu.name, stated=stated, batch=batch
    ):
        raise r.fail("uncertainty", "is not the serving band serve-plan states for this model")
    _searched(r, data, best)
    return plan


def _searched(r: _Reader, data: dict[str, Any], best: dict[str, Any]) -> None:
    """The weight dtypes the search took (the winner's among them) and the warnings beside it: strings only."""
    searched = r.array(data["weights_dtypes_searched"], "weights_dtypes_searched", limit=8)
    for i, dtype in enumerate(searched):
        r.schema("weights_dtype", dtype, f"weights_dtypes_searched[{i}]")
    order = [d.value for d in WEIGHT_DTYPES]
    if searched != sorted(set(searched), key=lambda d: order.index(d) if d in order else len(order)):
        raise r.fail("weights_dtypes_searched", "is not a list of distinct dtypes in serve-plan's order")
    listed = [("best", best), *((f"top[{i}]", p) for i, p in enumerate(data["top"]))]
    listed += [(f"pareto[{i}]", p) for i, p in enumerate(data["pareto"])]
    listed += [(f"rejected[{i}]", p) for i, p in enumerate(data["rejected"])]
    for where, entry in listed:
        if entry["layout"]["weights_dtype"] not in searched:
            raise r.fail(f"{where}.layout.weights_dtype", "is not one of weights_dtypes_searched")
    for i, text in enumerate(r.array(data["warnings"], "warnings", limit=MAX_WARNINGS)):
        if not isinstance(text, str):
            raise r.fail(f"warnings[{i}]", f"must be a string, got {_shown(text)}")


def _fleet(r: _Reader, data: dict[str, Any]) -> tuple[ModelSpec, GPU]:
    """The model (a catalog name or a model file, read through the guarded reader) and the GPU."""
    model = check_model_path(data["model"], what=f"the model of {r.label}")
    try:
        spec = io.load_model(model)
    except (ValueError, OSError) as exc:
        raise ValueError(f"the model of {r.label}: {_io_message(exc)}") from None
    if not isinstance(data["gpu"], str):
        raise r.fail("gpu", f"must be a string, got {_shown(data['gpu'])}")
    try:
        gpu = io.load_gpu(check_model_path(data["gpu"], what="its name"))
    except (ValueError, OSError) as exc:
        raise ValueError(f"the gpu of {r.label}: {_io_message(exc)}") from None
    r.schema("gpus", data["gpus"], "gpus")
    return spec, gpu


def _io_message(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return f"cannot read {exc.filename or 'it'}: {exc.strerror or type(exc).__name__}"
    return str(exc)


def _request(r: _Reader, data: dict[str, Any]) -> dict[str, Any]:
    """The serve-plan request the file states: lengths, engine, objective, targets, concurrency."""
    r.schema("input_len", data["input_len"], "input_len")
    r.schema("output_len", data["output_len"], "output_len")
    r.schema("engine", data["engine"], "engine")
    if data["engine_source"] not in ENGINE_SOURCES:
        raise r.fail(
            "engine_source", f"must be one of {', '.join(ENGINE_SOURCES)}, got {_shown(data['engine_source'])}"
        )
    r.schema("serve_objective", data["objective"], "objective")
    r.schema("search_disaggregated", data["disaggregate_searched"], "disaggregate_searched")
    targets = r.table(data["targets"], TARGET_KEYS, "targets")
    ttft = r.schema("ttft_p99", targets["ttft_s_p99"], "targets.ttft_s_p99", optional=True)
    tpot = r.schema("tpot_p99", targets["tpot_s_p99"], "targets.tpot_s_p99", optional=True)
    concurrency = r.schema("concurrency", data["concurrency_total"], "concurrency_total", optional=True)
    objective = Objective(data["objective"])
    if objective is Objective.FEWEST_GPUS and concurrency is None:
        raise r.fail("objective", "fewest-gpus needs concurrency_total (serve-plan --concurrency)")
    hit = r.schema("prefix_hit_rate", data["prefix_hit_rate"], "prefix_hit_rate", optional=True)
    if data["speculative"] is not None or data["spec_acceptance"] is not None:
        raise r.fail(
            "speculative", "is set: a plan timed with speculative decoding is not exported (no drafting flags)"
        )
    return {
        "prefix_hit_rate": hit,
        "input_len": data["input_len"],
        "output_len": data["output_len"],
        "targets": Targets(ttft_p99_s=ttft, tpot_p99_s=tpot),
        "objective": objective,
        "concurrency": None if concurrency is None else float(concurrency),
        "engine": data["engine"],
        "launch": r.schema("launch", data["launch"], "launch"),
        "node_size": r.schema("node_size", data["node_size"], "node_size", optional=True),
        "capacity_scheduler": r.schema(
            "capacity_scheduler", data["capacity_scheduler"], "capacity_scheduler", optional=True
        ),
    }


def _listings(r: _Reader, data: dict[str, Any], best: dict[str, Any]) -> None:
    """The ranking, the front, the rejections and the counts beside the winner: their shapes and ranges."""
    top = r.array(data["top"], "top", limit=requests.MAX_TOP)
    for i, plan in enumerate(top):
        r.plan(plan, f"top[{i}]")
    if not top or top[0] != best:
        raise r.fail("best", "is not the first plan of top (serve-plan writes the winner there)")
    front = (0.0, math.inf)  # tokens/s per GPU rises along the front as tokens/s per user falls
    for i, point in enumerate(r.array(data["pareto"], "pareto", limit=PARETO_SHOWN)):
        where = f"pareto[{i}]"
        r.table(point, PARETO_KEYS, where)
        r.layout(point["layout"], f"{where}.layout")
        r.schema("max_batch", point["batch_cap_per_replica"], f"{where}.batch_cap_per_replica")
        per_gpu = r.positive(point["tokens_per_s_per_gpu"], f"{where}.tokens_per_s_per_gpu")
        per_user = r.positive(point["tokens_per_s_per_user"], f"{where}.tokens_per_s_per_user")
        if not (per_gpu > front[0] and per_user <= front[1]):
            raise r.fail(where, "is not on the front: tokens/s per GPU must rise and tokens/s per user fall along it")
        front = (per_gpu, per_user)
    for i, rejection in enumerate(r.array(data["rejected"], "rejected", limit=MAX_REJECTED)):
        r.table(rejection, ("layout", "reason"), f"rejected[{i}]")
        r.layout(rejection["layout"], f"rejected[{i}].layout")
        if not isinstance(rejection["reason"], str):
            raise r.fail(f"rejected[{i}].reason", f"must be a string, got {_shown(rejection['reason'])}")
    least = {
        "pareto_points_total": len(data["pareto"]),
        "layouts_meeting_targets": len(top),
        "layouts_evaluated": len(data["rejected"]),
        "points_evaluated": 0,
    }
    for key, lo in least.items():
        r.count(data[key], key, lo=lo)
    elapsed = data["elapsed_s"]
    if isinstance(elapsed, bool) or not isinstance(elapsed, int | float) or not 0 <= elapsed <= MAX_ELAPSED_S:
        raise r.fail("elapsed_s", f"must be a number of seconds in [0, {MAX_ELAPSED_S:g}], got {_shown(elapsed)}")


def _recomputed(
    r: _Reader, data: dict[str, Any], best: dict[str, Any], *, spec: ModelSpec, gpu: GPU, request: dict[str, Any]
) -> SavedServingPlan:
    """The winner checked as ``serve`` checks a layout, then computed again and compared with the file."""
    lay = best["layout"]
    tp, pp, replicas, split = lay["tp"], lay["pp"], best["replicas"], best["prefill_replicas"]
    if best["gpus"] != replicas * tp * pp:
        raise r.fail("best.gpus", f"= {best['gpus']} is not replicas x tp x pp = {replicas} x {tp} x {pp}")
    if best["gpus"] > data["gpus"]:
        raise r.fail("best.gpus", f"= {best['gpus']} is more than the fleet's gpus = {data['gpus']}")
    if split and (split >= replicas or not data["disaggregate_searched"]):
        why = "a search without split pools" if split < replicas else f"{replicas} replicas"
        raise r.fail("best.prefill_replicas", f"= {split} cannot come from {why}")
    context = request["input_len"] + request["output_len"]
    try:
        setup = resolve(
            spec,
            gpu=data["gpu"],
            gpus=best["gpus"],
            tp=tp,
            pp=pp,
            ep=lay["ep"],
            dp_attention=lay["dp_attention"],
            replicas=replicas,
            weights_dtype=lay["weights_dtype"],
            kv_dtype=lay["kv_dtype"],
            quant=lay["quant"],
            engine=request["engine"],
            context=context,
            launch=request["launch"],
            capacity_scheduler=request["capacity_scheduler"],
            node_size=request["node_size"],
        )
    except ValueError as exc:
        raise r.fail("best.layout", f"cannot be served: {exc}") from None
    searched = layouts(spec, setup.hw.gpu, gpus=data["gpus"], dtypes=[lay["weights_dtype"]])  # as asked for
    if setup.layout not in set(searched):
        fleet = f"{spec.name} on {data['gpus']} x {gpu.name}"
        raise r.fail("best.layout", f"is not a layout serve-plan searches for {fleet}")
    try:
        computed = plan_of_layout(spec, gpu, setup.layout, gpus=data["gpus"], prefill_replicas=split, **request)
    except ValueError as exc:
        raise r.fail("best", f"is no plan serve-plan makes of its layout: {exc}") from None
    for key in PLAN_KEYS:
        ours, theirs = computed[key], best[key]
        same = math.isclose(ours, theirs, rel_tol=REL_TOL) if isinstance(ours, float) else ours == theirs
        if not same:
            raise r.fail(
                f"best.{key}",
                f"is {theirs!r}, but serve-plan computes {ours!r} for this plan "
                "(the file was edited, or saved by another meshplan version: save it again)",
            )
    return SavedServingPlan(
        model=data["model"],
        spec=spec,
        layout=setup.layout,
        replicas=replicas,
        prefill_replicas=split,
        batch_cap_per_replica=computed["batch_cap_per_replica"],
        max_model_len=context,
        predicted={key: float(computed[key]) for key in PREDICTED_KEYS},
        launch=request["launch"],
        capacity_scheduler=request["capacity_scheduler"],
    )
