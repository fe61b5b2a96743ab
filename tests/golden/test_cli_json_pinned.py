"""Every command's ``--json`` output, pinned to the bytes main printed before the package's layout changed.

A move of code changes no number: these 46 commands across every subcommand print exactly what they printed
(the search's own wall time, ``elapsed_s``, is the one value masked). tests/golden/cli_json_cases.py says how a
deliberate change of a number rewrites them.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from meshplan.cli import main

sys.path.insert(0, str(Path(__file__).parent))
from cli_json_cases import CASES

HERE = Path(__file__).parent / "cli_json"
ROOT = Path(__file__).parents[2]
_ELAPSED = re.compile(r'"elapsed_s": [0-9.eE+-]+')


def _masked(text: str) -> str:
    return _ELAPSED.sub('"elapsed_s": "masked"', text)


def _run(args: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.chdir(ROOT):
        code = main([*args, "--json"])
    assert code == 0 or (args[0] == "validate" and code == 1), (args, code)  # validate: 1 when a target fails
    return out.getvalue()


def test_the_pinned_commands_cover_every_subcommand() -> None:
    commands = {args[0] for args in CASES.values()}
    ours = {
        "list",
        "params",
        "memory",
        "stacks",
        "estimate",
        "collectives",
        "validate",
        "calibrate",
        "plan",
        "recipe",
        "export",
        "fit",
        "serving",
        "serve",
        "serve-plan",
    }
    assert ours <= commands, ours - commands
    assert len(CASES) >= 30


@pytest.mark.parametrize("name", sorted(CASES))
def test_json_is_byte_identical(name: str, shared_validation: Callable[[str], None]) -> None:
    if name in ("validate_serving", "validate_memory"):
        shared_validation(name.removeprefix("validate_"))  # the session's report: computed once, printed here
    printed = _run(CASES[name])
    path = HERE / f"{name}.json"
    if os.environ.get("MESHPLAN_REWRITE_PINNED_JSON") == "1":
        path.write_text(printed)
    assert _masked(printed) == _masked(path.read_text())
