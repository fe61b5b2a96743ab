"""The layout page: what `/api/estimate?timeline=true` costs and how long an input change takes to reach the page.

python benchmarks/layout_page.py [--repeat 15]

Starts the real server (uvicorn) on a loopback port in this process, then
1. for a few layouts from a 4-stage 1F1B to Llama 3 405B's 16 x 8 interleaved pipeline, times the estimate with and
   without the timeline (median over --repeat requests, each with its own global batch so that none is cached) and
   gives the timeline's stretches and JSON size;
2. with Playwright and Debian's chromium, times the layout page from typing a new global batch to the new step time
   on the page (Python's clock around the fill and the wait), for the page's default layout (4 stages, 16
   micro-batches) and for a 16-stage interleaved one.
Needs the web extra (pip install -e '.[web,test]').
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from typing import Any

from explorer_latency import CHROMIUM, httpx, serve

LAYOUTS: dict[str, dict[str, Any]] = {
    "8B, 64 GPUs, TP 2 PP 4, 16 micro-batches": {"model": "llama-3.1-8b", "gpus": 64, "tp": 2, "pp": 4},
    "Mixtral, 64 GPUs, TP 2 PP 4 x 2 EP 8": {"model": "mixtral-8x7b", "gpus": 64, "tp": 2, "pp": 4, "vpp": 2, "ep": 8,
                                               "schedule": "interleaved"},
    "405B, 16,384 GPUs, TP 8 PP 16 x 8": {"model": "llama-3.1-405b", "gpus": 16384, "tp": 8, "pp": 16, "vpp": 8,
                                          "schedule": "interleaved", "cp": 1},
}  # fmt: skip
BATCH = {"llama-3.1-8b": 128, "mixtral-8x7b": 64, "llama-3.1-405b": 2048}


def ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:7.1f} ms, max {max(values) * 1000:7.1f} ms"


def endpoint(base: str, repeat: int) -> None:
    with httpx.Client(base_url=base, timeout=60) as client:
        for name, layout in LAYOUTS.items():
            q = {"gpu": "h100-sxm", **layout}
            gb = BATCH[layout["model"]]
            dp = layout["gpus"] // (layout["tp"] * layout["pp"] * layout.get("cp", 1))
            for timeline in (False, True):
                times, body = [], {}
                for i in range(repeat + 1):
                    start = time.perf_counter()
                    r = client.get("/api/estimate", params=q | {"global_batch": gb + dp * i, "timeline": timeline})
                    r.raise_for_status()
                    if i:  # the first warms the code path
                        times.append(time.perf_counter() - start)
                    body = r.json()
                extra = ""
                if timeline:
                    tl = body["timeline"]
                    n = sum(len(s["intervals"]) + len(s["hidden"]) for s in tl["stages"])
                    extra = f"; {n:,} stretches, {len(json.dumps(tl)) / 1e6:.2f} MB"
                print(f"{name:44s} {'timeline' if timeline else 'estimate':8s} {ms(times)}{extra}")


def page_latency(base: str, repeat: int, query: str, name: str, gb: int, dp: int) -> None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("layout page in chromium: skipped (pip install playwright)")
        return
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        print(f"layout page in chromium: skipped (no chromium at {CHROMIUM})")
        return
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.goto(f"{base}/#layout?{query}")
        page.wait_for_selector("body[data-ready]")
        page.wait_for_selector("#ly-gantt svg")
        times = []
        for i in range(repeat):
            before = page.get_attribute("#ly-step", "data-seconds")
            start = time.perf_counter()
            page.fill("#ly-form input[name=global_batch]", str(gb + dp * (i + 1)))
            page.wait_for_function("b => document.querySelector('#ly-step').dataset.seconds !== b", arg=before)
            page.wait_for_function("() => !document.querySelector('#ly-results').dataset.stale")
            times.append(time.perf_counter() - start)
        browser.close()
    print(f"{name:53s} {ms(times)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    base, server, thread = serve()
    try:
        endpoint(base, args.repeat)
        page_latency(base, args.repeat, "", "layout page, input->page, TP 2 PP 4 (16 micro-batches)", 128, 8)
        query = "model=llama-3.1-70b&gpus=512&tp=8&pp=16&vpp=5&schedule=interleaved&global_batch=256"
        page_latency(base, args.repeat, query, "layout page, input->page, 70B PP 16 x 5 (64 micro-batches)", 256, 4)
    finally:
        server.should_exit = True
        thread.join(timeout=5)


if __name__ == "__main__":
    main()
