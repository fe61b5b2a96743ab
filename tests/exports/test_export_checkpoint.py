"""A serving export loads as pasted: the model it names is a checkpoint, not a catalog entry's name.

A catalog model serves its public repository (``hf_repo`` in its ``[meta]``, the repository its config.json was
read from); a config.json serves its folder; a model meshplan knows no checkpoint of asks for --model-path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshplan.cli import main

ENGINES = ("vllm", "sglang", "trtllm")
H100 = ["--gpu", "h100-sxm", "--gpus", "8"]


def _export(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object] | None, str]:
    code = main([*argv, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else None, err


@pytest.mark.parametrize("engine", ENGINES)
def test_the_readme_model_serves_its_public_repository(engine: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _export(["export", engine, "llama-3.1-70b", *H100, "--tp", "8"], capsys)
    assert code == 0 and out is not None, err
    command = str(out["command"]).split()
    assert "meta-llama/Llama-3.1-70B" in command and "llama-3.1-70b" not in command
    assert any("meta-llama/Llama-3.1-70B" in note for note in out["notes"])  # type: ignore[attr-defined]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_model_with_no_known_checkpoint_asks_for_model_path(engine: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _export(["export", engine, "llama-65b", *H100], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--model-path" in err and "llama-65b" in err
    code, out, err = _export(["export", engine, "llama-65b", *H100, "--model-path", "/ckpt/llama-65b"], capsys)
    assert code == 0 and out is not None and "/ckpt/llama-65b" in str(out["command"]).split(), err


TINY_LLAMA = {"model_type": "llama", "hidden_size": 1024, "num_attention_heads": 8, "num_hidden_layers": 4,
              "intermediate_size": 2048, "vocab_size": 32000, "max_position_embeddings": 4096}  # fmt: skip


def test_a_config_json_serves_its_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    for model in (str(folder), str(folder / "config.json")):
        code, out, err = _export(["export", "vllm", model, *H100], capsys)
        assert code == 0 and out is not None, err
        assert str(folder) in str(out["command"]).split()
