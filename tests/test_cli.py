"""The command-line contract: --json keys, tables, and one-line errors with exit code 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.cli import main


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_params_keys(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "params", "llama-3.1-8b")
    assert out["total_params"] == 8_030_261_248
    assert out["active_params_per_token"] == out["total_params"]
    assert sum(out["by_component"].values()) == out["total_params"]


def test_memory_keys(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(
        capsys,
        "memory",
        "llama-3.1-70b",
        "--gpu",
        "h100-sxm",
        "--gpus",
        "64",
        "--tp",
        "8",
        "--pp",
        "4",
        "--zero",
        "1",
        "--sp",
        "--recompute",
        "selective",
        "--seq",
        "8192",
    )
    per = out["per_gpu"]
    for key in ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "total_bytes"):
        assert key in per
    assert per["optimizer_bytes"] == per["master_weights_bytes"] + per["optimizer_moments_bytes"]
    assert out["hbm_bytes_per_gpu"] == 81_559 * 2**20 and isinstance(out["fits"], bool)
    assert len(out["stages"]) == 4 and out["per_gpu"] == out["stages"][out["heaviest_stage"]]
    assert out["layout"]["dp_shard"] == 2 and out["layout"]["dp_replicate"] == 1
    assert {t["name"] for t in out["terms"]} >= {"weights_bytes", "activations_bytes"}
    assert all(t["formula"] and t["source"] for t in out["terms"])


def test_fit_keys_match_the_seed_example(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "fit", "llama-3.3-70b", "--gpu", "h200", "--gpus", "8")
    assert out["weights_bytes_total"] == pytest.approx(141.1e9, rel=1e-3)
    assert out["weights_bytes_per_gpu_even_split"] == pytest.approx(out["weights_bytes_total"] / 8)
    hbm = 143_771 * 2**20  # what the driver reports for an H200: 150.75e9 bytes, more than the 141 GB marketed
    assert out["hbm_bytes_per_gpu"] == hbm and out["fits"]
    assert out["free_bytes_per_gpu"] == pytest.approx(hbm - out["weights_bytes_per_gpu_even_split"])
    budget = 0.9 * hbm  # fit keeps the planner's 10% of HBM free
    assert out["min_gpus_for_weights"] == 2  # 141.1 GB of weights over 0.9 x 150.75e9 bytes
    assert out["min_gpus_for_weights_split"]["weights_bytes_per_gpu"] <= budget
    # megatron-core's bf16 with fp32 main gradients: 18 bytes x 70.55B = 1.27 TB
    assert out["stack"] == "megatron-core" and out["precision"] == "bf16-fp32-grads"
    assert out["training_state_bytes_total"] == 18 * 70_553_706_496
    # the state alone needs 10 GPUs (1.27 TB over 0.9 x 150.75e9 bytes); with activations, nothing fits on one
    # node of 8, and the planner's fewest is whole nodes past one: 2 nodes
    assert -(-out["training_state_bytes_total"] // budget) == 10 and not out["training_fits"]
    assert out["min_gpus_for_training"] == 16
    assert [t["gpus"] for t in out["min_gpus_for_training_tried"]] == [1, 2, 4, 8, 16]
    bf16 = run_json(capsys, "fit", "llama-3.3-70b", "--gpu", "h200", "--gpus", "8", "--precision", "bf16")
    assert bf16["training_state_bytes_total"] == 16 * 70_553_706_496  # 16 bytes: 1.13 TB
    assert -(-bf16["training_state_bytes_total"] // budget) == 9  # the state alone: 9 GPUs
    assert bf16["differs_from_stack"] == ["precision"]


def test_serving_keys(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "serving", "llama-3.3-70b", "--gpu", "h200", "--gpus", "8", "--context", "8192")
    for key in (
        "kv_bytes_per_token_per_gpu",
        "weights_bytes_per_gpu",
        "kv_capacity_tokens_per_replica",
        "max_concurrent_sequences_total",
    ):
        assert key in out
    assert out["kv_bytes_per_token_per_gpu"] == 327_680 / 8
    assert out["kv_bytes_per_token_total"] == 327_680  # 80 layers x 2 x 8 KV heads x 128 x 2 bytes


def test_estimate_keys(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(
        capsys,
        "estimate",
        "llama-3.1-8b",
        "--gpu",
        "h100-sxm",
        "--gpus",
        "16",
        "--tp",
        "2",
        "--zero",
        "3",
        "--seq",
        "4096",
        "--global-batch",
        "64",
        "--tokens",
        "1e12",
    )
    for key in ("step_time_s", "mfu", "hfu", "tokens_per_s_per_gpu", "breakdown", "collectives", "per_gpu"):
        assert key in out
    b = out["breakdown"]
    total = b["compute_s"] + b["exposed_comm_s"] + b["bubble_s"] + b["optimizer_s"]
    assert total == pytest.approx(out["step_time_s"])
    assert 0 < out["mfu"] < 1 and out["hfu"] >= out["mfu"]
    for c in out["collectives"]:
        assert {"strategy", "op", "group_size", "size_bytes_per_call", "count_per_step", "link", "time_s_per_step",
                "exposed_s_per_step"} <= set(c)  # fmt: skip
        assert 0 <= c["exposed_s_per_step"] <= c["time_s_per_step"] + 1e-12
    assert out["time_to_train"]["wall_time_days"] > 0


def test_tp_across_nodes_warns(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(
        capsys,
        "estimate",
        "gpt3-175b",
        "--gpu",
        "h100-sxm",
        "--gpus",
        "16",
        "--tp",
        "16",
        "--zero",
        "1",
        "--seq",
        "2048",
        "--global-batch",
        "16",
    )
    assert any("TP=16" in w for w in out["warnings"])
    assert out["placement"]["tp"]["crosses_fabric"]


def test_collectives_shows_the_bandwidth_wall(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "collectives", "--model", "llama-3.1-70b")
    ratios = {r["link"]: r["ratio_bandwidth_only"] for r in out["links"]}
    assert ratios == pytest.approx({"nvlink5": 1, "nvlink4": 2, "ib-ndr": 18, "eth-100g": 72})
    assert out["tp_collectives_per_forward"] == 160  # 2 per layer, 80 layers


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["params", "no-such-model"], "unknown model"),
        (
            ["memory", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "64", "--tp", "16"],
            "tp=16 must divide num_kv_heads=8",
        ),
        (["memory", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "96", "--tp", "64"], "does not divide gpus"),
        (["memory", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "abc"], "--gpus: expected an integer, got 'abc'"),
        (["memory", "llama-3.1-8b", "--gpu", "h999", "--gpus", "8"], "unknown gpu"),
        (["memory", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "3"], "global_batch=3"),
        (["fit", "llama-3.1-8b", "--gpu", "h100-sxm"], "--gpus"),
        (["estimate", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--axis-order", "tp,xx"], "unknown axis"),
        (["params", "/no/such/config.json"], "config.json"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_console_script_start_up_and_exit_code() -> None:
    done = subprocess.run([sys.executable, "-m", "meshplan.cli", "params", "nope"], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr


TEXT_RUNS = {
    "params": ["params", "mixtral-8x7b"],
    "list": ["list", "gpus"],
    "stacks": ["stacks"],
    "fit": ["fit", "llama-3.3-70b", "--gpu", "h200", "--gpus", "8"],
    "memory": ["memory", "llama-3.1-8b", "--gpu", "a100-80gb", "--gpus", "8", "--zero", "3"],
    "serving": ["serving", "llama-3.1-8b", "--gpu", "l40s", "--gpus", "1"],
    "estimate": ["estimate", "llama-3.1-70b", "--gpu", "h100-sxm", "--gpus", "64", "--tp", "8", "--pp", "2"],
    "collectives": ["collectives"],
    "plan": ["plan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "16", "--seq", "4096",
             "--global-batch-tokens", "1048576", "--explain"],
    "recipe": ["recipe", "llama3-405b-8k", "--no-rank"],
    "validate": ["validate"],
    "calibrate": ["calibrate", str(Path(__file__).parent / "data" / "calibrate_runs.json")],
    "compare": ["compare", str(Path(__file__).parent / "data" / "traces" / "tiny-llama.toml"), "--gpu", "h100-sxm",
                "--gpus", "2", "--dp-shard", "2", "--zero", "3", "--seq", "16", "--global-batch", "4",
                "--trace", str(Path(__file__).parent / "data" / "traces" / "fsdp_rank0.trace.json")],
    "export": ["export", "torchtitan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--zero", "3"],
    "serve": ["serve", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "1", "--input-len", "500",
              "--output-len", "100", "--concurrency", "8"],
    "serve-plan": ["serve-plan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "2", "--input-len", "500",
                   "--output-len", "100", "--tpot-p99", "0.02"],
}  # fmt: skip
NOT_TEXT = {"ui", "check"}  # the server; the real-run check renders in tests/check/test_predict.py


def test_every_command_has_a_text_run() -> None:
    from meshplan.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) - NOT_TEXT == set(TEXT_RUNS)  # type: ignore[union-attr]


@pytest.mark.parametrize("command", sorted(TEXT_RUNS))
def test_tables_render(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, command: str
) -> None:
    """Every command's table (the CLI without --json) renders; `validate` renders the session's report (the golden
    tests compute it once) rather than a second minute-long run of every source."""
    if command == "validate":
        import meshplan.validation.training

        full = request.getfixturevalue("validation_report")
        monkeypatch.setattr(meshplan.validation.training, "validate", lambda source=None, profile=None: full)
    assert main(TEXT_RUNS[command]) == 0
    out = capsys.readouterr().out
    assert out.strip() and "Traceback" not in out


def test_plan_table_names_the_axes_that_cross_the_fabric(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(TEXT_RUNS["plan"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("#  layout"))
    assert lines[header].rstrip().endswith("across fabric")
    first = lines[header + 2]  # 16 GPUs are two NVLink domains: some axis must leave the node
    assert first.split()[-1] != "-" and set(first.split()[-1].split(",")) <= {"tp", "cp", "ep", "dp_shard",
                                                                           "dp_replicate", "pp"}  # fmt: skip


def test_export_keeps_an_explicit_tp_of_one_for_a_server(capsys: pytest.CaptureFixture[str]) -> None:
    """--tp 1 on 8 GPUs is eight replicas of one GPU each, not TP 8 (it was read as 'unset')."""
    base = ["export", "vllm", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8"]
    assert main([*base, "--tp", "1", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)["command"]
    assert "--tensor-parallel-size 1" in one and "--data-parallel-size 8" in one
    assert main([*base, "--json"]) == 0  # unset: one scale-up domain of 8
    assert "--tensor-parallel-size 8" in json.loads(capsys.readouterr().out)["command"]


def test_check_help_names_every_harness_layout(capsys: pytest.CaptureFixture[str]) -> None:
    """`meshplan check --help` lists every layout the harness runs, the on-request ones included."""
    from meshplan.reports.check import DEFAULT_LAYOUTS, HARNESS_LAYOUTS

    with pytest.raises(SystemExit):
        main(["check", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    named = {n.strip(",()") for n in text.replace(",", " ").split()}
    assert (set(HARNESS_LAYOUTS) - {"pp_gpipe", "pp_1f1b"}) | set(DEFAULT_LAYOUTS) <= named
