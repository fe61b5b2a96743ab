"""Other sites and hostile clients: DNS rebinding, cross-site uploads, the search gate, slow bodies, long echoes."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the web explorer needs the [web] extra: pip install 'meshplan[web]'")

from meshplan import io
from meshplan.cli import main
from meshplan.server import app as app_module
from meshplan.server import parse
from meshplan.server.guard import Binding

OWN = "http://127.0.0.1:8000"  # the client fixture's base URL (conftest.LOCAL)
CONFIG = {
    "model_type": "llama",
    "hidden_size": 512,
    "intermediate_size": 2048,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "vocab_size": 32000,
}
SERVE_PLAN = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 8, "input_len": 1000, "output_len": 200}


def assert_json_error(r: Any, status: int) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    message = r.json()["error"]
    assert isinstance(message, str) and message
    return message


# --- Host: DNS rebinding ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["evil.example:8000", "evil.example", "127.0.0.1.evil.example:8000", ""])
def test_a_rebinding_host_is_refused(client: Any, host: str) -> None:
    for path in ("/api/catalog", "/"):
        message = assert_json_error(client.get(path, headers={"host": host}), 421)
        assert "Host" in message


@pytest.mark.parametrize("host", ["localhost:8000", "127.0.0.1:8000", "[::1]:8000", "LOCALHOST:8000"])
def test_loopback_names_are_served(client: Any, host: str) -> None:
    assert client.get("/api/tiers", headers={"host": host}).status_code == 200


def test_the_host_must_name_the_bound_port_and_address() -> None:
    bound = Binding("127.0.0.1", 8765)
    assert bound.accepts("127.0.0.1:8765") and bound.accepts("localhost:8765") and bound.accepts("[::1]:8765")
    assert not bound.accepts("127.0.0.1:8766") and not bound.accepts("localhost") and not bound.accepts("x:y")
    assert not bound.accepts("192.168.1.5:8765")  # not allowed remote: loopback names only
    remote = Binding("192.168.1.5", 80, allow_remote=True)
    assert remote.accepts("192.168.1.5") and remote.accepts("192.168.1.5:80") and remote.accepts("localhost")
    assert not remote.accepts("evil.example") and not remote.accepts("192.168.1.6")
    anywhere = Binding("0.0.0.0", 9000, allow_remote=True)
    assert anywhere.accepts("10.1.2.3:9000") and anywhere.accepts("[fe80::1]:9000")
    assert not anywhere.accepts("evil.example:9000") and not anywhere.accepts("10.1.2.3:9001")


# --- Origin and Content-Type: cross-site requests -----------------------------------------------------------------


@pytest.fixture
def uploads(client: Any, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Bodies that reached the model store's parser."""
    store = client.app.state.models
    seen: list[bytes] = []
    add = store.add

    def spy(body: bytes, **kwargs: Any) -> Any:
        seen.append(body)
        return add(body, **kwargs)

    monkeypatch.setattr(store, "add", spy)
    return seen


def test_a_cross_site_text_plain_upload_is_refused(client: Any, uploads: list[bytes]) -> None:
    body = json.dumps(CONFIG).encode()
    cross = {"content-type": "text/plain", "origin": "http://evil.example"}
    assert "another site" in assert_json_error(client.post("/api/model", content=body, headers=cross), 403)
    plain = {"content-type": "text/plain"}  # no Origin: a body must say it is JSON
    assert "application/json" in assert_json_error(client.post("/api/model", content=body, headers=plain), 415)
    form = {"content-type": "application/x-www-form-urlencoded", "origin": "null"}  # a form in a sandboxed frame
    assert_json_error(client.post("/api/model", content=body, headers=form), 403)
    json_cross = {"content-type": "application/json", "origin": "http://evil.example"}
    assert_json_error(client.post("/api/model", content=body, headers=json_cross), 403)
    assert uploads == []  # nothing was parsed


