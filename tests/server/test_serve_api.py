"""GET /api/serve and /api/serve-plan: the same JSON as the CLI, and one-line refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest

from meshplan.reports.serve import serve_report

pytest.importorskip("fastapi", reason="the web explorer needs the [web] extra: pip install 'meshplan[web]'")

SERVE = {"model": "llama-3.1-70b", "gpu": "h100-sxm", "gpus": 8, "input_len": 1000, "output_len": 200}


def test_serve_equals_the_report(client: Any) -> None:
    r = client.get("/api/serve", params=SERVE | {"tp": 2, "weights_dtype": "fp8", "rate": 5})
    assert r.status_code == 200, r.text
    want = serve_report(
        "llama-3.1-70b", gpu="h100-sxm", gpus=8, input_len=1000, output_len=200, tp=2, weights_dtype="fp8", rate=5
    )
    assert json.loads(json.dumps(want)) == r.json()


def test_a_static_batch_and_the_engines_kv_default_through_the_api(client: Any) -> None:
    """``batch`` is one load among concurrency, rate and num_requests; the KV dtype left out is the engine's (FP8
    with FP8 weights in TensorRT-LLM), as on the command line."""
    r = client.get("/api/serve", params=SERVE | {"tp": 2, "weights_dtype": "fp8", "batch": 16})
    assert r.status_code == 200, r.text
    want = serve_report("llama-3.1-70b", gpu="h100-sxm", gpus=8, input_len=1000, output_len=200, tp=2,
                        weights_dtype="fp8", batch=16)  # fmt: skip
    assert json.loads(json.dumps(want)) == r.json() and r.json()["kv_dtype"] == "fp8"
    assert r.json()["static_batch"]["batch_per_replica"] == 4
    both = client.get("/api/serve", params=SERVE | {"batch": 16, "concurrency": 4})
    assert both.status_code == 400 and "--batch is a load of its own" in both.json()["error"]


def test_the_published_weights_are_the_default_through_the_api(client: Any) -> None:
    """Weights left out are in the dtype the model is published in, as on the command line: DeepSeek-V3's FP8."""
    params = {"model": "deepseek-v3", "gpu": "h200", "gpus": 8, "input_len": 128, "output_len": 256, "batch": 1}
    r = client.get("/api/serve", params=params | {"engine": "sglang"})
    assert r.status_code == 200, r.text
    assert r.json()["weights_dtype"] == "fp8"
    assert {"setting": "weights_dtype", "value": "fp8"}.items() <= next(
        d for d in r.json()["defaults_applied"] if d["setting"] == "weights_dtype"
    ).items()


def test_serve_disaggregated(client: Any) -> None:
    params = SERVE | {"gpus": 16, "tp": 4, "rate": 2, "disaggregate": "8:8"}
    r = client.get("/api/serve", params=params)
    assert r.status_code == 200, r.text
    assert r.json()["disaggregated"]["decode_gpus"] == 8
    assert client.get("/api/serve", params=params | {"disaggregate": "8:9"}).status_code == 400


def test_serve_plan_answers(client: Any) -> None:
    params = SERVE | {"model": "llama-2-70b", "input_len": 1024, "output_len": 256, "ttft_p99": 2, "tpot_p99": 0.2}
    r = client.get("/api/serve-plan", params=params)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["best"]["layout"]["tp"] * body["best"]["replicas"] == 8 and body["pareto"]
    assert {p["layout"]["weights_dtype"] for p in body["top"]} == {"bf16"}  # the model's quality unless allowed
    refused = client.get("/api/serve-plan", params=params | {"weights_dtypes": "bf16,int4"})
    assert refused.status_code == 400 and "--allow-quantization" in refused.json()["error"]
    only = client.get("/api/serve-plan", params=params | {"weights_dtypes": "bf16,int4", "allow_quantization": True})
    assert {p["layout"]["weights_dtype"] for p in only.json()["top"]} <= {"bf16", "int4"}


@pytest.mark.parametrize(
    ("extra", "status", "words"),
    [
        ({"tp": 3, "rate": 1}, 400, "divide"),
        ({"rate": 1, "concurrency": 2}, 400, "exactly one"),
        ({"rate": 1, "weights_dtype": "fp5"}, 422, "weights_dtype"),
        ({"rate": 0}, 422, "rate"),
    ],
)
def test_serve_refuses_bad_input(client: Any, extra: dict[str, Any], status: int, words: str) -> None:
    r = client.get("/api/serve", params=SERVE | extra)
    assert r.status_code == status and words in r.text


def test_speculative_and_prefix_through_the_api(client: Any) -> None:
    """The new serve fields through the API equal the report; a draft model is a catalog name there (no file)."""
    extra = {"speculative": "draft:3", "spec_acceptance": 0.6, "draft_model": "llama-3.2-1b", "prefix_hit_rate": 0.5}
    params = SERVE | {"model": "llama-3.1-8b", "gpus": 1, "rate": 2} | extra
    r = client.get("/api/serve", params=params)
    assert r.status_code == 200, r.text
    want = serve_report("llama-3.1-8b", gpu="h100-sxm", gpus=1, input_len=1000, output_len=200, rate=2, **extra)
    assert json.loads(json.dumps(want)) == r.json() and r.json()["speculative"]["draft_model"] == "llama-3.2-1b"
    path = client.get("/api/serve", params=params | {"draft_model": "/etc/passwd"})
    assert path.status_code == 400 and "\n" not in path.json()["error"]
    bare = client.get(
        "/api/serve", params={k: v for k, v in params.items() if k not in extra} | {"speculative": "eagle:2"}
    )
    assert bare.status_code == 400 and "--spec-acceptance" in bare.json()["error"]


def test_the_capacity_scheduler_through_the_api(client: Any) -> None:
    params = SERVE | {"tp": 2, "weights_dtype": "fp8", "rate": 5, "capacity_scheduler": "max-utilization"}
    r = client.get("/api/serve", params=params)
    assert r.status_code == 200, r.text
    want = serve_report("llama-3.1-70b", gpu="h100-sxm", gpus=8, input_len=1000, output_len=200, tp=2,
                        weights_dtype="fp8", rate=5, capacity_scheduler="max-utilization")  # fmt: skip
    assert json.loads(json.dumps(want)) == r.json()
    bad = client.get("/api/serve", params=params | {"capacity_scheduler": "fcfs"})
    assert bad.status_code in (400, 422) and "capacity" in bad.text
    other = client.get("/api/serve", params=params | {"engine": "sglang"})
    assert other.status_code == 400 and "TensorRT-LLM's scheduler policy" in other.json()["error"]
    plan = client.get("/api/serve-plan", params=SERVE | {"engine": "trtllm", "capacity_scheduler": "max-utilization"})
    assert plan.status_code == 200, plan.text
    assert plan.json()["capacity_scheduler"] == "max-utilization"


def test_every_serve_flag_is_an_api_parameter() -> None:
    """What `meshplan serve` passes to serve_report the API passes too (its load dict, or a parameter of its own)."""
    import inspect

    from meshplan.cli.commands import SERVE_KEYS
    from meshplan.server.api import SERVE, serve

    api = set(SERVE) | set(inspect.signature(serve).parameters)
    cli = set(SERVE_KEYS) | {"input_len", "output_len", "concurrency", "rate", "gpu_memory_utilization"}
    assert cli <= api, cli - api
