"""The released serving sources as a user of ``meshplan serve`` gets them: each source's error per metric class and
how many of its rows fall inside a serving band (docs/validation.md, "Released serving sources, before they were
used").

python benchmarks/serving_released.py                       # today's serve, today's printed band
python benchmarks/serving_released.py --kv-dtype bf16 --band OLD.toml
                                                            # serve's earlier bf16 KV default, an earlier band
                                                            # (git show REV:meshplan/catalog/serving/held_out.toml)
python benchmarks/serving_released.py --without-own-source  # each source against the band built without it

Each row is typed with serve's own flags and only what its source states (validation/serving_typed.py); the error
is serve's raw prediction (no correction), and a row is inside the band when its measured over predicted time (a
latency's ratio, a rate's inverse) lies within the P10-P90 serve prints for a question like it (its metric class's
band for its engine family, widened for an engine, GPU kind or model class no row ran).
"""

from __future__ import annotations

import argparse
import statistics
import tomllib
from pathlib import Path

from meshplan import io
from meshplan.validation import serving_band
from meshplan.validation.serving import Row, best_efficiency_error, predict_rows, reference_rows, typed_rows
from meshplan.validation.serving_band import band_without

RELEASED = ("splitwise_perf_csv", "nim_bench_llm")


def time_ratio(r: Row) -> float:
    """Measured over predicted time: a latency's ratio, a rate's inverse."""
    assert r.predicted is not None
    return r.measured / r.predicted if r.metric.endswith("_ms") else r.predicted / r.measured


def inside(r: Row, band: dict[str, float]) -> bool:
    """Within the P10-P90 a question like the row's takes (its engine family's, widened for what no row ran:
    reports/serve_band.py), or its class's in a band file of an earlier revision, which has no family."""
    key = r.metric_class.replace("-", "_")
    if f"{key}_unseen_engine_log" in band:
        return serving_band.inside(r, band)
    return band[f"{key}_time_ratio_p10"] <= time_ratio(r) <= band[f"{key}_time_ratio_p90"]


def table(rows: list[Row], band: dict[str, float], bands: dict[str, dict[str, float]] | None = None) -> list[str]:
    """Per source and class (then all released rows per class); ``bands``: a band per source, else ``band``."""
    out = [
        "| source | metric class | rows | mean abs error | max | too fast | best single constant | inside band |",
        "|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.source, r.metric_class), []).append(r)
    for r in rows:
        groups.setdefault(("all released", r.metric_class), []).append(r)
    for (source, cls), members in sorted(groups.items(), key=lambda g: (g[0][0] == "all released", g[0])):
        errors = [r.error for r in members if r.error is not None]
        fast = sum(1 for r in members if time_ratio(r) > 1)
        inside_n = sum(inside(r, (bands or {}).get(r.source, band)) for r in members)
        out.append(
            f"| {source} | {cls} | {len(members)} | {100 * statistics.mean(abs(e) for e in errors):.1f}% "
            f"| {100 * max(abs(e) for e in errors):.1f}% | {fast} of {len(members)} "
            f"| {100 * best_efficiency_error(members):.1f}% | {inside_n} of {len(members)} |"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv-dtype", default=None, help="force serve's KV dtype (default: serve's own default)")
    parser.add_argument("--band", default=None, help="a serving held_out.toml (default: the catalog's)")
    parser.add_argument("--rows", action="store_true", help="also list every row")
    parser.add_argument("--without-own-source", action="store_true", help="each source against the band without it")
    args = parser.parse_args()
    band = tomllib.loads(Path(args.band).read_text()) if args.band else io.serving_held_out_band()
    rows = [p for r in reference_rows() if r["source"]["id"] in RELEASED for p in typed_rows(r, kv_dtype=args.kv_dtype)]
    bands = None
    if args.without_own_source:  # the band as validation builds it, from every source but the row's own
        every = [p for r in reference_rows() for p in predict_rows(r)]
        bands = {s: band_without(every, s) for s in RELEASED}
    print("\n".join(table(rows, band, bands)))
    if args.rows:
        print("\n| row | metric | published | predicted | error | measured / predicted time | inside band |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            assert r.error is not None
            print(
                f"| {r.case} | {r.metric} | {r.measured:.4g} | {r.predicted:.4g} | {100 * r.error:+.1f}% "
                f"| {time_ratio(r):.3f} | {'yes' if inside(r, (bands or {}).get(r.source, band)) else 'no'} |"
            )


if __name__ == "__main__":
    main()
