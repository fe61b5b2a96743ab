"""Published measured runs against meshplan's predictions (``meshplan validate``).

Each file in catalog/runs describes one source: the fleet, the stated
configuration of every run, the measured value, and the targets meshplan
holds itself to. Settings a paper does not state but says it tuned (the
micro-batch, the number of model chunks) are searched, and the best
prediction among those that fit in memory is taken, as the authors did.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import itertools
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from meshplan import io
from meshplan.core.plan import Plan, evaluate, metric_value
from meshplan.reports.conditions import WORKLOAD_SET_BY_STACK, condition_names, workload_kwargs
from meshplan.reports.inputs import (
    LayoutRequest,
    resolve_cluster,
    resolve_finetune,
    resolve_layout,
    resolve_order,
    resolve_workload,
)
from meshplan.reports.published_range import matmul_kind
from meshplan.reports.typed import estimate_defaults, finetune_request
from meshplan.spec import requests
from meshplan.spec.argv import flag_args
from meshplan.spec.cluster import Cluster
from meshplan.spec.model import ModelSpec
from meshplan.spec.profile import IDENTITY, Profile, apply_profile, parse_profile
from meshplan.validation import fit as profile_fit
from meshplan.validation.band import held_out_band

TUNABLE = {"micro_batch": (1, 2, 4, 8, 16, 32), "vpp": (1, 2, 3, 4, 5, 6, 8)}
VPP_CHUNKS = ("whole-layers", "any")
"""How a source's stack cuts a pipeline stage into its ``vpp`` chunks when ``vpp`` is tuned: "whole-layers" (the
default), only into chunks of whole layers: Megatron-LM of 2021 and Megatron-Core r0.8 build num_layers / (pp vpp)
layers per chunk and refuse a remainder (megatron/training/arguments.py, num_layers_per_virtual_pipeline_stage), so
the tuned values are the divisors of the layers per stage; "any": chunks of unequal sizes, as a stack that cuts
stages unevenly runs them (the tuned values of ``TUNABLE``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """One published run: what was measured, what meshplan predicts, and the relative error."""

    source: str
    case: str
    metric: str
    measured: float
    predicted: float
    layout: dict[str, Any]
    memory_bytes_per_gpu: float
    fits: bool
    delta_from: str | None
    gpu: str
    """The GPU kind the run ran on (its catalog name)."""
    mfu: float
    """The predicted run's MFU in the reports' convention (core/time/flops.py ``MFU_CONVENTION``: causal attention
    over the dense bf16 peak), whatever the source's metric (``measured_mfu``: the run's own, so counted)."""
    moe: bool
    """Whether the run's model routes tokens to experts."""
    matmul: str
    """Its matmuls' dtype as the published MFU range splits runs (reports/published_range.py ``matmul_kind``)."""

    @property
    def measured_mfu(self) -> float:
        """The MFU the run measured, in the reports' convention: the predicted MFU times predicted over measured
        step time (a rate's measured over predicted value), the model's FLOPs and the peak being the same."""
        ratio = self.predicted / self.measured if self.metric.endswith("_s") else self.measured / self.predicted
        return self.mfu * ratio

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1


def sources() -> dict[str, dict[str, Any]]:
    """Every catalog/runs file by name (``io.run_sources``)."""
    return io.run_sources()


def _model(case: dict[str, Any]) -> ModelSpec:
    model = io.load_model(case["model"])
    overrides = case.get("model_overrides", {})
    if overrides:
        name = f"{model.name} ({', '.join(f'{k}={v}' for k, v in overrides.items())})"
        model = dataclasses.replace(model, name=name, **overrides)
    return model


RUN_KEYS = ("id", "measured", "tune", "vpp_chunks", "delta_from", "model", "model_overrides", "layout")
"""Keys of a run that are not schema fields: what it is, what was measured, what the source tuned (and how its
stack cuts virtual pipeline chunks, ``VPP_CHUNKS``), the model as
the paper states it, and the layout (a table of the schema's layout fields). Every other key is a schema field,
given as a user would type it (``meshplan estimate --overlap-dp off ...``)."""


def case_values(case: dict[str, Any]) -> dict[str, Any]:
    """A run's schema values, parsed and checked by the schema (unknown keys are refused, never dropped)."""
    raw = {k: v for k, v in case.items() if k not in RUN_KEYS}
    return requests.parse_values(raw, allowed=requests.FIELDS, what="run")


def estimate_args(case: dict[str, Any], layout: dict[str, Any], *, model: str | None = None) -> list[str]:
    """The ``meshplan estimate`` arguments a user types for a run: its schema values and layout as flags.
    ``model``: the argument naming the model (a model file where the run changes the catalog's model)."""
    if case.get("model_overrides") and model is None:
        raise ValueError(f"run {case['id']!r} changes its model ({case['model_overrides']}): give a model file")
    return ["estimate", model or str(case["model"]), *flag_args(case_values(case) | dict(layout))]


def _cluster(values: dict[str, Any], profile: Profile) -> Cluster:
    fleet = ("node_size", "scale_out", "scale_out_bandwidth", "nics_per_node", "oversubscription")
    cluster = resolve_cluster(gpu=values["gpu"], gpus=values["gpus"], **{k: values.get(k) for k in fleet})
    return apply_profile(cluster, profile)


def _evaluate(case: dict[str, Any], layout: dict[str, Any], profile: Profile = IDENTITY) -> Plan:
    values = case_values(case)
    model, cluster = _model(case), _cluster(values, profile)
    lay = resolve_layout(LayoutRequest.parse(layout), gpus=values["gpus"])
    conditions = {name: values.get(name) for name in ("stack", *condition_names()) if name not in WORKLOAD_SET_BY_STACK}
    kwargs, _ = workload_kwargs(
        conditions,
        precision=values.get("precision"),
        attention=values.get("attention"),
        kernels=values.get("kernels"),
    )
    tuning = finetune_request(estimate_defaults() | values)  # fine-tuning and the optimizer, as estimate takes them
    work = resolve_workload(
        layout=lay,
        seq=values["seq"],
        global_batch=values["global_batch"],
        optimizer=values.get("optimizer") or "adamw",
        optimizer_bytes=values.get("optimizer_bytes"),
        finetune=resolve_finetune(tuning, model) if tuning else None,
        **kwargs,
    )
    return evaluate(model, cluster, lay, work, order=resolve_order(values.get("axis_order")))


def _metric(plan: Plan, metric: str) -> float:
    return metric_value(plan, metric)  # one definition, shared with the recipes' published figures


def _better(metric: str, a: float, b: float) -> bool:
    """Whether prediction a is the faster run."""
    return a < b if metric == "iteration_time_s" else a > b


def _candidates(case: dict[str, Any]) -> list[dict[str, Any]]:
    tune = case.get("tune", [])
    base = dict(case["layout"])
    options = [TUNABLE[name] for name in tune]
    chunks = case.get("vpp_chunks", VPP_CHUNKS[0])
    if chunks not in VPP_CHUNKS:
        raise ValueError(f"run {case['id']!r}: vpp_chunks must be one of {', '.join(VPP_CHUNKS)}, not {chunks!r}")
    if "vpp" in tune and chunks == "whole-layers":
        per_stage = _model(case).num_layers // base.get("pp", 1)
        options[tune.index("vpp")] = tuple(v for v in range(1, per_stage + 1) if per_stage % v == 0)
    out = []
    for values in itertools.product(*options):
        lay = dict(base, **dict(zip(tune, values, strict=True)))
        if lay.get("vpp", 1) > 1:
            lay["schedule"] = "interleaved"
        out.append(lay)
    return out


def run_case(source: str, case: dict[str, Any], metric: str, profile: Profile = IDENTITY) -> RunResult:
    """Predict one published run, searching the settings the source tuned."""
    plans = []
    for layout in _candidates(case):
        try:
            plans.append((_evaluate(case, layout, profile), layout))
        except ValueError:
            continue
    if not plans:
        raise ValueError(f"{source}: no configuration of case {case['id']!r} suits the model")
    fitting = [(p, lay) for p, lay in plans if p.memory.fits] or plans  # the run happened: keep it if none fits
    best: tuple[float, Plan, dict[str, Any]] | None = None
    for plan, layout in fitting:
        value = _metric(plan, metric)
        if best is None or _better(metric, value, best[0]):
            best = (value, plan, layout)
    assert best is not None
    value, plan, layout = best
    return RunResult(
        source=source,
        case=case["id"],
        metric=metric,
        measured=float(case["measured"]),
        predicted=value,
        layout={k: v for k, v in layout.items()},
        memory_bytes_per_gpu=float(plan.memory.per_gpu.total_bytes),
        fits=plan.memory.fits,
        delta_from=case.get("delta_from"),
        gpu=plan.cluster.gpu.name,
        mfu=float(plan.step.mfu),
        moe=plan.model.moe is not None,
        matmul=matmul_kind(plan.workload.precision.compute),
    )


_PROGRESS: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar("validate_progress", default=None)


@contextlib.contextmanager
def progress(report: Callable[[], None]) -> Iterator[None]:
    """Inside, ``report()`` is called after each run predicted (the CLI's progress line on a terminal)."""
    token = _PROGRESS.set(report)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def run_source(name: str, profile: Profile = IDENTITY) -> list[RunResult]:
    """Every run of one source, predicted with the catalog's constants scaled by ``profile``."""
    data = sources()[name]
    defaults = data.get("defaults", {})
    metric = data["source"]["metric"]
    report = _PROGRESS.get()
    out = []
    for case in data["case"]:
        out.append(run_case(name, {**defaults, **case}, metric, profile))
        if report is not None:
            report()
    return out


def best_constant_error(measured: list[float]) -> float:
    """Mean relative error of the best single constant prediction (the bar a model must clear)."""
    lo, hi = min(measured), max(measured)
    grid = [lo + (hi - lo) * i / 2000 for i in range(2001)]
    return min(statistics.mean(abs(c / m - 1) for m in measured) for c in grid)


def summarize(name: str, results: list[RunResult]) -> dict[str, Any]:
    """Mean and max errors of one source, and whether its targets hold."""
    spec = sources()[name]["source"]
    errors = [abs(r.error) for r in results]
    out: dict[str, Any] = {
        "source": name,
        "title": spec["title"],
        "metric": spec["metric"],
        "cases": len(results),
        "mean_abs_error": statistics.mean(errors),
        "max_abs_error": max(errors),
        "checks": [],
    }
    checks = out["checks"]
    if "target_mean" in spec:
        checks.append(_check("mean error", out["mean_abs_error"], spec["target_mean"]))
        checks.append(_check("max error", out["max_abs_error"], spec["target_max"]))
    if "target_vs_best_constant" in spec:
        const = best_constant_error([r.measured for r in results])
        out["best_constant_error"] = const
        checks.append(
            _check("mean error vs best constant", out["mean_abs_error"], spec["target_vs_best_constant"] * const)
        )
    if "target_abs" in spec:
        by_case = {r.case: r for r in results}
        for r in results:
            checks.append(
                _check(f"{r.case}: |predicted - measured|", abs(r.predicted - r.measured), spec["target_abs"])
            )
            if r.delta_from:
                base = by_case[r.delta_from]
                got, want = r.predicted - base.predicted, r.measured - base.measured
                same_sign = (got > 0) == (want > 0)
                checks.append(
                    {
                        "check": f"{r.delta_from} -> {r.case}: change {100 * got:+.1f} vs {100 * want:+.1f} points",
                        "value": abs(got - want),
                        "bound": spec["target_delta_abs"],
                        "ok": same_sign and abs(got - want) <= spec["target_delta_abs"],
                    }
                )
    out["ok"] = all(c["ok"] for c in checks)
    return out


def _check(label: str, value: float, bound: float) -> dict[str, Any]:
    return {"check": label, "value": value, "bound": bound, "ok": value <= bound}


def _rows(names: list[str], profile: Profile) -> list[tuple[str, str, str, float, float]]:
    return [(r.source, r.case, r.metric, r.measured, r.predicted) for n in names for r in run_source(n, profile)]


SHARED_SCALES = ("compute_scale",)
"""What the held-out fit moves across published sources: the compute efficiency. Each source ran on its own
fabric, whose links' constants come from nccl-tests measurements; a bandwidth scale shared by all of them is
not a constant of anything, and fitted it chases the model's structural misses (ZeRO-3 rows, FP8 stacks)."""


def leave_one_source_out(names: list[str] | None = None) -> dict[str, Any]:
    """Per source: its error when the shared scales are fitted on every other source, beside the best constant.

    The compute scale (SHARED_SCALES) is fitted to first order on the other sources (profile_fit.fit); the
    left-out source is then evaluated exactly with it. Also the fit on all sources together.
    """
    names = list(sources()) if names is None else names
    sens = profile_fit.sensitivities(lambda p: _rows(names, p), constants=("compute_scale", "comm_scale"))
    everything = profile_fit.fit(sens, free=SHARED_SCALES)
    out = []
    for name in names:
        others = [r for r in sens if r.source != name]
        mine = [r for r in sens if r.source == name]
        fitted = profile_fit.fit(others, free=SHARED_SCALES)
        held = run_source(name, fitted.profile)
        out.append(
            {
                "source": name,
                "cases": len(mine),
                "mean_abs_error": statistics.mean(abs(r.error) for r in run_source(name)),
                "loso_mean_abs_error": statistics.mean(abs(r.error) for r in held),
                "loso_compute_scale": fitted.profile.compute_scale,
                "loso_comm_scale": fitted.profile.comm_scale,
                "best_constant_error": best_constant_error([r.measured for r in held]),
                "loso_residuals": [r.error for r in held],
            }
        )
    return {
        "sources": out,
        "fit_all": {
            "compute_scale": everything.profile.compute_scale,
            "comm_scale": everything.profile.comm_scale,
            "mean_abs_error": everything.mean_abs_error,
        },
    }


def class_band(prefix: str, ratios: list[float]) -> dict[str, float]:
    """``{prefix}_time_ratio_p10``, ``_p50``, ``_p90`` and ``{prefix}_runs`` of a class's time ratios, each run
    weighing the same (the serving band's rule; the step-time band is validation/band.py's)."""
    tenths = statistics.quantiles(sorted(ratios), n=10, method="inclusive")
    return {
        f"{prefix}_time_ratio_p10": tenths[0],
        f"{prefix}_time_ratio_p50": statistics.median(ratios),
        f"{prefix}_time_ratio_p90": tenths[-1],
        f"{prefix}_runs": float(len(ratios)),
    }


GOAL_LOSO_VS_CONSTANT = 0.8
"""Each source's held-out error must be below this share of its best single constant (sources of 3+ runs)."""
GOAL_MEAN_THROUGHPUT = 0.06
"""Mean |error| over every published run."""


GOAL_SCALING_POINTS = 0.05
"""The step-time issue's bound on the fall of per-GPU throughput with fleet size: within 5 points of published."""
FLEET_KEYS = ("gpus", "global_batch")
"""What changes along a published series of fleet sizes (with the data-parallel degrees of the layout)."""
DATA_AXES = ("dp_shard", "dp_replicate", "micro_batch")
"""Layout fields that follow the fleet and the batch (a fixed batch on more GPUs takes smaller micro-batches)."""


def _per_gpu_throughput(metric: str, value: float, case: dict[str, Any]) -> float:
    """Tokens per second per GPU (or a quantity proportional to it within one series) from a run's metric."""
    if metric.endswith("_s"):  # a step time: the tokens of a step over it and the GPUs
        return float(case["global_batch"]) * float(case["seq"]) / (value * float(case["gpus"]))
    return value  # tokens/s per GPU, TFLOP/s per GPU and MFU of one model are each proportional to it


def scaling_series(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Published runs that differ only in fleet size (and the batch and data-parallel degrees that follow it),
    taken pairwise from one size to the next: the change of per-GPU throughput, published and predicted."""
    by_case = {(r["source"], r["case"]): r for r in runs}
    series: dict[tuple[str, str], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for name, data in sources().items():
        for raw in data["case"]:
            case = {**data.get("defaults", {}), **raw}
            run = by_case.get((name, case["id"]))
            if run is None or "gpus" not in case:
                continue
            same = {k: v for k, v in case.items() if k not in (*FLEET_KEYS, "id", "measured", "layout")}
            layout = {k: v for k, v in case.get("layout", {}).items() if k not in DATA_AXES}  # as stated
            key = (name, repr(sorted({**same, **{f"layout.{k}": v for k, v in layout.items()}}.items())))
            series.setdefault(key, []).append((case, run))
    out = []
    for (name, _), members in sorted(series.items()):
        members.sort(key=lambda m: int(m[0]["gpus"]))
        for (c1, r1), (c2, r2) in itertools.pairwise(members):
            if int(c1["gpus"]) == int(c2["gpus"]):
                continue
            out.append(
                {
                    "source": name,
                    "from_case": r1["case"],
                    "to_case": r2["case"],
                    "gpus_from": int(c1["gpus"]),
                    "gpus_to": int(c2["gpus"]),
                    "measured_change": _change(r1, c1, r2, c2, "measured"),
                    "predicted_change": _change(r1, c1, r2, c2, "predicted"),
                }
            )
    return out


def _change(r1: dict[str, Any], c1: dict[str, Any], r2: dict[str, Any], c2: dict[str, Any], key: str) -> float:
    """Relative change of per-GPU throughput from run 1 to run 2, of the published (or predicted) values."""
    before = _per_gpu_throughput(r1["metric"], r1[key], c1)
    return _per_gpu_throughput(r2["metric"], r2[key], c2) / before - 1


def goals(runs: list[dict[str, Any]], loso: dict[str, Any]) -> list[dict[str, Any]]:
    """The step-time issue's generalization goals, measured; reported beside the regression checks."""
    out = [_check("mean |error| over all runs", statistics.mean(abs(r["error"]) for r in runs), GOAL_MEAN_THROUGHPUT)]
    held = [e for s in loso["sources"] for e in s["loso_residuals"]]
    out.append(
        _check("held-out mean |error| over all runs", statistics.mean(abs(e) for e in held), GOAL_MEAN_THROUGHPUT)
    )
    for s in loso["sources"]:
        if s["cases"] >= 3 and s["best_constant_error"] > 0:
            bound = GOAL_LOSO_VS_CONSTANT * s["best_constant_error"]
            out.append(_check(f"{s['source']}: held-out error vs 0.8 x best constant", s["loso_mean_abs_error"], bound))
    pairs = scaling_series(runs)
    if pairs:
        worst = max(abs(p["predicted_change"] - p["measured_change"]) for p in pairs)
        label = f"per-GPU throughput change with fleet size, worst of {len(pairs)} published steps (points / 100)"
        out.append(_check(label, worst, GOAL_SCALING_POINTS))
    return out


def validate(only: str | None = None, *, held_out: bool = True, profile: str | None = None) -> dict[str, Any]:
    """Every published run, predicted; per-source error summaries and whether all targets hold.

    Over all sources (``only`` None) and with ``held_out``, also each source's leave-one-source-out error,
    the issue's generalization goals (reported, not part of ``all_ok``) and the step-time band those held-out
    errors make (validation/band.py; catalog/held_out.toml stores it). With a cluster ``profile``
    (``--profile``) every run is predicted with its scales, and no held-out fit is made.
    """
    scales = parse_profile(profile)
    names = list(sources())
    if only is not None:
        if only not in names:
            raise ValueError(f"unknown source {only!r} (sources: {', '.join(names)})")
        names = [only]
    runs, summaries = [], []
    for name in names:
        results = run_source(name, scales)
        runs += [dict(dataclasses.asdict(r), error=r.error, measured_mfu=r.measured_mfu) for r in results]
        summaries.append(summarize(name, results))
    out: dict[str, Any] = {"runs": runs, "sources": summaries, "all_ok": all(s["ok"] for s in summaries)}
    if only is None and held_out and scales.is_identity:
        loso = leave_one_source_out(names)
        out["held_out"] = loso
        out["goals"] = goals(runs, loso)
        out["scaling"] = scaling_series(runs)
        out["band"] = held_out_band(out)
    return out
