"""Serving planner speed: the full serve-plan search, five times, on one core (OMP_NUM_THREADS=1).

Target: under 1 s per search for one model and fleet. Prints each wall time and what was searched.
"""

from __future__ import annotations

import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from meshplan.reports.serve_plan import serve_plan_report

MLPERF = {"input_len": 1024, "output_len": 256, "ttft_p99_s": 2.0, "tpot_p99_s": 0.2}
CASES = [
    ("llama-2-70b", "h100-sxm", 8, MLPERF),
    ("llama-2-70b", "h100-sxm", 8, MLPERF | {"allow_quantization": True}),
    ("llama-2-70b", "h200", 8, MLPERF | {"allow_quantization": True}),
    (
        "llama-3.1-405b",
        "h200",
        64,
        {"input_len": 32768, "output_len": 1024, "objective": "fewest-gpus", "concurrency": 64},
    ),
    ("deepseek-v3", "h200", 32, {"input_len": 2000, "output_len": 1000, "tpot_p99_s": 0.1}),
]


def main() -> None:
    for model, gpu, gpus, kw in CASES:
        walls, r = [], {}
        for _ in range(5):
            start = time.perf_counter()
            r = serve_plan_report(model, gpu=gpu, gpus=gpus, **kw)  # type: ignore[arg-type]
            walls.append(time.perf_counter() - start)
        best = r["best"]
        lay = best["layout"] if best else None
        print(f"{model} on {gpus} x {gpu} {kw}")
        print(
            f"  layouts {r['layouts_evaluated']}, batch caps {r['points_evaluated']:,}, meeting targets "
            f"{r['layouts_meeting_targets']}, rejected {len(r['rejected'])}"
        )
        print("  wall per search: " + ", ".join(f"{w:.3f} s" for w in walls))
        print(f"  best {min(walls):.3f} s, median {statistics.median(walls):.3f} s")
        if best:
            print(
                f"  top: {best['replicas']} x {lay}, batch {best['batch_cap_per_replica']}, "
                f"{best['tokens_per_s_per_gpu']:,.0f} tok/s/GPU, {best['gpus']} GPUs"
            )


if __name__ == "__main__":
    main()
