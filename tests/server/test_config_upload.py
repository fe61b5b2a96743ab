"""POST /api/config: an engine's config uploaded gives the request values ``--from`` gives, whose ``query`` makes
the same estimate through GET /api/estimate as the CLI's; a bad upload is a 4xx with one JSON error line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meshplan.cli import main

DATA = Path(__file__).parents[1] / "data" / "configs"


def test_an_uploaded_config_gives_the_clis_estimate(client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    path = DATA / "nemo_llama3_70b_pretrain.yaml"
    r = client.post("/api/config", json={"text": path.read_text()})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["kind"] == "nemo" and answer["model"]["value"] == "llama-3.1-70b"
    assert {"field": "vpp", "value": 5, "from": "trainer.strategy.virtual_pipeline_model_parallel_size"} in answer[
        "values"
    ]
    assert any(row["key"] == "optim.config.lr" for row in answer["not_read"])
    api = client.get("/api/estimate", params=answer["query"] | {"gpu": "h100-sxm"})
    assert api.status_code == 200, api.text
    assert main(["estimate", "--from", str(path), "--gpu", "h100-sxm", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert api.json()["step_time_s"] == cli["step_time_s"]
    assert api.json()["per_gpu"] == cli["per_gpu"]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"text": "[rocket]\nfuel = 1\n"}, "is not a section of torchtitan's job config"),
        ({"text": '{"train_batch_size": 8,'}, "malformed JSON"),
        ({"text": "a: &x [1]\nb: *x\n", "kind": "nemo"}, "anchors and aliases"),
        ({"text": "x", "kind": "caffe"}, "is not one of"),
        ({"file": "x"}, "must be"),
    ],
)
def test_a_bad_upload_is_refused_with_one_line(client: Any, body: dict[str, Any], needle: str) -> None:
    r = client.post("/api/config", json=body)
    assert 400 <= r.status_code < 500, r.text
    error = r.json()["error"]
    assert needle in error and "\n" not in error