def test_a_same_origin_upload_still_works(client: Any, uploads: list[bytes]) -> None:
    body = json.dumps(CONFIG).encode()
    r = client.post("/api/model", content=body, headers={"content-type": "application/json", "origin": OWN})
    assert r.status_code == 200, r.text
    assert r.json()["spec"]["num_layers"] == 3
    r = client.post("/api/model", content=body, headers={"content-type": "application/json"})  # a script: no Origin
    assert r.status_code == 200, r.text
    assert len(uploads) == 2


def test_a_cross_site_read_is_refused(client: Any) -> None:
    assert_json_error(client.get("/api/catalog", headers={"origin": "http://evil.example"}), 403)
    assert client.get("/api/tiers", headers={"origin": OWN}).status_code == 200


# --- the search gate ----------------------------------------------------------------------------------------------


@contextmanager
def gate_full(client: Any) -> Iterator[None]:
    """The app's search gate with a search running and no room to wait."""
    gate = client.app.state.searches
    started, release = threading.Event(), threading.Event()

    def slow() -> dict[str, Any]:
        started.set()
        release.wait(10)
        return {}

    worker = threading.Thread(target=gate.run, args=(("test", time.monotonic()), slow))
    gate.max_waiting = 0
    worker.start()
    assert started.wait(10)
    try:
        yield
    finally:
        release.set()
        worker.join(10)
        gate.max_waiting = type(gate)().max_waiting


def test_serve_plan_goes_through_the_search_gate(client: Any) -> None:
    with gate_full(client):
        r = client.get("/api/serve-plan", params=SERVE_PLAN | {"tpot_p99": 0.05})
        assert "queue is full" in assert_json_error(r, 503)
        assert r.headers["retry-after"]
        plan = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 8, "seq": 4096, "global_batch_tokens": 1 << 19}
        assert_json_error(client.get("/api/plan", params=plan), 503)
        assert_json_error(client.get("/api/recipe/llama3-405b-8k", params={"rank": True}), 503)
        assert client.get("/api/tiers").status_code == 200  # cheap endpoints are not gated
    assert client.get("/api/serve-plan", params=SERVE_PLAN | {"tpot_p99": 0.05}).status_code == 200


def test_serve_plan_stops_at_the_search_time_limit(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parse, "SEARCH_TIME_LIMIT_S", -1.0)
    r = client.get("/api/serve-plan", params=SERVE_PLAN | {"tpot_p99": 0.07})
    assert "time limit" in assert_json_error(r, 503)


def test_a_search_runs_in_the_search_process(client: Any) -> None:
    from meshplan.server.worker import SEARCHES

    plan = {"model": "llama-3.2-1b", "gpu": "h100-sxm", "gpus": 8, "seq": 2048, "global_batch_tokens": 3 << 19}
    assert client.get("/api/plan", params=plan).status_code == 200
    assert SEARCHES.pid is not None and SEARCHES.pid != os.getpid()


def test_a_search_stuck_past_its_limit_is_killed() -> None:
    """A search that never reaches a deadline check (here: a sleep) is killed GRACE_S after its limit."""
    import functools

    from meshplan.search.limits import SearchTimeout
    from meshplan.server.worker import SearchProcess

    searches = SearchProcess(grace_s=0.2)
    try:
        assert searches.run(functools.partial(sum, [1, 2]), seconds=30, cancel=threading.Event()) == 3
        first = searches.pid
        start = time.monotonic()
        with pytest.raises(SearchTimeout, match="time limit"):
            searches.run(functools.partial(time.sleep, 30), seconds=0.1, cancel=threading.Event())
        assert time.monotonic() - start < 25 and searches.pid is None  # killed, not waited the 30 s out
        with pytest.raises(ValueError, match="math domain"):  # a refusal in the child is raised here
            import math

            searches.run(functools.partial(math.sqrt, -1), seconds=30, cancel=threading.Event())
        assert searches.pid not in (None, first)  # a new child
        with pytest.raises(SearchTimeout, match="exit code 3"):  # a child that dies (say, out of memory): a 503
            searches.run(functools.partial(os._exit, 3), seconds=30, cancel=threading.Event())
    finally:
        searches.close()


