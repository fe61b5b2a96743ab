"""The HTTP API under load: concurrent clients on 127.0.0.1, bounded in count and time; cheap requests beside
heavy searches.

python benchmarks/load.py [--clients 50] [--requests 40] [--seconds 60] [--searches 4] [--no-searches]

Each part starts ``meshplan ui`` (the real server, as users run it) in a child process on a free loopback port.

1. Searches (``--searches`` N of each kind, 0 or --no-searches to skip): N heavy /api/plan and N heavy
   /api/serve-plan requests at once (each with its own inputs, so none is answered from the cache), while one
   client sends a cheap GET (/api/memory) every 10 ms until they are done. Prints the cheap GET's latency
   percentiles (target: p99 under 100 ms), each search's status and time, and the server's resident memory
   before, at its peak and after.
2. Load: ``--clients`` threads each send up to ``--requests`` keep-alive requests, cycling through the endpoints
   the explorer's views call (memory, estimate, serving, fit, collectives, catalog), each with inputs that vary so
   that answers are computed, not cached. The run stops after ``--seconds`` whatever is left. Prints the
   throughput, latency percentiles, every non-200 status, and the server's resident memory before and after.

Needs the web extra (pip install -e '.[web]'); the resident memory is read from /proc (Linux).
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
from pathlib import Path
from urllib.parse import urlencode

MAX_CLIENTS = 200
MAX_REQUESTS = 1_000
MAX_SECONDS = 300.0
MAX_SEARCHES = 8
PROBE_EVERY_S = 0.01


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


def rss_mb(pid: int) -> float:
    """Resident memory in MB of the process and its children (the server and its search process); NaN where
    /proc is missing."""
    total = float("nan")
    for one in (pid, *_children(pid)):
        try:
            for line in Path(f"/proc/{one}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total = (0.0 if total != total else total) + int(line.split()[1]) / 1024
        except OSError:
            pass
    return total


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def warm_up(port: int) -> None:
    """Imports and caches, outside the figures: the catalog, one memory report, one small search of each kind."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    small = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 8}
    for path in (
        "/api/catalog",
        f"/api/memory?{urlencode(small)}",
        f"/api/plan?{urlencode(small | {'seq': 4096, 'global_batch_tokens': 1 << 20})}",
        f"/api/serve-plan?{urlencode(small | {'input_len': 1000, 'output_len': 200})}",
    ):
        conn.request("GET", path)
        conn.getresponse().read()
    conn.close()


def heavy_requests(n: int) -> list[tuple[str, str]]:
    """n plan and n serve-plan requests of a few seconds each (DeepSeek-V3 on 512 H100, on 256 H200 with the
    disaggregated splits), each with its own inputs."""
    out = []
    for i in range(n):
        plan = {"model": "deepseek-v3", "gpu": "h100-sxm", "gpus": 512, "seq": 4096}
        out.append(("plan", f"/api/plan?{urlencode(plan | {'global_batch_tokens': (4 + 2 * i) << 20})}"))
        serve = {"model": "deepseek-v3", "gpu": "h200", "gpus": 256, "output_len": 1000, "tpot_p99": 0.1}
        extra = {"input_len": 2000 + 500 * i, "search_disaggregated": "true"}
        out.append(("serve-plan", f"/api/serve-plan?{urlencode(serve | extra)}"))
    return out


def searches(n: int) -> None:
    """Part 1: a cheap GET's latency while n heavy searches of each kind wait for the one search slot."""
    server, port = start_server()
    try:
        warm_up(port)
        before = rss_mb(server.pid)
        results: list[tuple[str, int, float, str]] = []

        def heavy(kind: str, path: str) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            start = time.perf_counter()
            conn.request("GET", path)
            response = conn.getresponse()
            body = response.read()
            note = "" if response.status == 200 else json.loads(body).get("error", "")[:60]
            results.append((kind, response.status, time.perf_counter() - start, note))
            conn.close()

        threads = [threading.Thread(target=heavy, args=item) for item in heavy_requests(n)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        cheap: list[float] = []
        peak = before
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        i = 0
        while any(t.is_alive() for t in threads):
            query = urlencode({"model": "llama-3.1-70b", "gpu": "h100-sxm", "gpus": 8, "tp": 8, "seq": 1024 + i})
            sent = time.perf_counter()
            conn.request("GET", f"/api/memory?{query}")
            response = conn.getresponse()
            response.read()
            cheap.append(time.perf_counter() - sent)
            assert response.status == 200, response.status
            peak = max(peak, rss_mb(server.pid))
            i += 1
            time.sleep(PROBE_EVERY_S)
        conn.close()
        wall = time.perf_counter() - start
        time.sleep(1.0)
        after = rss_mb(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=30)

    print(f"searches: {n} plan + {n} serve-plan at once, one cheap GET (/api/memory) every 10 ms meanwhile")
    for kind, status, seconds, note in sorted(results, key=lambda r: r[2]):
        print(f"  {kind:<10} {status} in {seconds:6.2f} s {note}")
    print(f"searches done in {wall:.1f} s; statuses: {json.dumps(dict(Counter(str(r[1]) for r in results)))}")
    print(f"cheap GET: {len(cheap)} requests, latency ms: {percentiles(cheap)}")
    print(f"server RSS MB (with its search process): before {before:.0f}, peak {peak:.0f}, after {after:.0f}")


def percentiles(seconds: list[float]) -> str:
    ms = sorted(x * 1000 for x in seconds)
    q = statistics.quantiles(ms, n=100) if len(ms) >= 2 else ms * 99
    return f"p50 {q[49]:.1f}, p95 {q[94]:.1f}, p99 {q[98]:.1f}, max {ms[-1]:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=40, help="requests per client at most")
    parser.add_argument("--seconds", type=float, default=60.0, help="stop after this, whatever is left")
    parser.add_argument("--searches", type=int, default=4, help="heavy searches of each kind in part 1")
    parser.add_argument("--no-searches", action="store_true", help="skip part 1")
    args = parser.parse_args()
    clients = max(1, min(args.clients, MAX_CLIENTS))
    count = max(1, min(args.requests, MAX_REQUESTS))
    seconds = max(1.0, min(args.seconds, MAX_SECONDS))
    if args.searches > 0 and not args.no_searches:
        searches(min(args.searches, MAX_SEARCHES))
        print()

    server, port = start_server()
    try:
        warm_up(port)
        before = rss_mb(server.pid)
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
        after = rss_mb(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=30)

    print(f"clients: {clients}, requests per client: {count}, time limit: {seconds:.0f} s")
    print(f"requests: {len(latencies):,} in {wall:.2f} s: {len(latencies) / wall:,.0f} requests/s")
    print(f"latency ms: {percentiles(latencies)}")
    print(f"statuses: {json.dumps(dict(sorted(statuses.items())))}")
    errors = sum(n for s, n in statuses.items() if s != 200)
    print(f"errors: {errors}")
    print(f"server RSS MB (with its search process): before {before:.0f}, after {after:.0f}")


if __name__ == "__main__":
    main()
