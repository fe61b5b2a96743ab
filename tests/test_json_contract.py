"""The JSON contract: every key any command prints is in docs/json.md, and the CLI's --json and the API's
answer to the same request are the same bytes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from meshplan.cli import main
from meshplan.reports.models import REPORTS

DOC = (Path(__file__).parent.parent / "docs" / "json.md").read_text(encoding="utf-8")
DOCUMENTED = set(re.findall(r"`([a-z_][a-z0-9_-]*)(?:\[\])?[`:]", DOC))

RUNS = {
    "params": ["params", "mixtral-8x7b", "--finetune", "lora"],
    "memory": ["memory", "llama-3.1-8b", "--gpu", "a100-80gb", "--gpus", "8", "--zero", "3", "--freeze", "layers=2"],
    "fit": ["fit", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "1", "--finetune", "lora"],
    "serving": ["serving", "llama-3.1-70b", "--gpu", "h100-sxm", "--gpus", "8"],
    "estimate": ["estimate", "llama-3.1-70b", "--gpu", "h100-sxm", "--gpus", "64", "--tp", "8", "--pp", "2",
                 "--tokens", "1e12", "--price-per-gpu-hour", "2", "--checkpoint-bandwidth", "1",
                 "--mtbf-gpu-hours", "45566", "--timeline"],
    "collectives": ["collectives"],
    "plan": ["plan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "16", "--seq", "4096", "--global-batch-tokens",
             "1048576", "--explain", "--compare", "tp=2", "--objective", "fewest-gpus", "--tokens", "1e11",
             "--days", "30", "--price-per-gpu-hour", "2", "--checkpoint-bandwidth", "1", "--mtbf-gpu-hours", "45566"],
    "list": ["list", "models"],
    "serve": ["serve", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--input-len", "1000", "--output-len",
              "200", "--concurrency", "32", "--price-per-gpu-hour", "2"],
    "serve-plan": ["serve-plan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--input-len", "1000",
                   "--output-len", "200", "--ttft-p99", "2", "--tpot-p99", "0.2"],
    "recipe": ["recipe", "llama3-405b-8k", "--no-rank"],
    "validate": ["validate", "--source", "korthikanti2022"],
    "calibrate": ["calibrate", str(Path(__file__).parent / "data" / "calibrate_runs.json")],
    "export": ["export", "torchtitan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--zero", "3"],
}  # fmt: skip
FREE_FORM = {"files", "rejections", "placement", "factors", "rejected", "axes"}
"""Objects keyed by data (file names, rejection reasons, mesh axes, factor names), not by contract keys."""


def keys(obj: Any, parent: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            if parent not in FREE_FORM:
                out.add(k)
            out |= keys(v, k)
    elif isinstance(obj, list):
        for v in obj:
            out |= keys(v, parent)
    return out


def cli_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = main([*argv, "--json"])
    assert code in (0, 1)  # validate exits 1 when a target does not hold
    return capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(RUNS))
def test_every_key_is_documented(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(cli_json(RUNS[command], capsys))
    missing = sorted(k for k in keys(data) if k not in DOCUMENTED)
    assert not missing, f"{command}: keys missing from docs/json.md: {missing}"


def test_units_carry_a_scope_outside_scoped_objects(capsys: pytest.CaptureFixture[str]) -> None:
    """Top-level byte and token quantities say whose they are (per GPU, per replica, total...)."""
    scoped = re.compile(r"_(per_gpu|per_replica|total|per_token|per_sequence|per_param|per_step|per_call)(_|$)")
    for command in ("memory", "fit", "serving", "estimate", "serve"):
        data = json.loads(cli_json(RUNS[command], capsys))
        for key in data:
            if key.endswith(("_bytes", "_tokens")) or "_bytes_" in key:
                assert scoped.search(key), f"{command}: {key} has a unit but no scope"


API = {
    "params": ("/api/params", {"model": "mixtral-8x7b", "finetune": "lora"}),
    "memory": ("/api/memory", {"model": "llama-3.1-8b", "gpu": "a100-80gb", "gpus": 8, "zero": 3,
                               "freeze": "layers=2"}),
    "fit": ("/api/fit", {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 1, "finetune": "lora"}),
    "estimate": ("/api/estimate", {"model": "llama-3.1-70b", "gpu": "h100-sxm", "gpus": 64, "tp": 8, "pp": 2,
                                   "tokens": 1e12, "price_per_gpu_hour": 2, "checkpoint_bandwidth": 1,
                                   "mtbf_gpu_hours": 45566, "timeline": True}),
    "collectives": ("/api/collectives", {}),
    "serve": ("/api/serve", {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 8, "input_len": 1000,
                             "output_len": 200, "concurrency": 32, "price_per_gpu_hour": 2}),
}  # fmt: skip


@pytest.mark.parametrize("command", sorted(API))
def test_cli_and_api_answer_the_same_bytes(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from meshplan.server.app import create_app

    path, params = API[command]
    with TestClient(create_app(), base_url="http://127.0.0.1") as client:
        response = client.get(path, params=params)
    assert response.status_code == 200, response.text
    assert response.text == cli_json(RUNS[command], capsys).rstrip("\n")


def conforms(value: Any, annotation: Any, where: str) -> list[str]:
    """Where ``value`` breaks ``annotation`` (a report model or a part of one): missing or unknown keys, types."""
    import types
    import typing

    from typing_extensions import is_typeddict

    if annotation is Any:
        return []
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        fits = [conforms(value, option, where) for option in options]
        return [] if any(not f for f in fits) else fits[0]
    if is_typeddict(annotation):
        if not isinstance(value, dict):
            return [f"{where}: expected an object"]
        hints = typing.get_type_hints(annotation)
        errors = [f"{where}.{k}: missing" for k in annotation.__required_keys__ if k not in value]
        errors += [f"{where}.{k}: not in the model" for k in value if k not in hints]
        for k, v in value.items():
            if k in hints:
                errors += conforms(v, hints[k], f"{where}.{k}")
        return errors
    if origin is list:
        (item,) = typing.get_args(annotation)
        if not isinstance(value, list):
            return [f"{where}: expected a list"]
        return [e for i, v in enumerate(value) for e in conforms(v, item, f"{where}[{i}]")]
    if origin is dict:
        _, item = typing.get_args(annotation)
        if not isinstance(value, dict):
            return [f"{where}: expected an object"]
        return [e for k, v in value.items() for e in conforms(v, item, f"{where}.{k}")]
    if annotation is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif annotation is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif annotation is type(None):
        ok = value is None
    else:
        ok = isinstance(value, annotation)
    return [] if ok else [f"{where}: {value!r} is not {getattr(annotation, '__name__', annotation)}"]


@pytest.mark.parametrize("command", sorted(set(RUNS) & set(REPORTS)))
def test_every_report_matches_its_model(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(cli_json(RUNS[command], capsys))
    assert conforms(data, REPORTS[command], command) == []


def test_the_cost_objective_is_documented_and_typed(capsys: pytest.CaptureFixture[str]) -> None:
    """``plan --objective cost`` with every cost flag: its ``cheapest_fleet`` and the plans' cost keys."""
    argv = ["plan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "16", "--seq", "4096", "--global-batch-tokens",
            "1M", "--objective", "cost", "--tokens", "1T", "--days", "100", "--price-per-gpu-hour", "2",
            "--checkpoint-bandwidth", "1", "--mtbf-gpu-hours", "45566"]  # fmt: skip
    data = json.loads(cli_json(argv, capsys))
    assert {"cheapest_fleet", "checkpoint"} <= set(data) and {"cost", "goodput"} <= set(data["plans"][0])
    assert sorted(k for k in keys(data) if k not in DOCUMENTED) == []
    assert conforms(data, REPORTS["plan"], "plan") == []


def test_models_catch_drift() -> None:
    """The checker itself: an unknown key, a missing key and a wrong type are all reported."""
    good = {"kind": "gpus", "items": [{"name": "h200"}]}
    assert conforms(good, REPORTS["list"], "list") == []
    assert conforms(good | {"extra": 1}, REPORTS["list"], "list") == ["list.extra: not in the model"]
    assert conforms({"items": []}, REPORTS["list"], "list") == ["list.kind: missing"]
    assert conforms({"kind": 3, "items": []}, REPORTS["list"], "list") == ["list.kind: 3 is not str"]


def test_openapi_carries_the_report_models() -> None:
    pytest.importorskip("fastapi")
    from meshplan.server.app import create_app

    schema = create_app().openapi()
    for path, name in (("/api/memory", "MemoryReport"), ("/api/estimate", "EstimateReport"),
                       ("/api/plan", "PlanReport"), ("/api/serve", "ServeReport")):  # fmt: skip
        body = schema["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{name}"}, path
    assert "weights_bytes_per_gpu_even_split" in schema["components"]["schemas"]["FitReport"]["properties"]
