"""Disaggregated serving search speed: `meshplan serve-plan --search-disaggregated` from 64 to 16,384 GPUs.

    python benchmarks/serve_disagg_speed.py

Two cases: llama-3.1-70b on h100-sxm, 2048 tokens in and 256 out, and the same with 8000 in, 300 out under a
TTFT p99 of 2 s and a TPOT of 30 ms, where split pools win.

Each run is a fresh process on one core (OMP_NUM_THREADS=1) that runs the CLI command once; it prints the
command's wall time and the process's peak RSS. On 64 and 256 GPUs the same command is run again with every
split of every layout ranked (the search before the bound, kept as the reference by setting
``core.serving.search.EVERY_SPLIT_UP_TO`` past any fleet), and the best plan, the top list and the Pareto front must be
the same. Target: 1,024 and 16,384 GPUs well under 10 s each (the CLI has no time limit; the API's search limit
is 60 s); 10,000,000 GPUs, the most the CLI and the API take, is run too.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

FLEETS = (64, 256, 1024, 16384, 10_000_000)
CHECKED = (64, 256)
SAME = ("best", "top", "pareto", "pareto_points_total", "rejected")


def _one(argv: list[str], every: bool) -> None:
    """Child: run the command once, print wall time, peak RSS and the plan as one JSON line."""
    from meshplan.cli import main
    from meshplan.core.serving import search as serve_search
    from meshplan.reports import serve_plan  # noqa: F401  (imported before the clock starts)

    if every:
        serve_search.EVERY_SPLIT_UP_TO = sys.maxsize
    out = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    wall = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    plan = json.loads(out.getvalue()) if code == 0 else {}
    print(json.dumps({"code": code, "wall_s": wall, "peak_rss_mb": peak_mb} | {k: plan.get(k) for k in SAME}
                     | {k: plan.get(k) for k in ("layouts_meeting_targets", "points_evaluated")}))  # fmt: skip


def _run(argv: list[str], every: bool) -> dict:
    cmd = [sys.executable, __file__, "--child", json.dumps(argv)] + (["--every"] if every else [])
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=Path(__file__).parents[1])
    return json.loads(done.stdout.strip().splitlines()[-1])


CASES = (
    ["llama-3.1-70b", "--gpu", "h100-sxm", "--input-len", "2048", "--output-len", "256"],
    # long prompts under a tight TPOT: split pools win
    ["llama-3.1-70b", "--gpu", "h100-sxm", "--input-len", "8000", "--output-len", "300", "--ttft-p99", "2",
     "--tpot-p99", "0.03"],
)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--every", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _one(json.loads(args.child), args.every)
        return
    failed = False
    for case in CASES:
        base = ["serve-plan", *case, "--search-disaggregated", "--json"]
        print(f"meshplan {' '.join(base[:-1])} --gpus N   (one process each, OMP_NUM_THREADS=1)")
        for gpus in FLEETS:
            argv = [*base, "--gpus", str(gpus)]
            r = _run(argv, every=False)
            ranked = f"ranked {r['layouts_meeting_targets']:,}, points {r['points_evaluated']:,}"
            print(f"{gpus:>10,} GPUs  {r['wall_s']:6.2f} s  peak RSS {r['peak_rss_mb']:5.0f} MB  {ranked}  "
                  f"{_plan(r['best'])}")  # fmt: skip
            if gpus in CHECKED:
                ref = _run(argv, every=True)
                same = all(r[k] == ref[k] for k in SAME)
                failed |= not same
                print(f"{'':>10}  every split: {ref['wall_s']:6.2f} s  peak RSS {ref['peak_rss_mb']:5.0f} MB  "
                      f"ranked {ref['layouts_meeting_targets']:,}, points {ref['points_evaluated']:,}  "
                      f"best, top {len(r['top'])}, Pareto front {r['pareto_points_total']}: "
                      f"{'the same' if same else 'DIFFERENT'}")  # fmt: skip
    if failed:
        sys.exit("the bounded search's plans differ from those of every split")


def _plan(best: dict | None) -> str:
    if not best:
        return "no plan"
    lay = best["layout"]
    return (f"best {best['replicas']:,} x tp{lay['tp']} pp{lay['pp']} {lay['weights_dtype']}, "
            f"{best['prefill_replicas']:,} prefill, {best['tokens_per_s_per_gpu']:,.0f} tok/s/GPU")  # fmt: skip


if __name__ == "__main__":
    main()
