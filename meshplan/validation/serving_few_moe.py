"""A MoE model decoding a few sequences a step, against the published runs of catalog/serving/few_moe_decode.toml.

At 8 or fewer sequences a step per replica (reports/serve_coverage.py, ``SMALL_MOE_DECODE_BATCH``) a MoE model's
step is set by what the engine's release does around its kernels more than by the GPU: gpt-fast's Mixtral runs
within a few percent of the model, SGLang's DeepSeek-V3 releases of 2024-2025 three to five times slower than it,
its 2026 release within 10%. One engine family's constants cannot follow that, so ``serve`` keeps its figure and
widens the band beside it: the band of this module, measured over predicted time per output token on these rows,

    each source weighing the same (a row weighs 1 / its source's rows), P10, median and P90 of the log ratios,
    each side's distance from the median times f(k) = t_0.90(k - 1) sqrt(1 + 1/k) / z_0.90 for k sources

(validation/serving_band.py's rule for few sources), taken by serve as the union with the decode class's band
(reports/serve_band.py, ``few_moe``). Each row is typed as a user types ``meshplan serve`` and answered by the same
report; no constant is set on these rows. Whether each source falls inside the band built without it is the
band's own held-out check.
"""

from __future__ import annotations

import math
import statistics
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from meshplan.reports.serve import serve_report
from meshplan.reports.serve_band import FEW_MOE
from meshplan.validation.memory import best_constant_error
from meshplan.validation.serving_band import weighted_quantile, widening


def catalog() -> dict[str, Any]:
    """catalog/serving/few_moe_decode.toml: its sources and rows."""
    text = resources.files("meshplan").joinpath("catalog/serving/few_moe_decode.toml").read_text()
    return tomllib.loads(text)


def command(row: dict[str, Any]) -> str:
    """The ``meshplan serve`` line a user types for the row."""
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in row["flags"].items())
    return f"meshplan serve {row['model']} {flags}"


@dataclass(frozen=True, slots=True, kw_only=True)
class FewMoeRow:
    """One published row: its time per output token, serve's, and the batch serve decodes a step."""

    case: str
    source: str
    model: str
    measured_s: float
    predicted_s: float
    batch_per_replica: float

    @property
    def ratio(self) -> float:
        """Measured over predicted time."""
        return self.measured_s / self.predicted_s

    @property
    def error(self) -> float:
        """Predicted over measured time, minus one."""
        return self.predicted_s / self.measured_s - 1


def check(row: dict[str, Any]) -> FewMoeRow:
    """The row against ``serve``'s answer to its flags."""
    r = serve_report(row["model"], **row["flags"])
    return FewMoeRow(
        case=row["id"],
        source=row["source"],
        model=row["model"],
        measured_s=row["measured_tpot_ms"] / 1e3,
        predicted_s=r["tpot_s"],
        batch_per_replica=r["batch_per_replica"],
    )


def band(rows: list[FewMoeRow]) -> dict[str, float]:
    """The band's numbers (module docstring) under ``FEW_MOE`` (catalog/serving/held_out.toml's ``decode_few_moe_``
    keys): P10, median and P90 of measured over predicted time, the rows and sources behind them and the widening
    applied. Fewer than two sources say nothing of how releases differ: refused."""
    by_source: dict[str, list[float]] = {}
    for r in rows:
        by_source.setdefault(r.source, []).append(math.log(r.ratio))
    k = len(by_source)
    if k < 2:
        raise ValueError(f"the few-sequence MoE band needs rows of two sources or more, got {k}")
    logs = [x for v in by_source.values() for x in v]
    weights = [1 / len(v) for v in by_source.values() for _ in v]
    lo, mid, hi = (weighted_quantile(logs, weights, q) for q in (0.1, 0.5, 0.9))
    f = widening(k)
    return {
        f"{FEW_MOE}_time_ratio_p10": math.exp(mid - f * (mid - lo)),
        f"{FEW_MOE}_time_ratio_p50": math.exp(mid),
        f"{FEW_MOE}_time_ratio_p90": math.exp(mid + f * (hi - mid)),
        f"{FEW_MOE}_runs": float(len(rows)),
        f"{FEW_MOE}_sources": float(k),
        f"{FEW_MOE}_widening": f,
    }


def inside(r: FewMoeRow, numbers: dict[str, float]) -> bool:
    return numbers[f"{FEW_MOE}_time_ratio_p10"] <= r.ratio <= numbers[f"{FEW_MOE}_time_ratio_p90"]


def few_moe() -> dict[str, Any]:
    """``validate --serving``'s block: every row (published, predicted, error, inside the band built without its
    source), the band from all of them, the mean |error| beside the best single constant, and the share held."""
    data = catalog()
    rows = [check(row) for row in data["row"]]
    numbers = band(rows)
    held: dict[str, bool] = {}
    for source in {r.source for r in rows}:
        without = band([r for r in rows if r.source != source])
        held |= {r.case: inside(r, without) for r in rows if r.source == source}
    return {
        "sources": data["source"],
        "rows": [
            {
                "case": r.case,
                "source": r.source,
                "model": r.model,
                "measured_s": r.measured_s,
                "predicted_s": r.predicted_s,
                "error": r.error,
                "batch_per_replica": r.batch_per_replica,
                "inside_band_without_source": held[r.case],
            }
            for r in rows
        ],
        "band": numbers,
        "mean_abs_error": statistics.fmean(abs(r.error) for r in rows),
        "best_constant_mean_abs_error": best_constant_error([r.measured_s for r in rows]),
        "inside_band_without_source": sum(held.values()) / len(held),
    }
