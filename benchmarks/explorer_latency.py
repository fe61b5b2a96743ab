"""Explorer responsiveness: how long an input change takes to reach the page (target: under 100 ms, planner aside).

python benchmarks/explorer_latency.py [--repeat 20]

Starts the real server (uvicorn) on a loopback port in this process, then
1. times every endpoint a view calls on an input change, each request with a different input so that no
   answer comes from a cache (median and max over --repeat requests);
2. with Playwright and Debian's chromium, times the memory view from typing a new sequence length to the
   new total on the page and the last redraw done (the take-away bar's command names the new length; Python's
   clock around the fill and the wait, so Playwright's own round trips count),
   for one unsplit GPU and for a 64-GPU layout with four pipeline stages (three bars and the serving bar).
Needs the web extra (pip install -e '.[web,test]').
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

try:
    import httpx
except ImportError:  # the test extra installs httpx2, the same client under another name
    import httpx2 as httpx  # type: ignore[no-redef]

from meshplan.server.app import create_app, free_socket

CHROMIUM = "/usr/bin/chromium"

# one request per input change of each view; i varies an input so every answer is computed afresh
REQUESTS: dict[str, Callable[[int], tuple[str, dict[str, Any]]]] = {
    "memory view: /api/memory": lambda i: (
        "/api/memory",
        {"model": "llama-3.1-70b", "gpu": "h100-sxm", "gpus": 1, "seq": 1024 + 64 * i, "global_batch": 1},
    ),
    "memory view: /api/serving": lambda i: (
        "/api/serving",
        {"model": "llama-3.1-70b", "gpu": "h100-sxm", "gpus": 1, "context": 1024 + 64 * i, "sequences": 1},
    ),
    "strategies: /api/strategies": lambda i: (
        "/api/strategies",
        {"model": "llama-3.1-8b", "gpu": "h100-sxm", "seq": 1024 + 64 * i},
    ),
    "weights split: /api/fit": lambda i: ("/api/fit", {"model": "llama-3.3-70b", "gpu": "h200", "gpus": 1 + i}),
    "TP and links: /api/tp-split": lambda i: ("/api/tp-split", {"seed": i}),
    "TP and links: /api/collectives": lambda i: ("/api/collectives", {"size_mb": 10 + i}),
    "estimate: /api/estimate": lambda i: (
        "/api/estimate",
        {"model": "llama-3.1-70b", "gpu": "h100-sxm", "gpus": 64, "tp": 8, "pp": 2, "seq": 4096 + 128 * i},
    ),
    "recipes: /api/recipe": lambda i: ("/api/recipe/llama3-405b-8k", {"rank": "false", "i": i}),
    "take-away: /api/export": lambda i: (
        "/api/export",
        {
            "to": "megatron",
            "model": "llama-3.1-70b",
            "gpu": "h100-sxm",
            "gpus": 64,
            "tp": 8,
            "pp": 4,
            "seq": 4096 + 8 * i,
        },
    ),
}
# The memory view's layout inputs for the second browser measurement: a pipeline of 4 stages, 3 bars drawn.
LAYOUT = {"gpus": "64", "tp": "8", "pp": "4"}


def serve() -> tuple[str, uvicorn.Server, threading.Thread]:
    sock = free_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(create_app(), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server, thread


def ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:6.1f} ms, max {max(values) * 1000:6.1f} ms"


def endpoints(base: str, repeat: int) -> None:
    with httpx.Client(base_url=base) as client:
        for name, make in REQUESTS.items():
            path, params = make(repeat)  # warm the code path once
            client.get(path, params=params).raise_for_status()
            times = []
            for i in range(repeat):
                path, params = make(i)
                start = time.perf_counter()
                client.get(path, params=params).raise_for_status()
                times.append(time.perf_counter() - start)
            print(f"{name:34s} {ms(times)}")


def memory_view(base: str, repeat: int, layout: dict[str, str] | None = None) -> None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("memory view in chromium: skipped (pip install playwright)")
        return
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        print(f"memory view in chromium: skipped (no chromium at {CHROMIUM})")
        return
    with sync_playwright() as p, httpx.Client(base_url=base) as client:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(f"{base}/#memory")
        page.wait_for_selector("body[data-ready]")
        page.wait_for_selector("#mem-training-total")
        for name, value in (layout or {}).items():
            page.fill(f"#mem-form input[name={name}]", value)
        page.wait_for_function("() => !document.querySelector('#mem-results')?.dataset.stale")
        times = []
        for i in range(repeat):
            seq = 2048 + 32 * (i + 1)
            want = client.get(
                "/api/memory",
                params={"model": "llama-3.1-70b", "gpu": "h100-sxm", "gpus": 1, "seq": seq, "micro_batch": 1,
                        "optimizer": "adamw", "recompute": "none", "finetune": "full", **(layout or {})},
            ).json()["per_gpu"]["total_bytes"]  # the page's query: precision unset, the stack's  # fmt: skip
            start = time.perf_counter()
            page.fill("#mem-form input[name=seq]", str(seq))
            # the whole page: the new total and the last redraw (the take-away bar's command, with the new --seq)
            page.wait_for_function(
                "([v, s]) => Number(document.querySelector('#mem-training-total').dataset.bytes) === v"
                " && document.querySelector('#mem-command').textContent.includes(`--seq ${s} `)",
                arg=[want, seq],
            )
            times.append(time.perf_counter() - start)
        browser.close()
    name = "memory view, 64 GPUs TP 8 PP 4" if layout else "memory view in chromium, input->page"
    print(f"{name:34s} {ms(times)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    base, server, thread = serve()
    try:
        endpoints(base, args.repeat)
        memory_view(base, args.repeat)
        memory_view(base, args.repeat, LAYOUT)
    finally:
        server.should_exit = True
        thread.join(timeout=5)


if __name__ == "__main__":
    main()
