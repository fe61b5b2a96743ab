"""Bad input to the HTTP API: always a 4xx with a one-line JSON error, never a 500 or a hang; uploads and limits."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the web explorer needs the [web] extra: pip install 'meshplan[web]'")

from meshplan.server import parse
from meshplan.server.app import free_socket
from meshplan.server.guard import is_loopback

MEM = {"model": "llama-3.1-70b", "gpu": "h100-sxm", "gpus": "8"}
PLAN = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": "8", "seq": "4096", "global_batch_tokens": "1048576"}
CONFIG = {
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 8192,
}


def error(client: Any, path: str, params: dict[str, Any], statuses: tuple[int, ...]) -> str:
    r = client.get(path, params=params)
    assert r.status_code in statuses, (path, params, r.status_code, r.text)
    body = r.json()
    assert list(body) == ["error"] and isinstance(body["error"], str) and body["error"], body
    return str(body["error"])


BAD = [
    ("/api/memory", MEM | {"gpus": "abc"}, (422,), "gpus"),
    ("/api/memory", MEM | {"gpus": "0"}, (422,), "gpus"),
    ("/api/memory", MEM | {"gpus": "10000001"}, (422,), "10000000"),
    ("/api/memory", MEM | {"seq": "2000000"}, (422,), "seq"),
    ("/api/memory", MEM | {"seq": "1.5"}, (422,), "seq"),
    ("/api/memory", MEM | {"tp": "3"}, (400,), "divide"),
    ("/api/memory", MEM | {"model": "llama-9"}, (400,), "unknown model"),
    ("/api/memory", MEM | {"model": "/etc/passwd"}, (400,), "unknown model"),
    ("/api/memory", MEM | {"model": "../catalog/models/llama-3.1-8b.toml"}, (400,), "unknown model"),
    ("/api/memory", MEM | {"gpu": "h999"}, (400,), "unknown gpu"),
    ("/api/memory", MEM | {"precision": "int3"}, (422,), "precision"),
    ("/api/memory", MEM | {"optimizer": "lion"}, (422,), "optimizer"),
    ("/api/memory", MEM | {"recompute": "some"}, (422,), "recompute"),
    ("/api/memory", MEM | {"zero": "4"}, (422,), "zero"),
    ("/api/memory", MEM | {"sp": "maybe"}, (422,), "sp"),
    ("/api/memory", MEM | {"model": "upload:0123456789ab"}, (400,), "upload it again"),
    ("/api/memory", {"gpu": "h100-sxm", "gpus": "8"}, (422,), "model"),
    ("/api/fit", MEM | {"dtype": "int2"}, (422,), "dtype"),
    ("/api/serving", MEM | {"gpu_memory_utilization": "2"}, (422,), "gpu_memory_utilization"),
    ("/api/serving", MEM | {"ep": "3"}, (400,), "ep"),
    ("/api/serving", MEM | {"sequences": "-1"}, (422,), "sequences"),
    ("/api/estimate", MEM | {"scale_out": "/etc/hosts"}, (400,), "unknown link"),
    ("/api/estimate", MEM | {"axis_order": "tp,zz"}, (400,), "zz"),
    ("/api/estimate", MEM | {"precision": "fp8", "fp8_recipe": "mxfp8"}, (400,), "scale blocks"),
    ("/api/estimate", MEM | {"precision": "deepseek-fp8", "fp8_recipe": "mxfp8"}, (400,), "needs precision fp8"),
    ("/api/estimate", MEM | {"precision": "fp8", "fp8_recipe": "mx9"}, (422,), "fp8_recipe"),
    ("/api/collectives", {"group": "1"}, (422,), "group"),
    ("/api/collectives", {"size_mb": "-5"}, (422,), "size_mb"),
    ("/api/collectives", {"model": "x" * 300}, (422,), "model"),
    ("/api/plan", PLAN | {"top": "51"}, (422,), "top"),
    ("/api/plan", PLAN | {"gpus": "10000001"}, (422,), "gpus"),
    ("/api/plan", PLAN | {"headroom": "1"}, (422,), "headroom"),
    ("/api/plan", PLAN | {"global_batch_tokens": "1000"}, (400,), "whole number"),
    ("/api/plan", PLAN | {"objective": "cheapest"}, (422,), "objective"),
    ("/api/plan", PLAN | {"compare": "tp=banana"}, (400,), "tp"),
    ("/api/plan", PLAN | {"objective": "fewest-gpus"}, (400,), "tokens"),
    ("/api/strategies", {"model": "llama-3.1-70b", "gpu": "h100-sxm", "seq": "x"}, (422,), "seq"),
    ("/api/tp-split", {"ranks": "3"}, (400,), "divide"),
    ("/api/tp-split", {"ranks": "32"}, (422,), "ranks"),
    ("/api/tp-split", {"activation": "relu"}, (400,), "activation"),
    ("/api/tp-split", {"hidden": "100000"}, (422,), "hidden"),
    ("/api/recipe/none-such", {}, (404,), "unknown recipe"),
    ("/api/nowhere", {}, (404,), "not found"),
]


@pytest.mark.parametrize(("path", "params", "statuses", "says"), BAD, ids=[f"{b[0]}:{b[3]}" for b in BAD])
def test_bad_input_is_a_clear_4xx(
    client: Any, path: str, params: dict[str, Any], statuses: tuple[int, ...], says: str
) -> None:
    assert says.lower() in error(client, path, params, statuses).lower()


def test_wrong_method_is_json(client: Any) -> None:
    r = client.post("/api/memory", params=MEM)
    assert r.status_code == 405 and "error" in r.json()


def test_long_query_is_refused(client: Any) -> None:
    r = client.get("/api/memory", params=MEM | {"compare": "x" * 5000})
    assert r.status_code == 414 and "limit" in r.json()["error"]


def test_busy_planner_answers_429(client: Any) -> None:
    gate = client.app.state.searches
    gate._lock.acquire()
    gate.wait_s = 0.05
    try:
        message = error(client, "/api/plan", PLAN | {"seq": "2048", "global_batch_tokens": "524288"}, (429,))
    finally:
        gate._lock.release()
        gate.wait_s = 30.0
    assert "running" in message


def test_a_second_search_waits_for_the_first() -> None:
    import threading

    from meshplan.server.planner import SearchGate

    gate = SearchGate(wait_s=5)
    calls: list[int] = []
    started, release = threading.Event(), threading.Event()

    def slow() -> dict[str, Any]:
        calls.append(1)
        started.set()
        release.wait(5)
        return {"answer": len(calls)}

    first = threading.Thread(target=gate.run, args=(("k",), slow))
    first.start()
    assert started.wait(5)
    second: list[dict[str, Any]] = []
    waiter = threading.Thread(target=lambda: second.append(gate.run(("k",), slow)))
    waiter.start()
    release.set()
    first.join(5)
    waiter.join(5)
    assert second == [{"answer": 1}] and calls == [1]  # answered from the first search, not searched again


# --- uploads ------------------------------------------------------------------------------------------------------


def upload(client: Any, body: bytes, **params: Any) -> Any:
    return client.post("/api/model", params=params, content=body, headers={"content-type": "application/json"})


def test_upload_gives_a_model_every_endpoint_accepts(client: Any) -> None:
    r = upload(client, json.dumps(CONFIG).encode(), name="my-model")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"].startswith("upload:") and body["name"] == "my-model"
    assert body["spec"]["num_layers"] == 8 and body["spec"]["hidden"] == 1024
    again = upload(client, json.dumps(CONFIG).encode(), name="my-model").json()
    assert again["id"] == body["id"]
    mem = client.get("/api/memory", params={"model": body["id"], "gpu": "h100-sxm", "gpus": 1}).json()
    assert mem["model"] == "my-model" and mem["per_gpu"]["total_bytes"] > 0
    for path in ("/api/fit", "/api/serving", "/api/estimate"):
        assert client.get(path, params={"model": body["id"], "gpu": "h100-sxm", "gpus": 2}).status_code == 200, path
    assert client.get("/api/strategies", params={"model": body["id"], "gpu": "h100-sxm"}).status_code == 200
    plan = {"model": body["id"], "gpu": "h100-sxm", "gpus": 8, "seq": 2048, "global_batch_tokens": 262144}
    assert client.get("/api/plan", params=plan).status_code == 200


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{not json", "malformed JSON"),
        (b"", "empty"),
        (b"[1, 2]", "JSON object"),
        (b'"text"', "JSON object"),
        (json.dumps(CONFIG | {"model_type": "bert"}).encode(), "unsupported model_type"),
        (json.dumps({k: v for k, v in CONFIG.items() if k != "hidden_size"}).encode(), "hidden_size"),
        (json.dumps(CONFIG | {"num_hidden_layers": "eight"}).encode(), "num_hidden_layers"),
        (json.dumps(CONFIG | {"num_attention_heads": 0}).encode(), "config"),
        (json.dumps(CONFIG | {"rope_scaling": [1, 2]}).encode(), ""),
        (json.dumps(CONFIG | {"sliding_window": "wide", "use_sliding_window": True}).encode(), ""),
        (b"\xff\xfe\x00garbage", "malformed"),
    ],
)
def test_malformed_uploads_are_400(client: Any, body: bytes, says: str) -> None:
    r = upload(client, body)
    if r.status_code == 200:  # a config the reader tolerates (an ignored key) is fine too
        assert says == ""
        return
    assert r.status_code == 400, r.text
    assert says.lower() in r.json()["error"].lower()


def test_oversized_upload_is_413(client: Any) -> None:
    big = json.dumps(CONFIG | {"padding": "x" * (parse.MAX_BODY_BYTES + 10)}).encode()
    r = upload(client, big)
    assert r.status_code == 413 and "limit" in r.json()["error"]

    def chunks() -> Any:  # no Content-Length: the limit holds while streaming
        for _ in range(40):
            yield b" " * 8192

    r = client.post("/api/model", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text


def test_upload_store_forgets_the_oldest(client: Any) -> None:
    from meshplan.server.uploads import ModelStore

    store = ModelStore(capacity=2)
    ids = [store.add(json.dumps(CONFIG | {"num_hidden_layers": n}).encode())[0] for n in (2, 3, 4)]
    with pytest.raises(ValueError, match="upload it again"):
        store.get(ids[0])
    assert store.get(ids[2]).num_layers == 4 and len(store) == 2


# --- pure parsing -------------------------------------------------------------------------------------------------


def test_parse_helpers() -> None:
    assert parse.catalog_model(" Llama-3.1-8B ") == "llama-3.1-8b"
    with pytest.raises(ValueError, match=r"closest: llama-3\.1-8b"):
        parse.catalog_model("llama-3.1-8")
    assert parse.link("") is None and parse.link("ib-ndr") == "ib-ndr"
    assert parse.flag("on") is True and parse.flag("0") is False
    with pytest.raises(ValueError):
        parse.flag("perhaps")
    assert parse.upload_name("../../etc/passwd") == "etc-passwd"
    assert parse.upload_name("") == "uploaded-model"
    assert parse.is_upload_id("upload:0123456789ab") and not parse.is_upload_id("upload:../x")
    message = parse.validation_message([{"loc": ("query", "gpus"), "msg": "Input should be valid", "input": "x"}])
    assert message == "gpus: input should be valid (got 'x')"


def test_free_socket_and_loopback() -> None:
    sock = free_socket("127.0.0.1", None)
    try:
        port = sock.getsockname()[1]
        assert port > 0
        with pytest.raises(ValueError, match="cannot listen"):
            free_socket("127.0.0.1", port).close()
    finally:
        sock.close()
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0")


def test_accepted_connections_send_without_delay() -> None:
    """Accepted connections get TCP_NODELAY: asyncio sets it only when the listening socket says IPPROTO_TCP,
    and without it a response written in two pieces waits out the client's 40 ms delayed ACK on every
    keep-alive request."""
    import asyncio
    import concurrent.futures
    import socket

    async def nodelay_of_accepted() -> int:
        listener = free_socket("127.0.0.1", None)
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
        _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
        try:
            return await asyncio.wait_for(accepted, 5)
        finally:
            writer.close()
            server.close()

    # a thread of its own: the browser tests' Playwright keeps an event loop running in this one
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert pool.submit(asyncio.run, nodelay_of_accepted()).result(timeout=10) != 0
