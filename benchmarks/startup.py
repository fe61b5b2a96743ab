"""CLI start-up: wall time of `meshplan params llama-3.1-8b` in a fresh process (target: under 0.5 s).

python benchmarks/startup.py [--repeat 10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    cmd = [sys.executable, "-m", "meshplan.cli", "params", "llama-3.1-8b"]
    subprocess.run(cmd, check=True, capture_output=True)  # warm the file cache
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    print("wall: " + ", ".join(f"{t * 1000:.0f} ms" for t in times))
    print(f"median {statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms")
    imported = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, meshplan.cli as c; c.main(['params', 'llama-3.1-8b', '--json']); "
            "print('numpy imported:', 'numpy' in sys.modules, file=sys.stderr)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    print(imported.stderr.strip())


if __name__ == "__main__":
    main()
