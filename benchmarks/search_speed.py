"""Planner speed: the full search for llama-3.1-405b on 16,384 h100-sxm at 8K context and 16M-token batches.

    python benchmarks/search_speed.py [--repeat 5]

Prints the wall time of each repeat (after one warm-up), the best and the
median, the process (CPU) time of each (steadier than wall time on a shared
machine), and layout evaluations per second (every enumerated layout counts:
those a rule or the memory check rejects were evaluated to reject them).
Targets: under 1 s, at least 1,000,000 evaluations per second, on one core.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core: numpy must not fan out

from meshplan import io
from meshplan.reports.inputs import resolve_cluster
from meshplan.search.rank import search
from meshplan.spec.workload import Workload


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    model = io.load_model("llama-3.1-405b")
    cluster = resolve_cluster(gpu="h100-sxm", gpus=16384)
    work = Workload(seq_len=8192, global_batch=2048)  # 2048 x 8192 = 16.8M tokens
    search(model, cluster, work)  # warm-up
    times, cpu = [], []
    for _ in range(args.repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = search(model, cluster, work)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    best, median = min(times), statistics.median(times)
    print(f"layouts evaluated: {result.evaluated:,}; fit: {result.feasible:,}")
    print(f"rejections: {result.rejections}")
    print("wall per search: " + ", ".join(f"{t:.3f} s" for t in times))
    print(f"best {best:.3f} s, median {median:.3f} s")
    print(f"process time per search: best {min(cpu):.3f} s, median {statistics.median(cpu):.3f} s")
    print(f"evaluations per second: {result.evaluated / best:,.0f} (best), {result.evaluated / median:,.0f} (median)")
    top = result.candidates.layout(0)
    print(f"fastest: {top} at {float(result.step.step_time_s[0]):.2f} s per step")


if __name__ == "__main__":
    main()
