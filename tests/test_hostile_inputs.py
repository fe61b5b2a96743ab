"""Hostile files and flags: each is refused with exit code 2 and one line on stderr, quickly.

The corpus is tests/hostile/ (its README says what each file is); FIFOs, a symlink to /dev/zero, folders and
oversized files are made here, since a checkout cannot hold them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshplan.cli import main

HOSTILE = Path(__file__).resolve().parent / "hostile"


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the CLI in-process; assert exit 2, one line on stderr, nothing on stdout; return the line."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, (argv, code, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert out == ""
    return lines[0]


def corpus(pattern: str) -> list[Path]:
    return sorted(HOSTILE.glob(pattern))


@pytest.mark.parametrize("path", corpus("*.json") + corpus("toml-*.toml"), ids=lambda p: p.name)
@pytest.mark.parametrize("command", ["params", "memory", "plan"])
def test_hostile_model_files(capsys: pytest.CaptureFixture[str], path: Path, command: str) -> None:
    fleet = [] if command == "params" else ["--gpu", "h100-sxm", "--gpus", "8"]
    extra = ["--seq", "4096", "--global-batch-tokens", "65536"] if command == "plan" else []
    line = refused(capsys, command, str(path), *fleet, *extra)
    assert path.stem in line or path.name in line  # the message names the file


@pytest.mark.parametrize("path", corpus("gpu-*.toml"), ids=lambda p: p.name)
def test_hostile_gpu_files(capsys: pytest.CaptureFixture[str], path: Path) -> None:
    line = refused(capsys, "memory", "llama-3.2-1b", "--gpu", str(path), "--gpus", "8")
    assert "finite" in line


def test_hostile_link_file(capsys: pytest.CaptureFixture[str]) -> None:
    link = str(HOSTILE / "link-negative.toml")
    line = refused(capsys, "estimate", "llama-3.2-1b", "--gpu", "h100-sxm", "--gpus", "8", "--scale-out", link)
    assert "bandwidth" in line


@pytest.fixture
def special_files(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """A FIFO nobody writes to, a symlink to /dev/zero, a folder, and a 5 MB file (over the 4 MB limit)."""
    files = {"folder": tmp_path / "folder.json"}
    files["folder"].mkdir()
    if hasattr(os, "mkfifo"):
        files["fifo"] = tmp_path / "fifo.json"
        os.mkfifo(files["fifo"])
    if Path("/dev/zero").exists():
        files["zero"] = tmp_path / "zero.json"
        files["zero"].symlink_to("/dev/zero")
    files["big"] = tmp_path / "big.json"
    with open(files["big"], "wb") as f:
        f.truncate(5 * 1024 * 1024)  # sparse: no disk written
    yield files


@pytest.mark.parametrize("kind", ["folder", "fifo", "zero", "big"])
def test_special_files_are_refused_at_once(
    capsys: pytest.CaptureFixture[str], special_files: dict[str, Path], kind: str
) -> None:
    if kind not in special_files:
        pytest.skip(f"this system cannot make a {kind}")
    path = str(special_files[kind])
    refused(capsys, "params", path)
    refused(capsys, "export", "torchtitan", "--from-plan", path)


# --- flags ------------------------------------------------------------------------------------------------------

FLEET = ("llama-3.2-1b", "--gpu", "h100-sxm", "--gpus", "8")
BAD_FLAGS = [
    ("memory", *FLEET, "--optimizer-bytes", "nan"),
    ("memory", *FLEET, "--optimizer-bytes", "inf"),
    ("memory", *FLEET, "--optimizer-bytes", "-1"),
    ("estimate", *FLEET, "--tokens=-1e12"),
    ("estimate", *FLEET, "--tokens", "nan"),
    ("estimate", *FLEET, "--tokens", "1e400"),
    ("collectives", "--size-mb", "5e-324"),
    ("collectives", "--size-mb", "inf"),
    ("collectives", "--size-mb", "0"),
    ("plan", *FLEET, "--seq", "4096", "--global-batch-tokens", "65536", "--headroom", "nan"),
    ("plan", *FLEET, "--seq", "4096", "--global-batch-tokens", "65536", "--days", "inf"),
    ("plan", *FLEET, "--seq", "4096", "--global-batch-tokens", "65536", "--compare", "tp=-1"),
    ("plan", *FLEET, "--seq", "4096", "--global-batch-tokens", "65536", "--save", "/nonexistent/folder/p.json"),
    ("memory", "llama-3.2-1b", "--gpu", "h100-sxm", "--gpus", "1000000000000"),
    ("fit", "llama-3.2-1b", "--gpu", "h100-sxm", "--gpus", "1000000000000"),
    ("serving", "llama-3.2-1b", "--gpu", "h100-sxm", "--gpus", "1000000000000"),
    (
        "plan",
        "llama-3.2-1b",
        "--gpu",
        "h100-sxm",
        "--gpus",
        "1000000000000",
        "--seq",
        "4096",
        "--global-batch-tokens",
        "65536",
    ),
    ("serving", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "3"),
    ("export", "vllm", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "3"),
    ("export", "vllm", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--zero", "3"),
    ("export", "torchtitan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--kv-dtype", "fp8"),
    ("export", "megatron", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--attention", "eager"),
    ("export", "vllm", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq", "100"),
    ("check", "--world-size", "1000"),
    ("check", "--seq", "100000000"),
    ("check", "--layers", "1000000"),
    ("params", "no-such-model"),
    ("memory", "llama-3.2-1b", "--gpu", "no-such-gpu", "--gpus", "8"),
]


@pytest.mark.parametrize("argv", BAD_FLAGS, ids=lambda a: " ".join(a[:1] + a[-2:]))
def test_bad_flags(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]) -> None:
    refused(capsys, *argv)


def test_a_float_flag_out_of_range_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--optimizer-bytes" in refused(capsys, "memory", *FLEET, "--optimizer-bytes", "nan")
    assert "--size-mb" in refused(capsys, "collectives", "--size-mb", "5e-324")


def test_a_subnormal_concurrency_is_an_idle_engine(capsys: pytest.CaptureFixture[str]) -> None:
    """Found by the API fuzz: 5e-324 users underflow the closed loop's rate to 0; none of them waits."""
    argv = ["serve", "mpt-1b", "--gpu", "b200", "--gpus", "128", "--input-len", "1", "--output-len", "100"]
    assert main([*argv, "--concurrency", "5e-324", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["queue_s_p99"] == 0.0 and out["tokens_per_s_total"] == 0.0 and out["tpot_s"] > 0


# --- saved plans ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_plan(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    assert main(["plan", *FLEET, "--seq", "4096", "--global-batch-tokens", "65536", "--save", str(path)]) == 0
    data: dict[str, object] = json.loads(path.read_text())
    return data


def _broken_plans(good: dict[str, object]) -> dict[str, object]:
    def edit(change: object) -> object:
        data = json.loads(json.dumps(good))
        change(data)  # type: ignore[operator]
        return data

    return {
        "not json": "{plans: [",
        "an array": [1, 2],
        "no plans": {"plans": []},
        "plans not a list": edit(lambda d: d.update(plans="x")),
        "a plan not an object": edit(lambda d: d.update(plans=[5])),
        "no tp": edit(lambda d: d["plans"][0]["layout"].pop("tp")),
        "tp as text": edit(lambda d: d["plans"][0]["layout"].update(tp="2")),
        "no seq": edit(lambda d: d.pop("seq")),
        "gpus null": edit(lambda d: d.update(gpus=None)),
        "cp_kind a number": edit(lambda d: d["plans"][0]["layout"].update(cp_kind=3)),
        "negative tp": edit(lambda d: d["plans"][0]["layout"].update(tp=-4)),
        "binary": b"\xff\xfe\x00\x01",
    }


def test_flags_a_saved_plan_overrides_are_refused(
    capsys: pytest.CaptureFixture[str], saved_plan: dict[str, object], tmp_path: Path
) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(saved_plan))
    line = refused(capsys, "export", "torchtitan", "--from-plan", str(path), "--seq", "8192", "--tp", "2")
    assert "--tp" in line and "--seq" in line


def test_malformed_saved_plans(
    capsys: pytest.CaptureFixture[str], saved_plan: dict[str, object], tmp_path: Path
) -> None:
    for kind, content in _broken_plans(saved_plan).items():
        path = tmp_path / f"{kind.replace(' ', '-')}.json"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content if isinstance(content, str) else json.dumps(content))
        line = refused(capsys, "export", "torchtitan", "--from-plan", str(path))
        assert len(line) > len("meshplan: error: ") + 10, (kind, line)  # a sentence, not "error: seq"


