"""The README's first screen: its two commands stay true."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from meshplan.cli import main

ROOT = Path(__file__).resolve().parent.parent


def first_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_exactly_two_commands() -> None:
    assert len(first_commands()) == 2


def test_the_main_job_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """The part after the install: a real plan, printed as a table."""
    job = first_commands()[0].split("&&")[-1].strip()
    argv = shlex.split(job)
    assert argv[0] == "meshplan"
    assert main(argv[1:]) == 0
    out = capsys.readouterr().out
    assert "layouts in" in out and "across fabric" in out and "best vs runner-up" in out


def test_the_test_command_is_what_ci_runs() -> None:
    tests = first_commands()[1].split("&&")[-1].strip()
    assert tests == "python -m pytest -q"
    assert tests in (ROOT / ".ci" / "run").read_text()
