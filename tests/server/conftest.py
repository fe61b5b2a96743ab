"""Fixtures for the HTTP API and the explorer: an in-process client, a live server in a thread, a browser."""

from __future__ import annotations

import importlib.util
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

WEB_EXTRA = "the web explorer needs the [web] extra: pip install 'meshplan[web]'"

CHROMIUM = os.environ.get("MESHPLAN_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
LOCAL = "http://127.0.0.1:8000"
"""The in-process client's address: the server answers only for loopback names (guard.py)."""


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    pytest.importorskip("fastapi", reason=WEB_EXTRA)
    if importlib.util.find_spec("httpx2") is None and importlib.util.find_spec("httpx") is None:
        pytest.skip("the API tests need an HTTP client for TestClient: pip install httpx2")
    from fastapi.testclient import TestClient

    from meshplan.server.app import create_app

    with TestClient(create_app(), base_url=LOCAL) as c:
        yield c


@pytest.fixture(scope="session")
def live_server() -> Iterator[str]:
    """The real server (uvicorn) on a free loopback port, in a daemon thread; its base URL."""
    uvicorn = pytest.importorskip("uvicorn", reason=WEB_EXTRA)
    pytest.importorskip("fastapi", reason=WEB_EXTRA)

    from meshplan.server.app import create_app, free_socket, server_config

    sock = free_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(server_config(create_app()))  # the configuration `meshplan ui` runs
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("the explorer server did not start within 20 s")
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=5)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Debian's chromium driven by Playwright, or a skip that says what is missing."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="end-to-end tests need: pip install playwright")
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        pytest.skip(f"end-to-end tests need chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture()
def page(browser: Any, live_server: str) -> Iterator[Any]:
    """A fresh laptop-sized page; it fails the test on any script error in the page."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.set_default_timeout(10_000)
    pg.base = live_server
    yield pg
    context.close()
    assert not errors, f"script errors in the page: {errors}"


SCREENSHOTS = os.environ.get("MESHPLAN_SCREENSHOTS", "") not in ("", "0")
"""Full-page screenshots cost a PNG encode of the whole page each (a few seconds of the suite's CPU in all): they
are saved when MESHPLAN_SCREENSHOTS=1, to look at the views after a change; the checks run either way."""


def save_screenshot(pg: Any, name: str) -> None:
    """test-artifacts/NAME.png, a full-page screenshot, when MESHPLAN_SCREENSHOTS=1."""
    if SCREENSHOTS:
        ARTIFACTS.mkdir(exist_ok=True)
        pg.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


@pytest.fixture()
def shot() -> Any:
    """Save a full-page screenshot of a view as test-artifacts/explorer-NAME.png (when MESHPLAN_SCREENSHOTS=1)."""
    return lambda pg, name: save_screenshot(pg, f"explorer-{name}")
