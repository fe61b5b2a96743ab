"""Files a user names, in and out: every input file goes through the one guarded reader (meshplan/files.py) and
every output file through the one safe writer; nonsense fits, abbreviated flags, other scripts' digits and bad
check flags are refused. Each refusal is exit code 2 and one line on stderr, with nothing written.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.cli import main
from meshplan.files import write_text_safely

ROOT = Path(__file__).resolve().parents[1]
ESTIMATE = ("estimate", "llama-3.2-1b", "--gpu", "h100-sxm", "--gpus", "8")
PLAN = ("plan", "llama-3.2-1b", "--gpu", "h100-sxm", "--gpus", "8", "--seq", "4096", "--global-batch-tokens", "65536")
SERVE_PLAN = ("serve-plan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--input-len", "1000")
SERVE_PLAN += ("--output-len", "100")
EXPORT = ("export", "megatron", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8")
RUN = ["llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8"]
from test_hostile_inputs import refused  # noqa: E402  (tests/ is on the path, as pytest puts it)

GPU_TOML = (ROOT / "meshplan" / "catalog" / "gpus" / "h100-sxm.toml").read_text()


def runs_file(tmp_path: Path, measured: tuple[float, ...] = (0.5, 0.52, 0.55)) -> Path:
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([{"args": RUN, "step_time_s": value} for value in measured]))
    return path


# --- reading: every input file through the one guarded reader --------------------------------------------------


@pytest.mark.parametrize("flag", ["calibrate", "--profile"])
def test_dev_zero_is_refused_unread(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    argv = ["calibrate", "/dev/zero"] if flag == "calibrate" else [*ESTIMATE, "--profile", "/dev/zero"]
    assert "/dev/zero is not a regular file" in refused(capsys, *argv)


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """In a process of its own, killed after a minute: a FIFO that blocked would fail the test, not hang it."""
    fifo = tmp_path / "runs.json"
    os.mkfifo(fifo)
    cases = [["calibrate", str(fifo)], [*ESTIMATE, "--profile", str(fifo)], ["validate", "--profile", str(fifo)]]
    script = f"from meshplan.cli import main; print([main(argv) for argv in {cases!r}])"
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert done.stdout.strip() == "[2, 2, 2]", done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 3 and all(line.endswith("is not a regular file") for line in lines), lines


def test_a_fifo_is_never_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file's type is checked before it is opened: not even a non-blocking open reaches a FIFO."""
    from meshplan import files

    fifo = tmp_path / "p.toml"
    os.mkfifo(fifo)
    opened: list[str] = []
    real_open = os.open
    monkeypatch.setattr(files.os, "open", lambda p, *a, **k: opened.append(str(p)) or real_open(p, *a, **k))
    with pytest.raises(ValueError, match="not a regular file"):
        files.load_toml_file(fifo, what="profile")
    assert opened == []


def test_deep_nesting_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    deep_json, deep_toml, shallow = tmp_path / "runs.json", tmp_path / "p.toml", tmp_path / "q.toml"
    deep_json.write_text("[" * 100_000 + "]" * 100_000)
    deep_toml.write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    shallow.write_text("source = 'x'\n[fit]\nruns = " + "[" * 70 + "1" + "]" * 70 + "\n")  # parses; over 64 deep
    assert "too deeply" in refused(capsys, "calibrate", str(deep_json))
    assert "too deeply" in refused(capsys, *ESTIMATE, "--profile", str(deep_toml))
    assert "more than 64 deep" in refused(capsys, *ESTIMATE, "--profile", str(shallow))


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("compute_scale = inf\n", "'compute_scale' is not a finite number"),
        ("compute_scale = nan\n", "'compute_scale' is not a finite number"),
        ("comm_scale = 1e400\n", "'comm_scale' is not a finite number"),
        ("memory_scale = 1" + "0" * 400 + "\n", "'memory_scale' is an integer beyond 64 bits"),
        ("[fit]\nruns = inf\ntime_ratio_p10 = 0.9\ntime_ratio_p90 = 1.1\n", "'fit.runs' is not a finite number"),
        ("[fit]\nruns = 1" + "0" * 30 + "\ntime_ratio_p10 = 0.9\ntime_ratio_p90 = 1.1\n", "beyond 64 bits"),
        ("[fit]\nruns = 4\ntime_ratio_p10 = 1.7e-13\ntime_ratio_p90 = 2.2e13\n", "spans more than 100x"),
        ("[fit]\nruns = 4\ntime_ratio_p10 = 150\ntime_ratio_p90 = 160\n", "over 100x from the prediction"),
    ],
)
def test_profile_numbers_out_of_range_are_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, needle: str
) -> None:
    path = tmp_path / "p.toml"
    path.write_text(text)
    line = refused(capsys, *ESTIMATE, "--profile", str(path))
    assert needle in line and "p.toml" in line


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[{"args": ["llama-3.1-8b"], "step_time_s": 1e999}]', "'[0].step_time_s' is not a finite number"),
        ('[{"args": ["llama-3.1-8b"], "step_time_s": Infinity}]', "'[0].step_time_s' is not a finite number"),
        ('[{"args": ["x"], "step_time_s": 1, "peak_memory_bytes": 1' + "0" * 400 + "}]", "beyond 64 bits"),
    ],
)
def test_runs_numbers_out_of_range_are_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, needle: str
) -> None:
    path = tmp_path / "runs.json"
    path.write_text(text)
    assert needle in refused(capsys, "calibrate", str(path))