# --- a bug is not bad input -------------------------------------------------------------------------------------


def test_unknown_catalog_names_are_value_errors() -> None:
    from meshplan import io

    for load in (io.load_model, io.load_gpu, io.load_link):
        with pytest.raises(io.UnknownName, match="unknown"):
            load("no-such-name")


def test_a_key_error_is_a_bug_not_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyError inside a command (a programming error) raises out of main instead of exiting 2."""
    import meshplan.reports.params as params

    def broken(*args: object, **kwargs: object) -> dict[str, object]:
        raise KeyError("seq")

    monkeypatch.setattr(params, "params_report", broken)
    with pytest.raises(KeyError):
        main(["params", "llama-3.2-1b"])


def test_a_fleet_with_too_many_layouts_is_refused_at_once(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """9,999,360 GPUs has 264 divisors: tens of billions of MoE layouts, refused from counting them, before any
    chunk of layouts is evaluated."""
    import meshplan.search.rank as rank

    def no_layouts(*args: object, **kwargs: object) -> None:
        raise AssertionError("a layout chunk was evaluated before the refusal")

    monkeypatch.setattr(rank, "_evaluate_chunk", no_layouts)
    argv = ("plan", "deepseek-v3", "--gpu", "h100-sxm", "--gpus", "9999360", "--seq", "4096")
    line = refused(capsys, *argv, "--global-batch-tokens", "16777216")
    assert "over the limit" in line


# --- Ctrl-C ------------------------------------------------------------------------------------------------------


_HOLD_IN_SEARCH = """
import sys, time
from pathlib import Path
import meshplan.search.rank as rank
from meshplan.cli import main
evaluate, ready = rank._evaluate_chunk, Path(sys.argv[1])
def held(*args, **kwargs):
    rank._evaluate_chunk = evaluate
    ready.write_text("in the search")
    time.sleep(60.0)  # the SIGINT ends this sleep with a KeyboardInterrupt, inside the search's own frames
    return evaluate(*args, **kwargs)
