"""docs/configs.md's worked examples stay true: each ``meshplan ... --from FILE`` command, run again from
tests/data/configs (the serving launch files as the page shows them), prints the page's ``read from`` section
word for word (the section above it holds step times that move with the physics; this one only with the readers
and the catalog's stacks)."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from meshplan.cli import main

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "docs" / "configs.md").read_text(encoding="utf-8")
EXAMPLES = re.findall(r"```console\n\$ (meshplan [^\n]*)\n(.*?)\n```", PAGE, flags=re.S)
LAUNCHERS = dict(re.findall(r"`(serve_\w+\.sh)`.*?```bash\n(.*?)```", PAGE, flags=re.S))


def _section(text: str) -> str:
    return text[text.index("read from ") :].rstrip() if "read from " in text else ""


def test_the_page_has_one_example_per_engine() -> None:
    kinds = {re.search(r"^read from \S+ \((\w+)\):", body, re.M).group(1) for _, body in EXAMPLES}  # type: ignore[union-attr]
    assert kinds == {"torchtitan", "megatron", "nemo", "deepspeed", "accelerate", "vllm", "sglang", "trtllm"}
    assert set(LAUNCHERS) == {"serve_vllm.sh", "serve_sglang.sh", "serve_trtllm.sh"}


@pytest.mark.parametrize(("command", "shown"), EXAMPLES, ids=[c.split()[1] + ":" + c.split()[3] for c, _ in EXAMPLES])
def test_the_example_reads_as_shown(
    command: str, shown: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in (ROOT / "tests" / "data" / "configs").iterdir():
        shutil.copy(name, tmp_path / name.name)
    for name, text in LAUNCHERS.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(command.split(" | ")[0])[1:]
    assert main(argv) == 0
    assert _section(capsys.readouterr().out) == _section(shown)
