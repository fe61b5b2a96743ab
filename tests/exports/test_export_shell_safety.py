"""Launchers are safe by construction: whatever text reaches a writer, bash runs exactly the intended commands.

Each script is read by bash itself with every command recorded and skipped (tests/exports/shell_record.py):
nothing it names runs. A model path with a newline is also refused where it enters (test_export_plan_file.py).
"""

from __future__ import annotations

import ast
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
from export_cases import LLAMA_8B
from hypothesis import given
from hypothesis import strategies as st
from shell_record import BASH, recorded_commands

from meshplan.exports import (
    DisaggregatedPlan,
    ServingPlan,
    check_model_path,
    export_deepspeed,
    export_megatron,
    export_sglang,
    export_sglang_disaggregated,
    export_torchtitan,
    export_trtllm,
    export_vllm,
    export_vllm_disaggregated,
    model_path_error,
)
from meshplan.exports.common import (
    RENDEZVOUS_ENDPOINT,
    ShellExpansion,
    comment,
    one_line,
    shell_join,
    shell_script,
)
from meshplan.exports.sglang import sglang_args
from meshplan.exports.trtllm import trtllm_args
from meshplan.exports.vllm import vllm_args
from meshplan.spec.layout import Layout, ZeroStage
from meshplan.spec.workload import Workload

pytestmark = pytest.mark.skipif(BASH is None, reason="bash is not installed")

SET = ["set", "-euo", "pipefail"]
HOSTILE = [
    "x\ntouch /tmp/meshplan-injected",
    "x\rtouch /tmp/meshplan-injected",
    "x\r\ntouch /tmp/meshplan-injected\n#",
    "$(touch /tmp/meshplan-injected)",
    "`touch /tmp/meshplan-injected`",
    "'; touch /tmp/meshplan-injected; '",
    '"; touch /tmp/meshplan-injected; "',
    "x \\\ntouch /tmp/meshplan-injected",
    "${PATH}",
    "${x@P}",
    "--trust-remote-code",
    "a\u2028b\x85c\x0bd\x1b[2Je",
    "",
]
"""Texts that would add a command, expand something or read as an option if a writer let them through."""

# Text that can reach a launcher: anything but a NUL (no argument can hold one; the writers refuse it).
texts = st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=40)
SERVING = ServingPlan(model_path="m", max_model_len=8192, gpu_memory_utilization=0.9, max_num_seqs=64)


def _unchecked(plan: ServingPlan, model_path: str) -> ServingPlan:
    """``plan`` with a model path its own check would refuse: what a writer gets if every check upstream failed."""
    plan = replace(plan)
    object.__setattr__(plan, "model_path", model_path)
    return plan


def _commands(script: str, tmp_path: Path) -> list[list[str]]:
    folder = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    return recorded_commands(script, folder)


@given(title=texts, key=texts, value=texts, tokens=st.lists(texts, min_size=1, max_size=6))
def test_any_text_in_a_launcher_is_one_comment_or_one_argument(
    tmp_path_factory: pytest.TempPathFactory, title: str, key: str, value: str, tokens: list[str]
) -> None:
    """The title and the predictions stay comments, the exported value one value, each token one argument."""
    script = shell_script(title=title, predicted={key: 1.5}, env={"MESHPLAN_X": value}, tokens=["vllm", *tokens])
    expected = [SET, ["export", f"MESHPLAN_X={value}"], ["vllm", *tokens]]
    assert _commands(script, tmp_path_factory.mktemp("s")) == expected
    assert shlex.split(shell_join(tokens)) == tokens
    assert len(script.splitlines()[1].splitlines()) == 1 and script.splitlines()[1].startswith("# ")


@pytest.mark.parametrize("evil", HOSTILE)
def test_serving_launchers_run_only_the_server_whatever_the_model_path(tmp_path: Path, evil: str) -> None:
    """vLLM, SGLang and TensorRT-LLM launchers (colocated and split pools) with a hostile model path: bash
    runs the server with the path as one argument, and nothing else."""
    plan = _unchecked(replace(SERVING, tp=2, dp=2), evil)
    predicted = {"tpot_s\nid": 0.01}
    for export, args in ((export_vllm, vllm_args), (export_sglang, sglang_args), (export_trtllm, trtllm_args)):
        out = export(plan, predicted=predicted)
        script = next(text for name, text in out.files.items() if name.endswith(".sh"))
        assert _commands(script, tmp_path) == [SET, args(plan)]
        assert shlex.split(out.command) == args(plan)
        assert evil in args(plan)
    pools = DisaggregatedPlan(prefill=plan, decode=_unchecked(replace(SERVING, tp=2, dp=6), evil))
    for export in (export_vllm_disaggregated, export_sglang_disaggregated):
        out = export(pools, predicted=predicted)
        for name, script in out.files.items():
            commands = _commands(script, tmp_path)
            assert commands[0] == SET and commands[-1][0] in ("vllm", "python") and len(commands) <= 3, name
            if "router" not in name:
                assert evil in commands[-1]


