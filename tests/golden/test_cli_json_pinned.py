"""Every command's ``--json`` output, pinned to the bytes main printed before the package's layout changed.

A move of code changes no number: these 46 commands across every subcommand print exactly what they printed
(the search's own wall time, ``elapsed_s``, is the one value masked). Floats compare to 12 significant digits:
past them, sums differ in their last bits between numpy releases (0.027554876600647843 against ...787 under numpy
2.4.6), which is no change of a number. tests/golden/cli_json_cases.py says how a deliberate change of a number
rewrites them.
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
_FLOAT = re.compile(r"(?<![\w.])-?\d+(?:\.\d+(?:[eE][+-]?\d+)?|[eE][+-]?\d+)(?![\w.])")
SIGNIFICANT_DIGITS = 12


def _masked(text: str) -> str:
    """The wall time masked, every float literal rounded to ``SIGNIFICANT_DIGITS``."""
    text = _ELAPSED.sub('"elapsed_s": "masked"', text)
    return _FLOAT.sub(lambda m: format(float(m.group()), f".{SIGNIFICANT_DIGITS}g"), text)


def test_masking_rounds_the_last_bits_only() -> None:
    near = '{"a": 0.027554876600647843, "b": [1.5e-07, 12], "c": "v1.2.3", "elapsed_s": 0.91}'
    far = '{"a": 0.027554876600647787, "b": [1.5e-07, 12], "c": "v1.2.3", "elapsed_s": 3.2}'
    assert _masked(near) == _masked(far)
    assert _masked(near) != _masked(near.replace("0.02755487660", "0.02755487661"))  # the 11th digit still counts
    assert _masked(near) != _masked(near.replace("12]", "13]"))  # integers compare exactly
    assert '"c": "v1.2.3"' in _masked(near)  # a version string inside quotes is left as it is


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
