"""Latency under Poisson arrivals against MLPerf Inference's Server runs (catalog/serving/mlperf_server.toml).

Each row is typed as ``meshplan serve`` takes it (``flags``; ``command`` prints the line a user types) and answered
by the same report, so the comparison is of what a user gets: the p50, p99 and mean of TTFT and TPOT, and whether
each published figure falls inside the P10-P90 the report prints beside it (``load_band``). Nothing in meshplan was
set on these rows. They sit where the submitters pushed the rate, 88-95% of what the system serves offline, where
a machine a few percent slower holds several times the sequences: the figures there follow the capacity's error
more than any step's, which is what the band under load propagates.
"""

from __future__ import annotations

import math
import statistics
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from meshplan.reports.serve import serve_report
from meshplan.validation.memory import best_constant_error

MODEL = "llama-2-70b"
PUBLISHED = {
    "ttft_s_p50": ("ttft_ms", "p50"),
    "ttft_s_p99": ("ttft_ms", "p99"),
    "ttft_s_mean": ("ttft_ms", "mean"),
    "tpot_s_p50": ("tpot_ms", "p50"),
    "tpot_s_p99": ("tpot_ms", "p99"),
    "tpot_s": ("tpot_ms", "mean"),
}
"""The report's figures each row publishes (TTFT and TPOT: p50, p99, mean), and where the row holds each."""
FIGURES = tuple(PUBLISHED)


def rows() -> list[dict[str, Any]]:
    """The rows of catalog/serving/mlperf_server.toml."""
    text = resources.files("meshplan").joinpath("catalog/serving/mlperf_server.toml").read_text()
    return list(tomllib.loads(text)["row"])


def flags(row: dict[str, Any]) -> dict[str, Any]:
    """``serve_report``'s keyword arguments for the row: what its submission states, nothing else."""
    return {
        "gpu": row["gpu"],
        "gpus": row["tp"] * row["replicas"],
        "tp": row["tp"],
        "replicas": row["replicas"],
        "engine": "trtllm",
        "weights_dtype": "fp8",
        "max_batch": row["max_batch"],
        "max_num_tokens": 4096,
        "capacity_scheduler": "max-utilization",
        "input_len": row["input_len"],
        "output_len": row["output_len"],
        "rate": row["rate_per_s"],
    }


OFFLINE_REQUESTS = 24576
"""The prompts an Offline run queues at once (the dataset's; loadgen's llama2-70b.Offline.min_query_count)."""


def offline_flags(row: dict[str, Any]) -> dict[str, Any]:
    """``serve_report``'s keyword arguments for the same system's Offline run: every prompt queued at once."""
    f = {k: v for k, v in flags(row).items() if k != "rate"}
    return f | {"max_batch": row["offline_max_batch"], "num_requests": OFFLINE_REQUESTS}


