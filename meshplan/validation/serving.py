"""Published serving measurements against meshplan's serving model (``meshplan validate --serving``).

The 68 rows of ../shared/reference/serving_runs.json (TensorRT-LLM performance tables, gpt-fast batch-1
decode, SGLang disaggregated DeepSeek-V3, and the released Splitwise profiles and NIM sweep, these typed as
``serve``'s flags: validation/serving_typed.py) and the 16 MoE rows of runs_moe.json are predicted with the engine
family's constants. Rows that break physics (faster than the HBM bandwidth allows even with ideal kernels) are
flagged, not fitted. Per source, three errors: the model's, the model's after a per-metric correction fitted on the
other sources only (leave-one-source-out, each source weighing the same: validation/serving_band.py), and the best
single efficiency constant on a bare roofline fitted on the source's own answers (the bar to beat).
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
from dataclasses import dataclass
from functools import cache
from typing import Any

from meshplan import io
from meshplan.core.serving.bill import QUANT_GROUP
from meshplan.core.serving.caps import trtllm_bench_caps
from meshplan.core.serving.load import Requests, load_point
from meshplan.core.serving.offline import offline_run
from meshplan.core.serving.phases import decode_step, prefill
from meshplan.core.serving.shape import ServeCalibration, replica_shape
from meshplan.core.serving.static import static_batch_s
from meshplan.reports.serve import Setup, resolve
from meshplan.reports.serve_band import band_family
from meshplan.reports.serve_coverage import row_model, serving_rows
from meshplan.validation.serving_band import held_out, held_out_band
from meshplan.validation.serving_few_moe import few_moe
from meshplan.validation.serving_load import under_load
from meshplan.validation.serving_typed import (
    TYPED_BY_DEFAULTS,
    TYPED_KINDS,
    ideal_setup,
    predict_typed,
    stated_elsewhere,
    typed_metric_class,
    typed_setup,
)

ENGINE_OF_SOURCE = {"trtllm": "trtllm", "gptfast": "gpt-fast", "sglang": "sglang"}
QUANTIZED_KV_ENGINES = ("trtllm",)
"""Engines whose KV cache follows FP8/FP4 weights when a run leaves it unstated (TensorRT-LLM: 'If you specify FP8
quantization, the KV cache will automatically be set to FP8 as well!', perf-overview, release 0.14). SGLang's
--kv-cache-dtype defaults to 'auto', the model's data type (bf16 for DeepSeek-V3's FP8 checkpoint)."""
GRAPH_PADDING_NOTES = ("enable_padding", "padding_enabled")
"""How the PyTorch-backend recipes state cuda_graph_config's padding (perf-overview llm_options.yml)."""
PERF_OVERVIEW_REQUESTS = {
    (128, 128): 30000,
    (128, 2048): 3000,
    (128, 4096): 1500,
    (1000, 2000): 1500,
    (2048, 128): 3000,
    (2048, 2048): 1500,
    (5000, 500): 1500,
    (1000, 1000): 3000,
    (500, 2000): 3000,
    (20000, 2000): 1000,
}
"""$num_requests per (ISL, OSL) of TensorRT-LLM's performance overview ('For each input and output sequence length
combination, the table below details the $num_requests that were used', v0.14 edition, the same in v1.0): what a
trtllm-bench row that does not repeat it ran."""
UNBOUNDED = 1e9
"""Concurrency standing for 'all requests queued at once' (the offline benchmarks) where the run does not state how
many requests it sends; where it does, that number is the most sequences ever in flight."""
STATED_TOKENS_PER_DEVICE = 16384
"""Prefill tokens per GPU per forward in the SGLang large-EP runs (stated for ISL 4K, assumed for 1K and 2K)."""
TARGETS = {
    "decode": (0.10, 0.30),
    "prefill": (0.15, 0.35),
    "throughput-dense": (0.15, None),
    "throughput-moe": (0.25, None),
}
"""Mean and max |error| targets per metric class (issue 14)."""


LOW_KV_BYTES = 10e9
"""trtllm-bench's own warning: below 10 GB of KV cache per GPU 'Performance may be undesirable'
(tensorrt_llm/bench/build/tuning.py, calc_engine_setting, release 0.14). A TensorRT-LLM throughput row the
serving bill leaves under it is shown with status ``warned`` and not counted: the engine declares the setting
outside what it tunes for, and meshplan's bill of what it holds on such a GPU is not checked by any source."""


