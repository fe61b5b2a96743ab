"""The one input schema: every field is accepted, with the same meaning and bounds, by the CLI, the HTTP API,
``plan --compare`` and the catalog's run and recipe files."""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from importlib import resources
from typing import Any

import pytest

from meshplan.cli import build_parser, main
from meshplan.reports.inputs import FinetuneRequest, LayoutRequest
from meshplan.reports.plan_explain import parse_compare
from meshplan.spec.requests import FIELDS, Field, Group, field, group

FREE_TEXT = {
    "gpu": "h200",
    "scale_out": "ib-ndr",
    "axis_order": "tp,cp,ep,dp_shard,pp,dp_replicate",
    "lora_targets": "q,v",
    "freeze": "layers=2",
    "disaggregate": "4:4",
    "speculative": "eagle:3",
    "draft_model": "llama-3.2-1b",
    "weights_dtypes": "fp8,bf16",
    "recompute_modules": "core_attn,mlp",
    "recompute_keep": "q,k,v",
    "profile": "compute_scale=0.9,comm_scale=1.2",
}


def sample(f: Field) -> tuple[str, Any]:
    """A valid value other than the default, as text and as the parsed value it must become."""
    if f.type is bool:
        return "true", True
    if f.type is str:
        text = f.choices[-1] if f.choices else FREE_TEXT[f.name]
        return text, text
    if f.type is int:
        value = int(f.lo or 0) + 2 if f.hi is None or f.hi >= (f.lo or 0) + 2 else int(f.hi)
        return str(value), value
    value = (f.lo + f.hi) / 2 if f.lo is not None and f.hi is not None else 1.5
    return repr(value), value


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def cli_flags() -> dict[str, list[tuple[str, argparse.Action]]]:
    out: dict[str, list[tuple[str, argparse.Action]]] = {}
    for command, sub in subparsers().items():
        for action in sub._actions:
            for option in action.option_strings:
                out.setdefault(option, []).append((command, action))
    return out


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    pytest.importorskip("fastapi")
    from meshplan.server.app import create_app

    return create_app().openapi()  # type: ignore[no-any-return]


def api_params(schema: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for path in schema["paths"].values():
        for op in path.values():
            for p in op.get("parameters", []):
                out.setdefault(p["name"], []).append(p)
    return out


@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
def test_every_field_is_a_cli_flag_parsed_by_the_schema(f: Field) -> None:
    flags = cli_flags()
    assert f.flag in flags, f"{f.flag} is on no command"
    text, value = sample(f)
    mine = [(command, action) for command, action in flags[f.flag] if action.dest == f.name]
    assert mine, f"{f.flag} never sets {f.name}"
    for command, action in mine:
        if f.type is bool:
            assert action.nargs == 0 and action.default is False, (command, f.name)
            continue
        assert action.type is not None and action.type(text) == value, (command, f.name)
        assert f.help in (action.help or "") or f.bare_help in (action.help or ""), (command, f.name)


@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
def test_every_field_is_an_api_parameter_with_the_same_bounds(f: Field, openapi: dict[str, Any]) -> None:
    params = api_params(openapi)
    assert f.key in params, f"{f.key} is on no endpoint"
    assert any(_same(p, f) for p in params[f.key]), f"no endpoint takes {f.key} as the schema declares it"
    sharing = [g for g in FIELDS if g.key == f.key]  # serving's objective shares its name with training's
    for p in params[f.key]:
        assert any(_same(p, g) for g in sharing), (f.key, p)


def _same(param: dict[str, Any], f: Field) -> bool:
    """Whether an OpenAPI parameter has the field's type, choices and bounds."""
    schema = param["schema"]
    concrete = [o for o in schema.get("anyOf", [schema]) if o.get("type") != "null"]
    if len(concrete) != 1:
        return False
    (s,) = concrete
    if f.choices:
        return tuple(s.get("enum", ())) == f.choices
    if f.type in (int, float):
        low = s.get("exclusiveMinimum" if f.exclusive_lo else "minimum")
        return bool(s.get("maximum") == f.hi and low == f.lo)
    return True


@pytest.mark.parametrize("f", group(Group.LAYOUT), ids=lambda f: f.name)
def test_compare_takes_every_layout_field(f: Field) -> None:
    text, value = sample(f)
    assert getattr(parse_compare(f"{f.name}={text}"), f.name) == value
    assert getattr(parse_compare(f"{f.name.replace('_', '-')}={text}"), f.name) == value


def test_compare_refuses_what_it_does_not_know_and_checks_dp() -> None:
    with pytest.raises(ValueError, match="unknown layout key 'dq'"):
        parse_compare("tp=8,dq=4")
    with pytest.raises(ValueError, match="--tp: -1 is outside"):
        parse_compare("tp=-1")
    from meshplan.reports.inputs import resolve_layout

    with pytest.raises(ValueError, match="dp=999 does not match the fleet"):
        resolve_layout(parse_compare("tp=8,pp=2,dp=999"), gpus=64)
    assert resolve_layout(parse_compare("tp=8,pp=2,dp=4"), gpus=64).dp == 4


def test_request_dataclasses_hold_exactly_the_schema_fields() -> None:
    layout = {f.name: f.default for f in group(Group.LAYOUT)}
    assert {x.name: x.default for x in dataclasses.fields(LayoutRequest)} == layout
    finetune = {f.name for f in group(Group.FINETUNE)} - {"finetune"}
    assert {x.name for x in dataclasses.fields(FinetuneRequest)} - {"mode"} == finetune


def _catalog_tables(folder: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for entry in (resources.files("meshplan") / "catalog" / folder).iterdir():
        if entry.name.endswith(".toml"):
            data = tomllib.loads(entry.read_text(encoding="utf-8"))
            for table in [data, data.get("defaults", {}), *data.get("case", [])]:
                if "layout" in table:
                    out.append((entry.name, table["layout"]))
    return out


@pytest.mark.parametrize("folder", ["runs", "recipes"])
def test_catalog_layouts_use_the_schema(folder: str) -> None:
    tables = _catalog_tables(folder)
    assert tables
    for name, layout in tables:
        req = LayoutRequest.parse(layout)  # unknown keys or out-of-range values raise
        for key, value in layout.items():
            assert getattr(req, key) == field(key).parse(value), (name, key)


PLAN = ["plan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq", "4k", "--global-batch-tokens", "1M"]


PLAN = ["plan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq", "4k", "--global-batch-tokens", "1M"]
MEMORY = ["memory", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([*MEMORY, "--seq", "nan"], "--seq"),
        ([*MEMORY, "--optimizer-bytes", "nan"], "finite"),
        ([*MEMORY, "--tp", "0"], "--tp"),
        ([*PLAN, "--tokens=-1e12"], "--tokens"),
        ([*PLAN, "--compare", "tp=8,dp=999"], "dp=999"),
        (["serving", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "1", "--gpu-memory-utilization", "0"], "0"),
    ],
)
def test_bad_values_are_one_line_errors(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and needle in err, err


def test_size_suffixes() -> None:
    assert field("seq").parse("8k") == 8192
    assert field("seq").parse("128K") == 131072
    assert field("global_batch_tokens").parse("16M") == 16 * 2**20
    assert field("tokens").parse("15T") == 15e12
    with pytest.raises(ValueError, match="--seq"):
        field("seq").parse("1.3k")
    with pytest.raises(ValueError, match="outside"):
        field("seq").parse("2M")