rank._evaluate_chunk = held
raise SystemExit(main(sys.argv[2:]))
"""
"""The CLI, run as ``python -m meshplan.cli`` runs it, except that the search's first chunk of layouts waits
to be interrupted and says when it has started: a Ctrl-C that lands inside the search on a machine of any
speed (a fixed delay lands after the end where the search takes under that delay)."""


def _interrupt(argv: list[str], after_s: float | None) -> tuple[int, str, list[str]]:
    """Run the CLI in a session of its own, send the group SIGINT (as a terminal's Ctrl-C does) after
    ``after_s``, or, where it is None, once the search has started (``_HOLD_IN_SEARCH``); (exit code, stderr,
    processes of the group still alive 5 s later)."""
    import signal
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        ready = Path(folder) / "ready"
        command = ["-m", "meshplan.cli"] if after_s is not None else ["-c", _HOLD_IN_SEARCH, str(ready)]
        proc = subprocess.Popen(
            [sys.executable, *command, *argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            text=True,
            preexec_fn=_terminal_sigint,
        )
        if after_s is not None:
            time.sleep(after_s)
        else:
            deadline = time.monotonic() + 120.0
            while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    deadline = time.monotonic() + 5.0  # the resource tracker ends by itself once its parent has gone
    while True:
        left = [p.name for p in Path("/proc").glob("[0-9]*") if _group(p) == proc.pid]
        if not left or time.monotonic() > deadline:
            return proc.returncode, err, left
        time.sleep(0.2)


def _terminal_sigint() -> None:
    """SIGINT as a terminal's shell leaves it to the commands it starts: a runner that started this test in
    the background (``cmd &`` in a script) left it ignored, and an ignored SIGINT is inherited across exec."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _group(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


INTERRUPTED = (130, -2)
"""Exit 130, or killed by SIGINT after printing its line (a Ctrl-C that lands inside torch's import leaves
the interpreter to end by the signal): a shell shows 130 for both."""
needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc and process groups")


@needs_proc
def test_ctrl_c_during_a_search_is_one_line_and_130() -> None:
    argv = ["plan", "deepseek-v3", "--gpu", "h100-sxm", "--gpus", "16384", "--seq", "4096"]
    code, err, left = _interrupt([*argv, "--global-batch-tokens", "16777216"], after_s=None)
    assert code == 130 and err.strip() == "meshplan: interrupted", (code, err)
    assert left == []


@needs_proc
@pytest.mark.slow
def test_ctrl_c_during_check_leaves_no_process() -> None:
    pytest.importorskip("torch", reason="meshplan check needs the torch extra")
    code, err, left = _interrupt(["check", "--layouts", "ddp"], after_s=4.0)
    assert code in (0, *INTERRUPTED) and len(err.strip().splitlines()) <= 1, err  # 0: done before the signal
    assert left == []
