"""How long `meshplan compare` takes to read a large profiler trace, and how much memory it holds meanwhile.

    PYTHONPATH=$PWD python benchmarks/compare_trace_read.py [EVENTS]

Writes a GPU trace of EVENTS kernels (default 200,000, under the 500,000-event limit; each a Kineto kernel event
with its args, about 260 bytes) on 4 streams, a quarter of them NCCL kernels, with one ProfilerStep annotation,
then reads it (traces/kineto.py) and splits its step (traces/timeline.py). Prints the file's size, the wall and
process time of each part, and the peak of Python's allocations (tracemalloc) over the file's size.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from meshplan.traces.kineto import read_trace
from meshplan.traces.timeline import step_terms


def write(path: Path, events: int) -> None:
    kinds = ("sm90_xmma_gemm_bf16bf16_bf16f32", "flash_fwd_kernel", "ncclDevKernel_AllGather_RING_LL", "elementwise")
    with path.open("w") as f:
        f.write('{"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 8}, "traceEvents": [\n')
        f.write(json.dumps({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
                            "ts": 0, "dur": events * 3.0}))  # fmt: skip
        for i in range(events):
            stream = 7 + i % 4
            event = {"ph": "X", "cat": "kernel", "name": kinds[i % 4], "pid": 0, "tid": stream, "ts": 1.0 + i * 2.5,
                     "dur": 4.0, "args": {"stream": stream, "device": 0, "correlation": i, "grid": [132, 1, 1],
                                          "block": [384, 1, 1], "registers per thread": 168}}  # fmt: skip
            f.write(",\n" + json.dumps(event))
        f.write("\n]}\n")


def main() -> None:
    events = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "trace.json")
        write(path, events)
        size = path.stat().st_size
        wall, cpu = time.perf_counter(), time.process_time()
        trace = read_trace(path)
        read_wall, read_cpu = time.perf_counter() - wall, time.process_time() - cpu
        wall, cpu = time.perf_counter(), time.process_time()
        terms = step_terms(trace)
        split_wall, split_cpu = time.perf_counter() - wall, time.process_time() - cpu
        del trace
        tracemalloc.start()  # a second pass for the memory (tracing allocations slows the first's times)
        step_terms(read_trace(path))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    print(f"events: {events + 1:,}; file {size / 1e6:.1f} MB")
    print(f"read: {read_wall:.2f} s wall, {read_cpu:.2f} s process; split: {split_wall:.2f} s, {split_cpu:.2f} s")
    print(f"peak Python allocations: {peak / 1e6:.0f} MB ({peak / size:.1f}x the file)")
    print(f"step {terms.step_s * 1e3:.1f} ms; exposed all-gather {terms.seconds['exposed_all_gather'] * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