# --- the protocol: uvicorn's own refusals, slow bodies ------------------------------------------------------------


@contextmanager
def running(config: Any) -> Iterator[int]:
    """A uvicorn server with ``config`` on a free loopback port, in a thread; its port."""
    import uvicorn

    sock = app_module.free_socket("127.0.0.1", 0)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def exchange(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``raw``, read the whole answer: (status, headers, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(raw)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def test_past_the_connection_limit_the_503_is_json() -> None:
    import uvicorn

    from meshplan.server.protocol import TimedH11Protocol

    config = uvicorn.Config(
        app_module.create_app(), http=TimedH11Protocol, lifespan="off", log_level="error", limit_concurrency=1
    )
    with running(config) as port:
        status, headers, body = exchange(port, b"GET /api/tiers HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert status == 503 and headers["content-type"] == "application/json"
    assert "limit" in json.loads(body)["error"]


def test_a_malformed_request_gets_a_json_400(live_server: str) -> None:
    port = int(live_server.rsplit(":", 1)[1])
    status, headers, body = exchange(port, b"GET /api/tiers HTTP/1.1\r\nHost 127.0.0.1\r\n\r\n")
    assert status == 400 and headers["content-type"] == "application/json" and json.loads(body)["error"]


def test_a_trickled_body_is_dropped() -> None:
    config = app_module.server_config(app_module.create_app(), header_timeout_s=0.3, body_timeout_s=0.3)
    with running(config) as port:
        head = b"POST /api/model HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        conn = socket.create_connection(("127.0.0.1", port))
        conn.sendall(head + b"Content-Length: 1000\r\n\r\n{")  # 999 bytes of body never come
        conn.settimeout(30)  # a body timeout that never fired would end in socket.timeout here
        try:
            answer = conn.recv(4096)  # the server closes it: b"", or a reset
        except ConnectionResetError:
            answer = b""
        finally:
            conn.close()
        assert answer == b"" or b"HTTP/1.1 4" in answer  # closed by the body timeout


# --- meshplan ui: the address it listens on ----------------------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "", "::", "192.168.1.5"])
def test_ui_refuses_a_non_loopback_address_without_allow_remote(
    host: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the server must not bind")

    monkeypatch.setattr(app_module, "free_socket", never)
    assert main(["ui", "--host", host]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--allow-remote" in err


def test_ui_allow_remote_goes_on_to_bind(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    bound: list[str] = []

    def refuse(host: str, port: int | None) -> None:
        bound.append(host)
        raise ValueError("stop here")

    monkeypatch.setattr(app_module, "free_socket", refuse)
    assert main(["ui", "--host", "0.0.0.0", "--allow-remote"]) == 2
    assert bound == ["0.0.0.0"] and "stop here" in capsys.readouterr().err


# --- echoes of long input -----------------------------------------------------------------------------------------


def test_a_100_kb_model_name_gets_a_short_error(client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    name = "q" * 100_000
    assert main(["memory", name, "--gpu", "h100-sxm", "--gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 300 and "q" * 80 + "..." in err
    assert main(["params", "llama-3.1-8b", "--" + name]) == 2  # argparse's own refusal
    assert len(capsys.readouterr().err) < 300
    body = json.dumps(CONFIG | {"model_type": name}).encode()
    r = client.post("/api/model", content=body, headers={"content-type": "application/json"})
    message = assert_json_error(r, 400)
    assert "model_type" in message and "q" * 81 not in message and len(message) < 500


def test_bounded_message() -> None:
    assert io.bounded_message("unknown model 'llama' (closest: a, b)") == "unknown model 'llama' (closest: a, b)"
    cut = io.bounded_message(f"unknown model {'x' * 5000!r} (closest: a)")
    assert cut == f"unknown model '{'x' * io.MAX_ECHO_CHARS}...' (closest: a)"
    spaced = io.bounded_message("got " + "ab " * 10_000)
    assert len(spaced) == io.MAX_ERROR_CHARS and spaced.endswith("...")