# --- writing: the one safe writer -------------------------------------------------------------------------------


def test_an_input_is_never_overwritten(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 512, "num_attention_heads": 8}))
    before = config.read_bytes()
    plan = ("plan", str(config), *PLAN[2:])
    for extra in ([], ["--force"]):
        assert "a file this command reads" in refused(capsys, *plan, "--save", str(config), *extra)
        assert "a file this command reads" in refused(capsys, *plan, "--save", str(tmp_path / "." / "config.json"))
    os.link(config, tmp_path / "hard.json")  # another name for the same file
    assert "a file this command reads" in refused(capsys, *plan, "--save", str(tmp_path / "hard.json"), "--force")
    assert config.read_bytes() == before
    gpu = tmp_path / "gpu.toml"
    gpu.write_text(GPU_TOML)
    with_gpu = (*PLAN[:3], str(gpu), *PLAN[4:])
    assert "a file this command reads" in refused(capsys, *with_gpu, "--save", str(gpu), "--force")
    assert gpu.read_text() == GPU_TOML


def test_calibrate_never_overwrites_its_runs_or_a_run_s_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    runs = runs_file(tmp_path)
    before = runs.read_bytes()
    assert "a file this command reads" in refused(capsys, "calibrate", str(runs), "--out", str(runs), "--force")
    assert runs.read_bytes() == before
    gpu = tmp_path / "gpu.toml"  # a file a run's arguments read is an input too
    gpu.write_text(GPU_TOML)
    runs.write_text(json.dumps([{"args": [*RUN[:2], str(gpu), *RUN[3:]], "step_time_s": v} for v in (0.5, 0.6, 0.7)]))
    assert "a file this command reads" in refused(capsys, "calibrate", str(runs), "--out", str(gpu), "--force")
    assert gpu.read_text() == GPU_TOML


def test_a_symlink_is_never_written_through(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target, link = tmp_path / "elsewhere.json", tmp_path / "plan.json"
    link.symlink_to(target)
    for argv in (PLAN, SERVE_PLAN):
        assert "symbolic link" in refused(capsys, *argv, "--save", str(link), "--force")
    assert not target.exists() and link.is_symlink()
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "launch.sh").symlink_to(target)
    assert "symbolic link" in refused(capsys, *EXPORT, "--out", str(folder), "--force")
    assert not target.exists() and sorted(p.name for p in folder.iterdir()) == ["launch.sh"]


