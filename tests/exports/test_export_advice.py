"""An export refusal's advice works: the command it names, run as written, gives a configuration the engine takes.

The README's own plan (Llama 3.1 70B on 64 H200s) ranks first a ZeRO-1 layout torchtitan cannot run: its export
used to answer "closest: zero=2", and ``--from-plan ... --zero 2`` was itself refused.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from meshplan.cli import main

README_PLAN = ["llama-3.1-70b", "--gpu", "h200", "--gpus", "64", "--seq", "8192", "--global-batch-tokens", "4194304"]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code, out, err = _run(argv, capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (code, err)
    return err.strip()


def _follow(message: str, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    """Run the 'meshplan plan ..., then meshplan export ...' the message names; the export's JSON."""
    found = re.search(r"`(meshplan plan [^`]+)`, then `(meshplan export [^`]+)`", message)
    assert found, message
    for command in found.groups():
        argv = shlex.split(command)[1:]
        code, out, err = _run([*argv, "--json"] if argv[0] == "export" else argv, capsys)
        assert code == 0, (command, err)
    return json.loads(out)


@pytest.fixture(scope="module")
def readme_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "p.json"
    assert main(["plan", *README_PLAN, "--save", str(path), "--json"]) == 0
    assert json.loads(path.read_text())["plans"][0]["layout"]["zero"] == 1
    return path


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # the advice saves its plan in the working folder
    return tmp_path


def test_the_readme_plan_refused_by_torchtitan_says_to_replan_and_that_works(
    readme_plan: Path, in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    message = _refused(["export", "torchtitan", "--from-plan", str(readme_plan)], capsys)
    assert "ZeRO-1" in message and "--engine torchtitan" in message and "zero=2" not in message
    out = _follow(message, capsys)
    assert out["engine"] == "torchtitan" and "meshplan_torchtitan.py" in out["files"]  # type: ignore[operator]
    # the other engine it names exports the plan as it is
    other = re.search(r"megatron runs it as it is: `(meshplan export megatron --from-plan [^`]+)`", message)
    assert other, message
    assert _run(shlex.split(other.group(1))[1:], capsys)[0] == 0


def test_a_pin_given_with_from_plan_is_refused_with_the_plan_that_takes_it(
    readme_plan: Path, in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    message = _refused(["export", "torchtitan", "--from-plan", str(readme_plan), "--zero", "2"], capsys)
    assert "--zero 2 --engine torchtitan" in message
    out = _follow(message, capsys)
    saved = json.loads((in_tmp / "torchtitan-plan.json").read_text())
    assert saved["plans"][0]["layout"]["zero"] == 2 and out["engine"] == "torchtitan"


def test_deepspeed_refuses_the_readme_plans_pipeline_and_its_replan_exports(
    readme_plan: Path, in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    message = _refused(["export", "deepspeed", "--from-plan", str(readme_plan)], capsys)
    pp = json.loads(readme_plan.read_text())["plans"][0]["layout"]["pp"]
    assert pp > 1 and f"pp={pp}" in message and "--engine deepspeed" in message
    assert _follow(message, capsys)["engine"] == "deepspeed"


FLAGS = ["llama-3.1-70b", "--gpu", "h200", "--gpus", "64", "--tp", "2", "--seq", "8192", "--global-batch", "512"]


def test_a_layout_from_flags_is_refused_with_the_flag_that_runs(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    message = _refused(["export", "torchtitan", *FLAGS, "--zero", "1"], capsys)
    assert "closest: --zero 2 " in message and "megatron and deepspeed run it as it is" in message
    assert _run(["export", "torchtitan", *FLAGS, "--zero", "2"], capsys)[0] == 0
    assert _run(["export", "megatron", *FLAGS, "--zero", "1"], capsys)[0] == 0


def test_a_workload_no_layout_fixes_names_the_flag_not_a_replan(capsys: pytest.CaptureFixture[str]) -> None:
    message = _refused(["export", "torchtitan", *FLAGS, "--zero", "3", "--precision", "fp16"], capsys)
    assert "closest: --precision bf16" in message and "meshplan plan" not in message
    assert _run(["export", "torchtitan", *FLAGS, "--zero", "3", "--precision", "bf16"], capsys)[0] == 0


SERVING = ["llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "1"]


def test_a_serving_refusal_names_flags_and_engines_that_run_it(capsys: pytest.CaptureFixture[str]) -> None:
    message = _refused(["export", "sglang", *SERVING, "--kv-dtype", "fp16"], capsys)
    assert "closest: --kv-dtype bf16 or fp8; vllm and trtllm run it with the same flags" in message
    assert _run(["export", "sglang", *SERVING, "--kv-dtype", "fp8"], capsys)[0] == 0
    for engine in ("vllm", "trtllm"):
        assert _run(["export", engine, *SERVING, "--kv-dtype", "fp16"], capsys)[0] == 0


def test_a_serving_plan_given_to_a_trainer_names_the_engines_that_take_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.json"
    argv = ["serve-plan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "1", "--input-len", "1k", "--output-len", "99"]
    assert main([*argv, "--save", str(path), "--json"]) == 0
    capsys.readouterr()
    message = _refused(["export", "torchtitan", "--from-plan", str(path)], capsys)
    assert "is a serving plan" in message and "vllm, sglang or trtllm" in message
    assert _run(["export", "vllm", "--from-plan", str(path)], capsys)[0] == 0
