"""The HTTP API under load: concurrent clients on 127.0.0.1, bounded in count and time.

python benchmarks/load.py [--clients 50] [--requests 40] [--seconds 60]

Starts ``meshplan ui`` (the real server, as users run it) in a child process on a free loopback port, then
``--clients`` threads each send up to ``--requests`` keep-alive requests, cycling through the endpoints the
explorer's views call (memory, estimate, serving, fit, collectives, catalog), each with inputs that vary so
that answers are computed, not cached. The run stops after ``--seconds`` whatever is left. Prints the
throughput, latency percentiles and every non-200 status. Needs the web extra (pip install -e '.[web]').
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from urllib.parse import urlencode

MAX_CLIENTS = 200
MAX_REQUESTS = 1_000
MAX_SECONDS = 300.0


def request_for(i: int) -> str:
    """The i-th request of a client: the explorer's endpoints in turn, each input varied by i."""
    seq = 1024 + 64 * (i % 50)
    fleet = {"model": "llama-3.1-70b", "gpu": "h100-sxm", "gpus": 64}
    paths = [
        ("/api/memory", fleet | {"tp": 8, "pp": 2, "seq": seq}),
        ("/api/estimate", fleet | {"tp": 8, "pp": 2, "seq": seq}),
        ("/api/serving", {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 8, "context": seq}),
        ("/api/fit", {"model": "llama-3.1-70b", "gpu": "a100-80gb", "gpus": 1 + i % 16}),
        ("/api/collectives", {"size_mb": 1 + i % 100}),
        ("/api/catalog", {}),
    ]
    path, params = paths[i % len(paths)]
    return f"{path}?{urlencode(params)}" if params else path


def client(port: int, count: int, stop_at: float, latencies: list[float], statuses: Counter[int]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for i in range(count):
        if time.monotonic() > stop_at:
            break
        start = time.perf_counter()
        try:
            conn.request("GET", request_for(i))
            response = conn.getresponse()
            response.read()
            status = response.status
        except (OSError, http.client.HTTPException):
            status = 0  # connection refused, reset or timed out
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        latencies.append(time.perf_counter() - start)
        statuses[status] += 1
    conn.close()


def start_server() -> tuple[subprocess.Popen[str], int]:
    server = subprocess.Popen(
        [sys.executable, "-m", "meshplan.cli", "ui", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert server.stdout is not None
    line = server.stdout.readline()
    found = re.search(r":(\d+)/", line)
    if not found:
        server.kill()
        raise SystemExit(f"the server did not start: {line.strip()}")
    return server, int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=40, help="requests per client at most")
    parser.add_argument("--seconds", type=float, default=60.0, help="stop after this, whatever is left")
    args = parser.parse_args()
    clients = max(1, min(args.clients, MAX_CLIENTS))
    count = max(1, min(args.requests, MAX_REQUESTS))
    seconds = max(1.0, min(args.seconds, MAX_SECONDS))

    server, port = start_server()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", "/api/catalog")  # warm-up: imports and caches, outside the figures
        conn.getresponse().read()
        conn.close()
        latencies: list[float] = []
        statuses: Counter[int] = Counter()
        start = time.perf_counter()
        stop_at = time.monotonic() + seconds
        threads = [
            threading.Thread(target=client, args=(port, count, stop_at, latencies, statuses)) for _ in range(clients)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
    finally:
        server.terminate()
        server.wait(timeout=30)

    ms = sorted(x * 1000 for x in latencies)
    q = statistics.quantiles(ms, n=100) if len(ms) >= 2 else ms * 99
    print(f"clients: {clients}, requests per client: {count}, time limit: {seconds:.0f} s")
    print(f"requests: {len(ms):,} in {wall:.2f} s: {len(ms) / wall:,.0f} requests/s")
    print(f"latency ms: p50 {q[49]:.1f}, p95 {q[94]:.1f}, p99 {q[98]:.1f}, max {ms[-1]:.1f}")
    print(f"statuses: {json.dumps(dict(sorted(statuses.items())))}")
    errors = sum(n for s, n in statuses.items() if s != 200)
    print(f"errors: {errors}")


if __name__ == "__main__":
    main()