def command(row: dict[str, Any], *, offline: bool = False) -> str:
    """The ``meshplan serve`` line a user types for the row (its Offline run with ``offline``)."""
    f = offline_flags(row) if offline else flags(row)
    parts = [f"meshplan serve {MODEL}"] + [f"--{k.replace('_', '-')} {v}" for k, v in f.items()]
    return " ".join(parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadCheck:
    """One figure of one row: published, predicted (None: saturated), the printed P10-P90 and whether it holds it."""

    row: str
    figure: str
    measured_s: float
    predicted_s: float | None
    band_s: tuple[float | None, float | None]

    @property
    def inside(self) -> bool:
        lo, hi = self.band_s
        return (lo is None or lo <= self.measured_s) and (hi is None or self.measured_s <= hi)

    @property
    def error(self) -> float:
        """Predicted over measured, minus one (inf where the prediction saturates)."""
        return math.inf if self.predicted_s is None else self.predicted_s / self.measured_s - 1


def check(row: dict[str, Any]) -> tuple[list[LoadCheck], dict[str, Any]]:
    """The row's figures against ``serve``'s answer to its flags, and that answer."""
    r = serve_report(MODEL, **flags(row))
    out = []
    for fig in FIGURES:
        group, q = PUBLISHED[fig]
        lo, hi = r["load_band"][fig]
        out.append(
            LoadCheck(row=row["id"], figure=fig, measured_s=row[group][q] / 1e3, predicted_s=r[fig], band_s=(lo, hi))
        )
    return out, r


SOURCE = (
    "MLPerf Inference v4.0 and v4.1, Llama-2-70B Server, NVIDIA's TensorRT-LLM (catalog/serving/mlperf_server.toml)"
)
P99_TARGET = 0.25
"""The mean |error| asked of TTFT and TPOT at p99 on MLPerf-style Server rows (not met: validate says so)."""


def offline(row: dict[str, Any]) -> dict[str, Any]:
    """The same system's Offline result against ``serve --num-requests``: tokens/s of the whole fleet, published,
    predicted, the P10-P90 serve prints and whether it holds the published one."""
    r = serve_report(MODEL, **offline_flags(row))
    measured, predicted = row["offline_tokens_per_s"], r["offline"]["tokens_per_s_total"]
    band = tuple(predicted * r[f"tokens_per_s_per_gpu_{q}"] / r["tokens_per_s_per_gpu"] for q in ("p10", "p90"))
    return {
        "case": row["id"],
        "measured_tokens_per_s": measured,
        "predicted_tokens_per_s": predicted,
        "error": predicted / measured - 1,
        "band_tokens_per_s": list(band),
        "inside": band[0] <= measured <= band[1],
    }


def summary() -> dict[str, Any]:
    """Every row's checks, the mean |error| of TTFT and TPOT at p99, the share of figures inside the band, and the
    Offline runs."""
    checks, reports = [], {}
    for row in rows():
        got, r = check(row)
        checks += got
        reports[row["id"]] = r
    p99 = {k: [c for c in checks if c.figure == f"{k}_s_p99"] for k in ("ttft", "tpot")}
    runs = [offline(row) for row in rows()]
    return {
        "checks": checks,
        "reports": reports,
        "p99_mean_abs_error": {k: statistics.fmean(abs(c.error) for c in v) for k, v in p99.items()},
        "p99_best_constant_mean_abs_error": {k: best_constant_error([c.measured_s for c in v]) for k, v in p99.items()},
        "inside": sum(c.inside for c in checks) / len(checks),
        "offline": runs,
        "offline_mean_abs_error": statistics.fmean(abs(o["error"]) for o in runs),
        "offline_best_constant_mean_abs_error": best_constant_error([o["measured_tokens_per_s"] for o in runs]),
    }


def under_load() -> dict[str, Any]:
    """``validate --serving``'s block: each figure of each row (JSON-ready), the p99 errors against the target and
    the share of published figures inside the band printed beside them."""
    s = summary()
    err = s["p99_mean_abs_error"]
    return {
        "source": SOURCE,
        "figures": [
            {
                "case": c.row,
                "figure": c.figure,
                "measured_s": c.measured_s,
                "predicted_s": c.predicted_s,
                "error": None if c.predicted_s is None else c.error,
                "band_s": list(c.band_s),
                "inside": c.inside,
            }
            for c in s["checks"]
        ],
        "batch_per_replica": {k: r["batch_per_replica"] for k, r in s["reports"].items()},
        "p99_mean_abs_error": err,
        "p99_best_constant_mean_abs_error": s["p99_best_constant_mean_abs_error"],
        "target_p99": P99_TARGET,
        "inside_band": s["inside"],
        "ok": all(v <= P99_TARGET for v in err.values()),
        "offline": s["offline"],
        "offline_mean_abs_error": s["offline_mean_abs_error"],
        "offline_best_constant_mean_abs_error": s["offline_best_constant_mean_abs_error"],
    }