@cache
def reference_rows() -> list[dict[str, Any]]:
    """catalog/serving/runs.json (the shared serving_runs.json), then runs_moe.json (rows transcribed by meshplan
    from the same public tables, beyond the shared set: the MoE throughput of TensorRT-LLM 0.14, Mixtral, held out
    from every constant)."""
    return list(serving_rows())


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One published measurement, predicted."""

    case: str
    source: str
    engine: str
    metric: str
    metric_class: str
    measured: float
    predicted: float | None
    roofline: float | None
    """The same quantity from a bare roofline (ideal HBM and peak, no communication or overhead)."""
    status: str
    """ok, unclean (a setting the source does not state), physics (faster than physics allows), warned (the
    engine warns that the setting is outside what it tunes for), skipped."""
    reason: str
    shared: bool
    """From the shared serving_runs.json (else from catalog/serving/runs_moe.json)."""
    gpu: str = ""
    """The catalog GPU kind it ran on (the band's GPU-kind coverage)."""
    model: str = ""
    """The catalog model it ran (the band's model-class coverage: MoE, MLA)."""
    engine_stated: bool = True
    """Whether the source states its engine (else it is typed without --engine: TensorRT-LLM's constants, the band
    widened as for an unseen engine)."""

    @property
    def error(self) -> float | None:
        return None if self.predicted is None else self.predicted / self.measured - 1


def _engine(source_id: str) -> str:
    for prefix, engine in ENGINE_OF_SOURCE.items():
        if source_id.startswith(prefix):
            return engine
    raise ValueError(f"no engine family for source {source_id!r}")


def _dtype(text: str) -> str:
    for name in ("fp16", "bf16", "fp8", "fp4", "int8", "int4"):
        if text.startswith(name):
            return name
    raise ValueError(f"unknown dtype {text!r}")


def _setup(row: dict[str, Any], *, context: int, ideal: bool = False, max_num_tokens: int | None = None) -> Setup:
    par, prec = row["parallel"], row["precision"]
    weights = _dtype(prec["weights"])
    kv = prec.get("kv", "")
    quantized_kv = weights in ("fp8", "fp4") and _engine(row["source"]["id"]) in QUANTIZED_KV_ENGINES
    kv = _dtype(kv) if kv[:4] in ("fp8", "fp16", "bf16") else ("fp8" if quantized_kv else "bf16")
    dp_attention = bool(par.get("attention_dp"))
    ep = par["ep"] if isinstance(par["ep"], int) else 1
    tp = max(par["tp"], ep) if dp_attention else par["tp"]
    moe = row["model"]["arch"].startswith("moe")
    if moe and not dp_attention and ep == 1 and "--ep" in row["engine"].get("notes", ""):
        ep = tp  # the recipe passes --ep: experts over the TP group; else TensorRT-LLM's default expert TP
    quant = "weight-only" if "weight-only" in prec["weights"] else None
    group = re.search(r"group (\d+)", prec["weights"])
    notes = row["engine"].get("notes", "")
    fraction = re.search(r"mem_fraction (0\.\d+)", notes)
    setup = resolve(
        row["model"]["catalog"],
        gpu=row["hardware"]["catalog"],
        gpus=tp * par["pp"],
        tp=tp,
        pp=par["pp"],
        ep=ep,
        dp_attention=dp_attention,
        weights_dtype=weights,
        kv_dtype=kv,
        quant=quant,
        quant_group=int(group.group(1)) if group else QUANT_GROUP,
        engine=_engine(row["source"]["id"]),
        context=context,
        gpu_memory_utilization=float(fraction.group(1)) if fraction else None,  # the run's stated fraction
        max_num_tokens=max_num_tokens,
        cuda_graph_padding=any(k in notes for k in GRAPH_PADDING_NOTES),  # the recipe's cuda_graph_config
    )
    if "two-batch overlap disabled" in row["engine"].get("notes", ""):  # the run's stated engine setting
        setup = dataclasses.replace(setup, hw=dataclasses.replace(setup.hw, cal=_no_overlap(setup.hw.cal)))
    return ideal_setup(setup) if ideal else setup


def _no_overlap(cal: ServeCalibration) -> ServeCalibration:
    return dataclasses.replace(cal, two_batch_overlap=False, ep_overlap=0.0, ep_overlap_decode=0.0)


def bench_caps(row: dict[str, Any]) -> tuple[int | None, int | None]:
    """(max batch, max tokens per step) of a trtllm-bench throughput run that leaves them to trtllm-bench (its
    heuristic, core/serving/caps.py, on the run's model, GPU, layout, dtypes and mean lengths); (None, None) for
    every other run, which keeps the engine family's defaults."""
    bench = _engine(row["source"]["id"]) == "trtllm" and "trtllm-bench" in row["engine"].get("notes", "")
    if row["kind"] != "offline_throughput_ifb" or not bench:
        return None, None
    w = row["workload"]
    isl, osl = int(w["isl"]), int(w["osl"])
    setup = _setup(row, context=isl + osl)
    lay = setup.layout
    batch, tokens = trtllm_bench_caps(
        setup.model,
        gpu=setup.hw.gpu,
        tp=lay.tp,
        pp=lay.pp,
        weights_dtype=lay.weights_dtype,
        kv_dtype=lay.kv_dtype,
        input_len=isl,
        output_len=osl,
    )
    return int(batch), int(tokens)


def _num_requests(row: dict[str, Any]) -> int | None:
    """The requests an offline run sends: stated by the row, else by its source's table (trtllm-bench runs)."""
    w = row["workload"]
    if isinstance(w.get("num_requests"), int):
        return int(w["num_requests"])
    if bench_caps(row)[0] is None:
        return None
    return PERF_OVERVIEW_REQUESTS.get((int(w["isl"]), int(w["osl"])))


def _measured(row: dict[str, Any]) -> tuple[str, float]:
    ((metric, value),) = row["measured"].items() if len(row["measured"]) == 1 else [next(iter(row["measured"].items()))]
    return metric, float(value["value"])


def _predict(row: dict[str, Any], metric: str, ideal: bool) -> float:
    """The measured quantity, as the model (or the bare roofline) predicts it."""
    w, kind = row["workload"], row["kind"]
    isl = int(w["isl"])
    osl = w["osl"] if isinstance(w.get("osl"), int) else 1
    max_batch, max_tokens = bench_caps(row)
    setup = _setup(row, context=isl + osl, ideal=ideal, max_num_tokens=max_tokens)
    m, sh, hw, lay = setup.model, setup.shape, setup.hw, setup.layout
    gpus = lay.gpus_per_replica
    if kind == "offline_throughput_static_batch":
        pre, dec = static_batch_s(m, sh, hw, lay, batch=w["batch"], input_len=isl, output_len=osl)
        return float(w["batch"] * osl / (pre + dec) / gpus)
    if kind == "prefill_latency_bs1":
        return 1e3 * float(prefill(m, sh, hw, lay, tokens=isl).total_s)
    if kind == "decode_latency_bs1":
        return 1.0 / float(decode_step(m, sh, hw, lay, batch=1, context=isl + osl / 2).total_s)
    if kind == "offline_throughput_ifb":
        stated = _num_requests(row)  # all of them queued at once: never more in flight than the run holds
        users = float(stated) if stated is not None else UNBOUNDED
        req = Requests(input_len=isl, output_len=osl, concurrency=users, max_batch=max_batch)
        pt = load_point(m, sh, hw, lay, req)
        if stated is None:
            return pt.output_tokens_per_s
        cap = min(pt.capacity.sequences, stated)
        run = offline_run(m, sh, hw, lay, input_len=isl, output_len=osl, num_requests=stated, max_sequences=cap)
        return run.output_tokens_per_s
    per_node = 8 if metric.endswith("per_node") else 1
    if kind == "disagg_prefill_throughput":
        tokens = w["tokens_per_device"] if isinstance(w.get("tokens_per_device"), int) else STATED_TOKENS_PER_DEVICE
        t = float(prefill(m, sh, hw, lay, tokens=tokens, sequences=tokens / isl).total_s)
        return per_node * tokens / t
    if kind == "disagg_decode_throughput":
        batch = w.get("batch_per_device")
        if not isinstance(batch, int):
            full = replica_shape(m, hw, lay, context=isl)
            batch = int(min(full.max_sequences(m, tokens_per_sequence=isl), hw.cal.max_batch))
        t = float(decode_step(m, sh, hw, lay, batch=batch, context=w.get("kv_cache_length", isl)).total_s)
        return per_node * batch / t
    raise ValueError(f"unknown kind {kind!r}")


def _metric_class(row: dict[str, Any]) -> str:
    kind = row["kind"]
    if "prefill" in kind:
        return "prefill"
    if kind.startswith("decode") or kind == "disagg_decode_throughput":
        return "decode"
    return "throughput-moe" if row["model"]["arch"].startswith("moe") else "throughput-dense"


def predict_row(row: dict[str, Any]) -> Row:
    """The row's first metric, predicted (the engines' own tables state one each)."""
    return predict_rows(row)[0]


def predict_rows(row: dict[str, Any]) -> list[Row]:
    """Each metric of the row, predicted: the first of an engine table's row, every one of a typed row."""
    if row["kind"] in TYPED_KINDS:
        return typed_rows(row)
    metric, measured = _measured(row)
    base = {
        "case": row["id"],
        "source": row["source"]["id"],
        "engine": _engine(row["source"]["id"]),
        "metric": metric,
        "metric_class": _metric_class(row),
        "measured": measured,
        "shared": row["shared"],
        "gpu": row["hardware"]["catalog"] or "",
        "model": row_model(row) or "",
    }
    try:
        io.load_gpu(row["hardware"]["catalog"] or "")
    except ValueError:
        return [Row(**base, predicted=None, roofline=None, status="skipped", reason="GPU not in the catalog")]
    predicted = _predict(row, metric, ideal=False)
    roofline = _predict(row, metric, ideal=True)
    beyond = _beyond(metric, measured, roofline)
    if beyond:
        return [Row(**base, predicted=predicted, roofline=roofline, status="physics", reason=beyond)]
    warning = _engine_warning(row)
    if warning:
        return [Row(**base, predicted=predicted, roofline=roofline, status="warned", reason=warning)]
    status, reason = ("ok", "") if row["clean"] else ("unclean", "; ".join(row.get("missing", [])))
    return [Row(**base, predicted=predicted, roofline=roofline, status=status, reason=reason)]


def _beyond(metric: str, measured: float, roofline: float) -> str:
    """Why a measurement is beyond its ideal roofline (faster than physics allows), or empty."""
    faster = measured < roofline if metric.endswith("_ms") else measured > roofline
    return f"measured {measured:.4g} is beyond the ideal roofline {roofline:.4g}: not fitted" if faster else ""


def typed_rows(row: dict[str, Any], *, kv_dtype: str | None = None) -> list[Row]:
    """Every metric of a row typed as serve's flags (validation/serving_typed.py); ``kv_dtype`` forces one."""
    source = row["source"]["id"]
    setup, flags = typed_setup(row, kv_dtype=kv_dtype)
    ideal = ideal_setup(setup)
    out = []
    for metric, value in row["measured"].items():
        measured = float(value["value"])
        predicted, roofline = predict_typed(setup, flags, metric), predict_typed(ideal, flags, metric)
        engine = band_family(setup.hw.cal.engine, setup.hw.cal.launch.value)
        base = {"case": row["id"], "source": source, "engine": engine, "metric": metric}
        base |= {"metric_class": typed_metric_class(row, metric), "measured": measured, "shared": row["shared"]}
        base |= {"gpu": setup.hw.gpu.name, "model": setup.model.name}
        base |= {"engine_stated": setup.engine_source == "flag"}
        beyond = _beyond(metric, measured, roofline)
        if beyond:
            status, reason = "physics", beyond
        elif row["clean"] or source in TYPED_BY_DEFAULTS:  # the reason: what serve filled in, what was read elsewhere
            why = (TYPED_BY_DEFAULTS.get(source, ""), stated_elsewhere(source)[1])
            status, reason = "ok", "; ".join(w for w in why if w)
        else:
            status, reason = "unclean", "; ".join(row.get("missing", []))
        out.append(Row(**base, predicted=predicted, roofline=roofline, status=status, reason=reason))
    return out


def _engine_warning(row: dict[str, Any]) -> str:
    """The engine's own warning about the run's setting, where it gives one (else empty)."""
    if row["kind"] != "offline_throughput_ifb" or _engine(row["source"]["id"]) != "trtllm":
        return ""
    w = row["workload"]
    kv = _setup(row, context=int(w["isl"]) + int(w["osl"]), max_num_tokens=bench_caps(row)[1]).shape.kv_budget_bytes
    if kv >= LOW_KV_BYTES:
        return ""
    return (
        f"{kv / 1e9:.1f} GB of KV cache per GPU: trtllm-bench warns below {LOW_KV_BYTES / 1e9:.0f} GB "
        "('Performance may be undesirable'): not counted"
    )


def _mean_abs(values: list[float]) -> float:
    return statistics.mean(abs(v) for v in values) if values else math.nan


def best_efficiency_error(rows: list[Row]) -> float:
    """Mean |error| of the bare roofline run at the one efficiency e that suits ``rows`` best: a rate
    predicted as e x its roofline, a latency as its roofline / e."""
    pairs = [(r.roofline, r.measured, r.metric.endswith("_ms")) for r in rows if r.roofline]
    if not pairs:
        return math.nan
    effs = [(roof / meas) if lower else (meas / roof) for roof, meas, lower in pairs]
    lo, hi = min(effs), max(effs)
    grid = [lo + (hi - lo) * i / 400 for i in range(401)]

    def error(e: float) -> float:
        return _mean_abs([(roof / e if lower else roof * e) / meas - 1 for roof, meas, lower in pairs])

    return min(error(e) for e in grid)


def _groups(rows: list[Row]) -> dict[tuple[str, str], list[Row]]:
    """The counted rows by (source, metric class), in that order."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        if r.status == "ok":
            groups.setdefault((r.source, r.metric_class), []).append(r)
    return dict(sorted(groups.items()))


def summarize(rows: list[Row]) -> dict[str, Any]:
    """Per source and metric class: the model's error, its leave-one-source-out error, the best constant."""
    fitted = [r for r in rows if r.status == "ok"]
    per_source = []
    loso_by_class: dict[str, list[float]] = {}
    loso_by_source: dict[str, list[float]] = {}
    for (source, cls), members in _groups(rows).items():
        k, held = held_out(rows, source, cls)
        loso = [p / r.measured - 1 for r, p in held]
        loso_by_class.setdefault(cls, []).extend(loso)
        loso_by_source.setdefault(cls, []).append(_mean_abs(loso))
        per_source.append(
            {
                "source": source,
                "metric_class": cls,
                "cases": len(members),
                "mean_abs_error": _mean_abs([r.error for r in members if r.error is not None]),
                "max_abs_error": max(abs(r.error) for r in members if r.error is not None),
                "loso_correction": k,
                "loso_mean_abs_error": _mean_abs(loso),
                "best_constant_mean_abs_error": best_efficiency_error(members),
            }
        )
    per_class = []
    for cls, (target_mean, target_max) in TARGETS.items():
        members = [r for r in fitted if r.metric_class == cls]
        if not members:
            continue
        errors = [abs(r.error) for r in members if r.error is not None]
        mean, worst = statistics.mean(errors), max(errors)
        held = _mean_abs(loso_by_class[cls])
        const = best_efficiency_error(members)
        per_class.append(
            {
                "metric_class": cls,
                "cases": len(members),
                "mean_abs_error": mean,
                "max_abs_error": worst,
                "loso_mean_abs_error": held,
                "loso_source_mean_abs_error": statistics.mean(loso_by_source[cls]),
                "sources": len(loso_by_source[cls]),
                "target_mean": target_mean,
                "target_max": target_max,
                "best_constant_mean_abs_error": const,
                # the targets hold on the shared set left out source by source: the LOSO mean too
                "ok": max(mean, held) <= target_mean
                and (target_max is None or worst <= target_max)
                and mean <= 0.75 * const,
            }
        )
    return {"sources": per_source, "classes": per_class}


def validate_serving() -> dict[str, Any]:
    rows = [p for r in reference_rows() for p in predict_rows(r)]
    summary = summarize(rows)
    few = few_moe()
    return {
        "runs": [dataclasses.asdict(r) | {"error": r.error} for r in rows],
        **summary,
        "band": held_out_band(rows) | few["band"],
        "all_ok": all(c["ok"] for c in summary["classes"]),
        "under_load": under_load(),
        "few_moe": few,
    }