@pytest.mark.parametrize("evil", HOSTILE)
def test_training_launchers_run_only_the_launcher_whatever_the_model_path_or_name(tmp_path: Path, evil: str) -> None:
    """Megatron and DeepSpeed launchers and the torchtitan config with a hostile model path and model name."""
    model = replace(LLAMA_8B, name=evil or "m")
    layout, work = Layout(dp_shard=16, zero=ZeroStage.PARAMETERS), Workload(seq_len=4096, global_batch=64)
    for export in (export_megatron, export_deepspeed, export_torchtitan):
        out = export(model, layout, work, model_path=evil, predicted={"mfu\n": 0.4})
        script = next(text for name, text in out.files.items() if name.endswith(".sh"))
        commands = _commands(script, tmp_path)
        assert commands[0] == SET and commands[-1] == shlex.split(out.command.removeprefix("PYTHONPATH=. "))
        assert len(commands) == 2 + (export is export_torchtitan) + (export is export_megatron and "CUDA" in script)
        if evil and export is not export_torchtitan:  # an empty path writes no tokenizer / model flag
            assert evil in commands[-1]
    source = export_torchtitan(model, layout, work, model_path=evil).files["meshplan_torchtitan.py"]
    tree = ast.parse(source)
    assert one_line(model.name) in (ast.get_docstring(tree) or "")
    assert [type(n).__name__ for n in tree.body][-1] == "FunctionDef"
    assert all(isinstance(n, ast.ImportFrom | ast.Expr | ast.FunctionDef) for n in tree.body)


def test_two_node_launchers_expand_only_the_rendezvous_variables(tmp_path: Path) -> None:
    layout, work = Layout(tp=8, dp_shard=2, zero=ZeroStage.PARAMETERS), Workload(seq_len=4096, global_batch=64)
    for export in (export_megatron, export_torchtitan):
        out = export(LLAMA_8B, layout, work, model_path="/models/${HOME}")
        script = out.files["train_megatron.sh" if export is export_megatron else "train_torchtitan.sh"]
        assert " ${MASTER_ADDR}:${MASTER_PORT} " in script
        assert "'/models/${HOME}'" in (script if export is export_megatron else out.files["meshplan_torchtitan.py"])
        assert any(RENDEZVOUS_ENDPOINT in c for c in _commands(script, tmp_path))


def test_comment_lines_escape_what_would_end_them() -> None:
    assert comment("a\nb\rc\x00d\u2028e") == "# a\\nb\\rc\\x00d\\u2028e"
    assert comment("llama-3.1-8b on 8 GPUs") == "# llama-3.1-8b on 8 GPUs"


def test_only_plain_expansions_stay_unquoted_and_no_argument_holds_a_nul() -> None:
    for text in ("$(id)", "${X}; id", "`id`", "${X:-$(id)}", "${x@P}", "$X"):
        with pytest.raises(ValueError, match="expansion"):
            ShellExpansion(text)
    assert shell_join(["a b", "$(id)", ShellExpansion("${A}:${B_2}")]) == "'a b' '$(id)' ${A}:${B_2}"
    with pytest.raises(ValueError, match="NUL"):
        shell_join(["a\x00b"])
    with pytest.raises(ValueError, match="environment variable"):
        shell_script(title="t", predicted=None, env={"A;id": "1"}, tokens=["x"])


@pytest.mark.parametrize(
    "path",
    ["meta-llama/Llama-3.3-70B-Instruct", "/models/Llama 3/hf", "~/ckpt/step_1000", "org/model@v1.0+fp8", "Qwen3-8B"],
)
def test_model_paths_a_checkpoint_or_repository_has_pass(path: str) -> None:
    assert check_model_path(path) == path and model_path_error(path) is None
    assert ServingPlan(model_path=path, max_model_len=8, gpu_memory_utilization=0.9, max_num_seqs=1).model_path == path


@pytest.mark.parametrize("evil", [*HOSTILE, "a" * 1025, "a\tb", "a\x00b", "m;id", "m|id", "m&", "m>f", "m*", 7])
def test_model_paths_with_control_characters_or_shell_syntax_are_refused(evil: object) -> None:
    with pytest.raises(ValueError) as info:
        check_model_path(evil, what="--model-path")
    assert str(info.value).startswith("--model-path ") and len(str(info.value).splitlines()) == 1
    with pytest.raises(ValueError, match="model_path"):
        ServingPlan(model_path=evil, max_model_len=8, gpu_memory_utilization=0.9, max_num_seqs=1)  # type: ignore[arg-type]
