"""Exports that are the plan: a serve-plan answer exported through the API equals `meshplan export --from-plan` of
the same answer saved; a training layout over HBM is refused unless forced; GPUs carry the names people use."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from meshplan.cli import main

pytest.importorskip("fastapi", reason="the web explorer needs the [web] extra: pip install 'meshplan[web]'")

SERVE = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 4, "input_len": 1024, "output_len": 128, "top": 3}


def cli_json(argv: list[str]) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) in (0, None)
    body: dict[str, Any] = json.loads(out.getvalue())
    return body


@pytest.fixture(scope="module")
def answer(client: Any) -> dict[str, Any]:
    r = client.get("/api/serve-plan", params=SERVE | {"tpot_p99": 0.02})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    assert body["best"] and body["best"]["replicas"] > 1  # a plan with replicas: the case the GET export dropped
    return body


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_serve_plan_answer_exports_as_the_cli_exports_it(
    client: Any, answer: Any, tmp_path: Path, engine: str
) -> None:
    r = client.post(
        f"/api/export-plan?to={engine}", content=json.dumps(answer), headers={"content-type": "application/json"}
    )
    assert r.status_code == 200, r.text
    api = r.json()
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(answer))
    cli = cli_json(["export", engine, "--from-plan", str(saved), "--json"])
    assert api == {"engine": engine} | cli or api == cli
    best = answer["best"]
    words = api["command"].split()
    if engine == "vllm":
        assert words[words.index("--data-parallel-size") + 1] == str(best["replicas"])
        assert words[words.index("--tensor-parallel-size") + 1] == str(best["layout"]["tp"])
        assert words[words.index("--max-num-seqs") + 1] == str(best["batch_cap_per_replica"])
    else:
        assert words[words.index("--dp-size") + 1] == str(best["replicas"])
        assert words[words.index("--max-running-requests") + 1] == str(best["batch_cap_per_replica"])


def test_the_posted_plan_is_checked_like_a_plan_file(client: Any, answer: Any) -> None:
    forged = json.loads(json.dumps(answer))
    for plan in (forged["best"], forged["top"][0]):  # a cap the plan's own request does not give
        plan["batch_cap_per_replica"] += 50
    r = client.post(
        "/api/export-plan?to=vllm", content=json.dumps(forged), headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and "batch_cap_per_replica" in r.json()["error"]
    r = client.post("/api/export-plan?to=vllm", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]
    r = client.post(
        "/api/export-plan?to=megatron", content=json.dumps(answer), headers={"content-type": "application/json"}
    )
    assert r.status_code == 422


def test_a_training_export_over_hbm_is_refused_unless_forced(client: Any) -> None:
    query = {"to": "megatron", "model": "llama-3.1-70b", "gpu": "h100-sxm", "gpus": 8, "tp": 1}
    r = client.get("/api/export", params=query)
    assert r.status_code == 400
    error = r.json()["error"]
    r = client.get("/api/export", params=query | {"force": "true"})
    assert r.status_code == 200
    forced = r.json()
    need, hbm = forced["predicted"]["memory_bytes_per_gpu"], 85520809984
    assert need > hbm and f"by {(need - hbm) / 1e9:,.1f} GB" in error and "force=true" in error
    assert forced["notes"][0].startswith(f"warning: this layout needs {need / 1e9:,.1f} GB per GPU")
    # a layout that fits is exported without a warning, forced or not
    fits = {"to": "megatron", "model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 8, "tp": 8}
    assert not any(n.startswith("warning: this layout") for n in client.get("/api/export", params=fits).json()["notes"])


def test_gpus_have_the_names_people_use(client: Any) -> None:
    gpus = {g["name"]: g for g in client.get("/api/catalog").json()["gpus"]}
    assert gpus["h100-sxm"]["display_name"] == "H100 SXM 80 GB"
    assert gpus["h200"]["display_name"] == "H200 141 GB"
    assert all(g["display_name"] and g["display_name"] != g["name"] for g in gpus.values())
    # nvidia-smi's 81,559 MiB for an H100 80 GB is the catalog's byte count
    assert round(gpus["h100-sxm"]["hbm_bytes_per_gpu"] / 2**20) == 81559


def test_the_run_conditions_reach_a_training_export(client: Any) -> None:
    query = {"to": "megatron", "model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 8, "tp": 2, "pp": 2}
    r = client.get("/api/export", params=query | {"first_stage_layers": 6})
    assert r.status_code == 200, r.text
    layout = ["--gpus", "8", "--tp", "2", "--pp", "2", "--first-stage-layers", "6"]
    cli = cli_json(["export", "megatron", "llama-3.1-8b", "--gpu", "h100-sxm", *layout, "--json"])
    assert r.json()["files"] == cli["files"]
    assert r.json()["files"] != client.get("/api/export", params=query).json()["files"]
