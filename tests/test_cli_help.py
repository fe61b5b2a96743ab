"""What the CLI says about itself is what it does: defaults in --help, --version, examples that parse, tables
within 120 columns, the conditions a bill states, validate's progress on a terminal, one weights-dtype flag."""

from __future__ import annotations

import io
import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest

from meshplan.cli import build_parser, main
from meshplan.cli.parser import EXAMPLES, PIN_FIELDS
from meshplan.render import WIDTH, fit_width, table
from meshplan.spec.requests import BY_NAME, FIELDS, field

ROOT = Path(__file__).resolve().parent.parent


def _help(*argv: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main([*argv, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _text(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


def _option_help(text: str, flag: str) -> str:
    """The help of one option in argparse's --help text, its lines joined."""
    found = re.search(rf"^  {re.escape(flag)}\b.*?(?=^  -|^\S|\Z)", text, re.M | re.S)
    assert found, flag
    return " ".join(found.group().split())


# --- defaults in --help -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["serving", "serve"])
def test_serving_tp_help_says_what_an_unset_tp_becomes(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = _option_help(_help(command, capsys=capsys), "--tp")
    assert "(default: 1)" not in text and "largest divisor of gpus / pp within one scale-up domain" in text
    # and that is what runs: TP 8 on one 8-GPU H100 board, and on two (two replicas)
    for gpus, replicas in ((8, 1), (16, 2)):
        out = _json(["serving", "llama-3.1-70b", "--gpu", "h100-sxm", "--gpus", str(gpus)], capsys)
        assert (out["tp"], out["replicas"]) == (8, replicas)


def test_plan_pins_say_unpinned_not_a_value(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help("plan", capsys=capsys)
    pins = text[text.index("pins: ") : text.index("\nconditions:")]
    assert "(default: 1)" not in pins and "(default: 0)" not in pins and "(default: none)" not in pins
    assert " ".join(pins.split()).count("(default: unpinned)") == len(PIN_FIELDS)


def test_memory_help_says_the_stack_sets_precision(capsys: pytest.CaptureFixture[str]) -> None:
    text = _option_help(_help("memory", capsys=capsys), "--precision")
    assert "(default: the --stack's, else bf16)" in text


# --- --version and examples -------------------------------------------------------------------------------------


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"meshplan {version}"


MAIN = ("params", "memory", "estimate", "validate", "calibrate", "plan", "recipe", "export", "fit", "serving")
MAIN += ("serve", "serve-plan")


@pytest.mark.parametrize("command", MAIN)
def test_each_main_command_shows_examples_that_parse(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(command, capsys=capsys)
    examples = text[text.index("\nexamples:\n") :].strip().splitlines()[1:]
    assert len(examples) >= 2 and examples == [f"  meshplan {e}" for e in EXAMPLES[command]]
    parser = build_parser()
    for example in EXAMPLES[command]:
        parser.parse_args(shlex.split(example))  # a mistyped flag raises UsageError
    assert max(len(line) for line in text.splitlines()) <= WIDTH


# --- text within 120 columns ------------------------------------------------------------------------------------

WIDE = {
    "plan": ["plan", "llama-3.1-70b", "--gpu", "h200", "--gpus", "64", "--seq", "8192", "--global-batch-tokens", "4M"],
    "memory": ["memory", "llama-3.1-70b", "--gpu", "h100-sxm", "--gpus", "64", "--tp", "8", "--pp", "4", "--sp"],
    "stacks": ["stacks"],
    "list": ["list", "gpus"],
    "estimate": ["estimate", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--cp", "2", "--dp-shard", "4",
                 "--zero", "3", "--stack", "torchtitan"],
    "serve": ["serve", "llama-3.1-70b", "--gpu", "h100-sxm", "--gpus", "8", "--input-len", "1000", "--output-len",
              "200", "--concurrency", "8"],
}  # fmt: skip


@pytest.mark.parametrize("name", list(WIDE))
def test_text_output_stays_within_120_columns(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    lines = _text(WIDE[name], capsys).splitlines()
    assert max(len(line) for line in lines) <= WIDTH, max(lines, key=len)


def test_an_export_command_wraps_into_lines_a_shell_runs_as_one(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["export", "megatron", "llama-3.1-70b", "--gpu", "h100-sxm", "--gpus", "64", "--tp", "8", "--pp", "4"]
    text = _text([*argv, "--seq", "4096", "--global-batch", "64"], capsys)
    command = _json([*argv, "--seq", "4096", "--global-batch", "64"], capsys)["command"]
    shown = text[text.index("$ ") + 2 : text.index("\n\n")]
    assert all(len(line) <= WIDTH for line in shown.splitlines()) and len(shown.splitlines()) > 1
    assert shlex.split(shown.replace(" \\\n", " ")) == shlex.split(command)


def test_a_wide_table_wraps_its_widest_text_column() -> None:
    rows = [("a", "x " * 100, "1.0 s"), ("b", "short", "2.0 s")]
    text = table(rows, ["name", "what", "time"], align="llr")
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= WIDTH and len(lines) > 4
    assert lines[2].startswith("a     x x") and lines[2].endswith("1.0 s") and lines[3].startswith("      x x")
    assert fit_width("word " * 50).count("\n") == 2 and all(len(x) <= WIDTH for x in fit_width("w " * 300).split())


# --- the conditions a bill states -------------------------------------------------------------------------------


def test_memory_lists_only_the_conditions_that_are_set(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["memory", "llama-3.1-8b", "--gpu", "h200", "--gpus", "8", "--dp-shard", "8", "--zero", "3"]
    every = _json(argv, capsys)["conditions"]
    text = _text(argv, capsys)
    block = text[text.index("conditions (") :].splitlines()
    unset = [name for name, c in every.items() if c["value"] is None and c["source"] == "default"]
    assert len(every) > 40 and len(unset) > 15  # the default stack (megatron-core) sets the others
    assert f"{len(unset)} more unset" in block[0] and len(block) == 3 + len(every) - len(unset)
    shown = {line.split()[0] for line in block[3:]}
    assert shown == set(every) - set(unset) and {"precision", "kernels", "attention"} <= shown
    with_stack = _text([*argv, "--stack", "torchtitan", "--loss-fusion", "on"], capsys)
    assert re.search(r"^loss_fusion +on +flag$", with_stack, re.M)
    assert re.search(r"^loss +upcast +stack$", with_stack, re.M)


# --- validate's progress on a terminal --------------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_validate_shows_progress_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import meshplan.cli.support as support

    monkeypatch.setattr(support, "SHOW_AFTER_S", 0.0)
    for terminal, extra, shown in ((True, [], True), (False, [], False), (True, ["--json"], False)):
        err = _Terminal() if terminal else io.StringIO()
        monkeypatch.setattr("sys.stderr", err)
        monkeypatch.setattr("sys.stdout", io.StringIO())
        assert main(["validate", "--source", "korthikanti2022", *extra]) == 0
        text = err.getvalue()
        assert ("validating: " in text and "predictions of published runs" in text) is shown, (terminal, extra)
        assert not shown or text.endswith("\r\033[K")  # the line is cleared before the report prints


# --- one weights-dtype option -----------------------------------------------------------------------------------


def test_the_weights_dtype_is_declared_once_with_its_old_name_as_an_alias() -> None:
    assert "dtype" not in BY_NAME and field("weights_dtype").deprecated == "dtype"
    assert [f.name for f in FIELDS].count("weights_dtype") == 1


SERVING = ["serving", "deepseek-v3", "--gpu", "h200", "--gpus", "8"]
SERVE = ["serve", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "1", "--input-len", "512", "--output-len", "64",
         "--concurrency", "4"]  # fmt: skip


@pytest.mark.parametrize("argv", [SERVING, SERVE], ids=["serving", "serve"])
def test_weights_dtype_and_its_deprecated_alias_give_one_answer(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    new = _json([*argv, "--weights-dtype", "int8"], capsys)  # neither model's published dtype: not the default
    assert _json([*argv, "--dtype", "int8"], capsys) == new != _json(argv, capsys)
    text = _option_help(_help(argv[0], capsys=capsys), "--weights-dtype")
    assert "--dtype" in text and "deprecated" in text


def test_the_api_takes_the_alias_too() -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from meshplan.server.app import create_app

    query = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 1}
    with TestClient(create_app(), base_url="http://127.0.0.1") as client:
        for path in ("/api/serving", "/api/fit"):
            new = client.get(path, params=query | {"weights_dtype": "fp8"})
            old = client.get(path, params=query | {"dtype": "fp8"})
            assert new.status_code == old.status_code == 200 and new.json() == old.json(), path
            both = client.get(path, params=query | {"weights_dtype": "fp8", "dtype": "int4"})
            assert both.status_code == 400 and "deprecated alias" in both.json()["error"], both.text
