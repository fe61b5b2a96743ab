"""The server under abuse: half-sent requests time out, 405 says what is allowed, hostile uploads are 400s."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

WEB_EXTRA = "the web explorer needs the [web] extra: pip install 'meshplan[web]'"
JSON = {"content-type": "application/json"}
HOSTILE_UPLOADS = {
    "2e8 layers": {
        "model_type": "qwen2_moe",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 200_000_000,
        "intermediate_size": 64,
        "vocab_size": 100,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
    },
    "hidden above 2^63": {"model_type": "llama", "hidden_size": 2**64 + 1},
    "sparse step 0": {
        "model_type": "qwen2_moe",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "vocab_size": 100,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "decoder_sparse_step": 0,
    },
}


@pytest.mark.parametrize("name", HOSTILE_UPLOADS)
def test_hostile_uploads_are_400_at_once(client: Any, name: str) -> None:
    r = client.post("/api/model", content=json.dumps(HOSTILE_UPLOADS[name]), headers=JSON)
    assert r.status_code == 400, r.text


@pytest.mark.parametrize(
    "body",
    [b"[" * 100_000 + b"]" * 100_000, b'{"a": ' * 30_000 + b"1" + b"}" * 30_000, b'{"x": 1e999999}'],
    ids=["nested arrays", "nested objects", "float past the range"],
)
def test_hostile_json_bodies(client: Any, body: bytes) -> None:
    r = client.post("/api/model", content=body, headers=JSON)
    assert r.status_code in (400, 413), r.text
    assert "error" in r.json()


def test_tiny_collective_is_422(client: Any) -> None:
    r = client.get("/api/collectives", params={"size_mb": "5e-324"})
    assert r.status_code == 422 and "size_mb" in r.json()["error"]


def test_405_says_what_is_allowed(client: Any) -> None:
    r = client.delete("/api/memory")
    assert r.status_code == 405 and r.headers["allow"] == "GET"


def test_fewest_gpus_is_bounded_by_the_api_cap(client: Any) -> None:
    r = client.get(
        "/api/plan",
        params={
            "model": "llama-3.2-1b",
            "gpu": "h100-sxm",
            "gpus": 131_072,
            "seq": 4096,
            "global_batch_tokens": 4096,
            "objective": "fewest-gpus",
            "tokens": 1e16,
            "days": 1e-3,
        },
    )
    assert r.status_code == 400 and "131,072" in r.json()["error"], r.text


def test_names_are_enums_in_the_schema(client: Any) -> None:
    params = {
        p["name"]: p["schema"] for p in client.get("/openapi.json").json()["paths"]["/api/memory"]["get"]["parameters"]
    }
    assert "h100-sxm" in params["gpu"]["enum"]
    assert "llama-3.1-8b" in params["model"]["anyOf"][0]["enum"]


@pytest.fixture
def impatient_server() -> Iterator[int]:
    """The server `meshplan ui` runs, with a header-read timeout of 0.5 s; its port."""
    uvicorn = pytest.importorskip("uvicorn", reason=WEB_EXTRA)
    from meshplan.server.app import create_app, free_socket, server_config

    sock = free_socket("127.0.0.1", 0)
    server = uvicorn.Server(server_config(create_app(), header_timeout_s=0.5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(timeout=10)


def _closed(conn: socket.socket) -> bool:
    conn.settimeout(0.05)
    try:
        return conn.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_half_sent_requests_are_dropped(impatient_server: int) -> None:
    stuck = []
    for _ in range(200):
        conn = socket.create_connection(("127.0.0.1", impatient_server))
        conn.sendall(b"GET /api/tiers HTTP/1.1\r\nHost: x\r\n")  # the head never ends
        stuck.append(conn)
    with socket.create_connection(("127.0.0.1", impatient_server)) as ok:
        ok.sendall(b"GET /api/tiers HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        ok.settimeout(10)
        assert ok.recv(12) == b"HTTP/1.1 200"  # served while the others hang
    time.sleep(1.5)  # between one and two timeouts
    assert all(_closed(conn) for conn in stuck)
    for conn in stuck:
        conn.close()


def test_a_key_error_is_a_500_not_a_400(monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyError in an endpoint is a bug: the answer is a 500 that says so, not a 400 blaming the input."""
    pytest.importorskip("fastapi", reason=WEB_EXTRA)
    from fastapi.testclient import TestClient

    from meshplan.server import api
    from meshplan.server.app import create_app

    def broken(*args: object, **kwargs: object) -> dict[str, object]:
        raise KeyError("seq")

    monkeypatch.setattr(api, "params_report", broken)
    app = TestClient(create_app(), base_url="http://127.0.0.1", raise_server_exceptions=False)
    r = app.get("/api/params", params={"model": "llama-3.2-1b"})
    assert r.status_code == 500 and "KeyError" in r.json()["error"]


def test_a_search_stops_when_its_client_leaves() -> None:
    """The planner's worker thread sees the cancel flag at its next chunk once the client has disconnected."""
    import asyncio

    from meshplan.search.limits import SearchTimeout, check_deadline, time_limit
    from meshplan.server.planner import run_while_connected

    class Gone:
        async def is_disconnected(self) -> bool:
            return True

    def endless(cancel: threading.Event) -> dict[str, Any]:
        with time_limit(60, cancel=cancel):
            while True:
                check_deadline()  # what search() does between chunks
                time.sleep(0.01)

    outcome: list[BaseException] = []

    def in_own_loop() -> None:  # the browser tests may keep an event loop running in the main thread
        try:
            asyncio.run(run_while_connected(Gone(), endless))  # type: ignore[arg-type]
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=in_own_loop)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive()  # the endless search stopped once its client left
    assert len(outcome) == 1 and isinstance(outcome[0], SearchTimeout) and "cancelled" in str(outcome[0])


def test_a_search_past_its_time_limit_stops() -> None:
    from meshplan import io
    from meshplan.reports.inputs import resolve_cluster
    from meshplan.search.limits import SearchTimeout, time_limit
    from meshplan.search.rank import search
    from meshplan.spec.workload import Workload

    cluster = resolve_cluster(gpu="h100-sxm", gpus=64)
    with time_limit(-1.0), pytest.raises(SearchTimeout, match="time limit"):
        search(io.load_model("llama-3.1-8b"), cluster, Workload(seq_len=4096, global_batch=256))
