"""MLPerf Inference's Llama-2-70B Server runs against ``meshplan serve`` typed as their submissions state them
(catalog/serving/mlperf_server.toml; meshplan/validation/serving_load.py): TTFT and TPOT at p50, p99 and mean,
predicted and published, and whether each published figure lies inside the P10-P90 serve prints beside it.

python benchmarks/mlperf_server.py              # one table of every figure, then the summary
python benchmarks/mlperf_server.py --commands   # also the serve line typed for each row
"""

from __future__ import annotations

import argparse

from meshplan.validation.serving_load import command, rows, summary


def _ms(x: float | None) -> str:
    return "saturated" if x is None else f"{1e3 * x:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", action="store_true", help="print the serve line typed for each row")
    args = parser.parse_args()
    s = summary()
    print("| row | figure | published ms | predicted ms | error | P10-P90 printed, ms | inside |")
    print("|---|---|---|---|---|---|---|")
    for c in s["checks"]:
        err = "saturated" if c.predicted_s is None else f"{c.error:+.0%}"
        band = f"{_ms(c.band_s[0])} - {_ms(c.band_s[1])}"
        print(f"| {c.row} | {c.figure} | {_ms(c.measured_s)} | {_ms(c.predicted_s)} | {err} | {band} | "
              f"{'yes' if c.inside else 'no'} |")  # fmt: skip
    print()
    for rid, r in s["reports"].items():
        print(
            f"{rid}: {r['batch_per_replica']:,.0f} sequences in flight a replica (P10-P90 "
            f"{r['load_band']['batch_per_replica'][0]:,.0f}-{r['load_band']['batch_per_replica'][1]:,.0f}), "
            f"{r['tokens_per_s_per_gpu']:,.0f} of at most {r['max_tokens_per_s_per_gpu']:,.0f} tokens/s a GPU"
        )
    print("\nOffline runs (serve --num-requests 24576 at the Offline config's batch cap), tokens/s of 8 GPUs:")
    for o in s["offline"]:
        lo, hi = o["band_tokens_per_s"]
        print(f"  {o['case']}: published {o['measured_tokens_per_s']:,.0f}, predicted "
              f"{o['predicted_tokens_per_s']:,.0f} ({o['error']:+.1%}), P10-P90 {lo:,.0f}-{hi:,.0f}")  # fmt: skip
    err, const = s["p99_mean_abs_error"], s["p99_best_constant_mean_abs_error"]
    print(f"  mean |error| {s['offline_mean_abs_error']:.1%} (best constant "
          f"{s['offline_best_constant_mean_abs_error']:.1%})")  # fmt: skip
    print(
        f"\nmean |error| at p99: TTFT {err['ttft']:.1%}, TPOT {err['tpot']:.1%} (best constant {const['ttft']:.1%}, "
          f"{const['tpot']:.1%}); inside the printed band: {s['inside']:.0%} of {len(s['checks'])} figures"
    )  # fmt: skip
    if args.commands:
        print()
        for row in rows():
            print(command(row))
            print(command(row, offline=True))


if __name__ == "__main__":
    main()