@pytest.mark.parametrize("command", ["plan", "serve-plan", "calibrate", "export"])
def test_an_existing_file_needs_force_and_is_then_replaced_whole(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    if command == "export":
        existing, argv = out / "launch.sh", [*EXPORT, "--out", str(out)]
    else:
        existing = out / "result.txt"
        base = {"plan": PLAN, "serve-plan": SERVE_PLAN, "calibrate": ("calibrate", str(runs_file(tmp_path)))}[command]
        argv = [*base, "--out" if command == "calibrate" else "--save", str(existing)]
    existing.write_text("mine\n")
    existing.chmod(0o640)
    inode = existing.stat().st_ino
    assert "exists; add --force to replace it" in refused(capsys, *argv)
    assert existing.read_text() == "mine\n"  # nothing written
    assert main([*argv, "--force"]) == 0
    capsys.readouterr()
    assert existing.read_text() != "mine\n" and existing.stat().st_ino != inode  # a new file renamed over the old
    assert stat.S_IMODE(existing.stat().st_mode) == 0o640  # with the permissions the old one had
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_the_writer_leaves_nothing_behind_when_it_fails(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"the folder .* does not exist"):
        write_text_safely(tmp_path / "no" / "f.txt", "x", what="--save")
    (tmp_path / "d").mkdir()
    with pytest.raises(ValueError, match="is a folder"):
        write_text_safely(tmp_path / "d", "x", what="--save", force=True)
    assert write_text_safely(tmp_path / "f.txt", "x", what="--save").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "f.txt"]


# --- nonsense with exit 0 ---------------------------------------------------------------------------------------


def test_contradictory_runs_fit_no_profile(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """One setup measured at a microsecond, a second and eleven days: before, a band of 1.7e-13 to 2.2e13."""
    runs = runs_file(tmp_path, (1e-6, 1.0, 1e6))
    line = refused(capsys, "calibrate", str(runs), "--out", str(tmp_path / "p.toml"))
    assert "fit no profile" in line and "spans more than 100x" in line
    assert not (tmp_path / "p.toml").exists()


# --- flags --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ("calibrate", "runs.json", "--hel"),
        (*PLAN, "--sav", "p.json"),
        (*ESTIMATE, "--micro", "2"),
        ("list", "--js", "models"),
    ],
)
def test_an_abbreviated_flag_is_unknown(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]) -> None:
    assert "unrecognized arguments" in refused(capsys, *argv)


@pytest.mark.parametrize("digits", ["٨", "８", "৮", "1٠"])
def test_only_ascii_digits_are_numbers(capsys: pytest.CaptureFixture[str], digits: str) -> None:
    assert "ASCII digits" in refused(capsys, "memory", "llama-3.2-1b", "--gpu", "h100-sxm", "--gpus", digits)
    assert "ASCII digits" in refused(capsys, *ESTIMATE, "--seq", digits + "k")


def test_layer_types_must_be_a_list_of_one_string_per_layer() -> None:
    from meshplan.hf import model_from_hf_config

    config = {"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2}
    config |= {"intermediate_size": 128, "vocab_size": 1000, "sliding_window": 4}
    config |= {"use_sliding_window": True}
    kinds = ["sliding_attention", "full_attention"]
    assert model_from_hf_config(config | {"layer_types": kinds}, name="t").num_sliding_layers == 1
    for bad, got in (({"0": "sliding_attention", "1": "full_attention"}, "got dict"), (kinds * 2, "got a list of 4")):
        with pytest.raises(ValueError, match=f"'layer_types' must be a list of 2 strings.*{got}"):
            model_from_hf_config(config | {"layer_types": bad}, name="t")


def test_check_refuses_bad_flags_before_importing_torch() -> None:
    """Each refusal comes from meshplan.check.shapes alone: torch (seconds to import) is never loaded."""
    script = """
import sys
from meshplan.cli import main
cases = [["--heads", "5"], ["--kv-heads", "3"], ["--kv-heads", "16"], ["--hidden", "24", "--heads", "8"],
         ["--world-size", "3", "--layouts", "tp"], ["--world-size", "2", "--layouts", "fsdp_tp"],
         ["--layouts", "zero3"], ["--world-size", "1000"], ["--seq", "100000000"]]
codes = [main(["check", *case]) for case in cases]
assert codes == [2] * len(cases), codes
assert "torch" not in sys.modules, "torch was imported"
print("ok")
"""
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 9 and all(line.startswith("meshplan") for line in lines), lines
    assert "heads=5 must divide hidden=32" in lines[0] and "num_kv_heads=3 must divide num_heads=8" in lines[1]
    assert "head_dim=3 must be even" in lines[3] and "does not fit world size 3" in lines[4]
