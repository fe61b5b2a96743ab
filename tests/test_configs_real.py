"""The engines' own example configs of Llama 3 8B / 70B (tests/data/configs, pinned in its README): ``estimate
--from FILE`` gives the estimate the flags a careful user types from reading the file give, number for number.

The careful user's flags are written here by hand from each file and its engine's documented defaults (the
comment beside each says which key gave which flag); only the ``conditions`` table's source labels may differ
(a value from the file is a given value, one the user left out is the stack's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meshplan.cli import main

DATA = Path(__file__).parent / "data" / "configs"

CASES = {
    "torchtitan_llama3_8b.toml": (
        ["--gpu", "a100-80gb", "--gpus", "64"],
        # [model] llama3 8B; [training] batch_size 1, seq_len 8192, compile false; [parallelism] shard -1 (FSDP over
        # all 64, reshard "default" = ZeRO-3 without PP); [activation_checkpoint] selective, op
        "llama-3.1-8b --gpu a100-80gb --gpus 64 --stack torchtitan --seq 8192 --micro-batch 1 --zero 3 "
        "--recompute selective --selective op --kernels eager",
    ),
    "torchtitan_llama3_70b.toml": (
        ["--gpu", "a100-80gb", "--gpus", "64"],
        # tensor_parallel_degree 8 (sequence parallel is torchtitan's default), local_batch_size 8, mode full
        "llama-3.1-70b --gpu a100-80gb --gpus 64 --stack torchtitan --tp 8 --sp --seq 8192 --micro-batch 8 --zero 3 "
        "--recompute full --kernels eager",
    ),
    "megatron_train_llama3_8b_h100_fp8.sh": (
        ["--gpu", "h100-sxm"],
        # 8 GPUs (torchrun), --sequence-parallel dropped with TP 1 (Megatron does), --use-distributed-optimizer,
        # --fp8-format hybrid with the default delayed recipe, --grad-reduce-in-bf16, --attention-backend fused
        "llama-3.1-8b --gpu h100-sxm --gpus 8 --stack megatron-core --seq 8192 --micro-batch 1 --global-batch 128 "
        "--zero 1 --precision fp8 --fp8-recipe delayed --grad-dtype bf16 --loss-fusion on --attention cudnn "
        "--overlap-dp on --overlap-param-gather on",
    ),
    "nemo_llama3_8b_pretrain.yaml": (
        ["--gpu", "h100-sxm"],
        # devices 8 x num_nodes 1, context_parallel_size 2, distributed optimizer, bf16-mixed with fp32 reduction
        "llama-3.1-8b --gpu h100-sxm --gpus 8 --stack nemo --cp 2 --seq 8192 --micro-batch 1 --global-batch 512 "
        "--zero 1 --precision bf16-fp32-grads",
    ),
    "nemo_llama3_70b_pretrain.yaml": (
        ["--gpu", "h100-sxm"],
        "llama-3.1-70b --gpu h100-sxm --gpus 32 --stack nemo --tp 4 --pp 4 --vpp 5 --cp 2 --sp --seq 8192 "
        "--micro-batch 1 --global-batch 512 --zero 1 --precision bf16-fp32-grads",
    ),
    "accelerate_fsdp.yaml": (
        ["llama-3.1-8b", "--gpu", "h100-sxm", "--seq", "4096"],
        # num_processes 2, FULL_SHARD (ZeRO-3) with FSDP1's flat parameters (fsdp_version absent), bf16 autocast,
        # layers wrapped one by one (TRANSFORMER_BASED_WRAP)
        "llama-3.1-8b --gpu h100-sxm --gpus 2 --stack fsdp2 --seq 4096 --zero 3 --precision fsdp2-bf16 "
        "--fsdp-copies off --zero3-unit layer",
    ),
    "deepspeed_llama_7b_single_node.json": (
        ["llama-2-7b", "--gpu", "a100-80gb", "--seq", "4096"],
        # train_batch_size 128 = 4 (micro) x 4 (accumulation) x 8 ranks; ZeRO-2 with overlap_comm; bf16
        "llama-2-7b --gpu a100-80gb --gpus 8 --stack deepspeed --seq 4096 --micro-batch 4 --global-batch 128 "
        "--zero 2 --precision bf16",
    ),
    "deepspeed_llama_70b_multi_node.json": (
        ["llama-3.1-70b", "--gpu", "h100-sxm", "--seq", "4096"],
        # 256 = 1 x 8 x 32 ranks; ZeRO-3; communication_data_type fp16 (OneBitAdam's state billed as AdamW's)
        "llama-3.1-70b --gpu h100-sxm --gpus 32 --stack deepspeed --seq 4096 --micro-batch 1 --global-batch 256 "
        "--zero 3 --precision bf16 --grad-dtype fp16",
    ),
}


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _without_labels(report: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in report.items() if k != "from_file"}
    out["conditions"] = {k: v["value"] for k, v in report["conditions"].items()}
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_from_gives_the_careful_users_estimate(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    extra, typed = CASES[name]
    read = _run(capsys, ["estimate", "--from", str(DATA / name), *extra])
    by_hand = _run(capsys, ["estimate", *typed.split()])
    assert _without_labels(read) == _without_labels(by_hand)
    assert read["step_time_s"] > 0 and read["per_gpu"]["total_bytes"] > 0
    assert read["from_file"]["file"].endswith(name)


def test_every_key_of_the_file_is_read_or_listed(capsys: pytest.CaptureFixture[str]) -> None:
    """Each key of the 70B torchtitan TOML is a value's source or a not-read row: none is dropped."""
    import tomllib

    data = tomllib.loads((DATA / "torchtitan_llama3_70b.toml").read_text())
    keys = {f"{section}.{key}" for section, table in data.items() for key in table}
    report = _run(
        capsys, ["estimate", "--from", str(DATA / "torchtitan_llama3_70b.toml"), "--gpu", "h100-sxm", "--gpus", "64"]
    )["from_file"]
    sources = " ".join(row["from"] for row in report["values"]) + " " + report["model"]["from"]
    listed = {row["key"] for row in report["not_read"]}
    missing = {k for k in keys if k not in listed and k not in sources}
    assert missing == set()
    assert "training.local_batch_size" in sources and "optimizer.lr" in listed


def test_a_typed_flag_overrides_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(DATA / "torchtitan_llama3_70b.toml")
    report = _run(capsys, ["estimate", "--from", path, "--gpu", "h100-sxm", "--gpus", "64", "--tp", "4"])
    assert report["layout"]["tp"] == 4
    row = next(r for r in report["from_file"]["values"] if r["field"] == "tp")
    assert row == {"field": "tp", "value": 4, "from": "flag (typed)", "file_had": 8}


def test_the_stack_defaults_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(DATA / "nemo_llama3_8b_pretrain.yaml")
    report = _run(capsys, ["estimate", "--from", path, "--gpu", "h100-sxm"])["from_file"]
    assert report["stack_defaults"]["stack"] == "nemo"
    assert report["stack_defaults"]["values"]["loss_fusion"] == "on"  # nemo.toml's, the file says nothing of it
    assert "zero" not in report["stack_defaults"]["values"]


def test_plan_compares_the_files_layout(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(DATA / "nemo_llama3_8b_pretrain.yaml")
    report = _run(capsys, ["plan", "--from", path, "--gpu", "h100-sxm", "--top", "1"])
    assert report["from_file"]["compared_layout"]["value"].startswith("tp=1,pp=1,cp=2")
    values = {r["field"]: r["value"] for r in report["from_file"]["values"]}
    assert values["global_batch_tokens"] == 512 * 8192


def test_serving_launch_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cmd = tmp_path / "serve.sh"
    cmd.write_text(
        "vllm serve meta-llama/Llama-3.1-70B --tensor-parallel-size 4 --max-model-len 8192 "
        "--gpu-memory-utilization 0.9 --max-num-seqs 128 --kv-cache-dtype fp8\n"
    )
    read = _run(
        capsys,
        [
            "serve",
            "--from",
            str(cmd),
            "--gpu",
            "h100-sxm",
            "--input-len",
            "1024",
            "--output-len",
            "256",
            "--concurrency",
            "64",
        ],
    )
    typed = _run(
        capsys,
        [
            "serve",
            "llama-3.1-70b",
            "--gpu",
            "h100-sxm",
            "--gpus",
            "4",
            "--tp",
            "4",
            "--engine",
            "vllm",
            "--gpu-memory-utilization",
            "0.9",
            "--max-batch",
            "128",
            "--kv-dtype",
            "fp8",
            "--input-len",
            "1024",
            "--output-len",
            "256",
            "--concurrency",
            "64",
        ],
    )
    provenance = read.pop("from_file")
    assert read == typed
    assert provenance["model"]["value"] == "llama-3.1-70b"  # the catalog model of the Hugging Face repository
    assert {"field": "context", "value": 8192, "why": "meshplan serve does not take it"} in provenance["not_used"]


def test_a_typed_model_overrides_the_files(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(DATA / "torchtitan_llama3_8b.toml")
    report = _run(capsys, ["memory", "llama-2-7b", "--from", path, "--gpu", "h100-sxm", "--gpus", "8"])
    assert report["model"] == "llama-2-7b"
    assert report["from_file"]["model"] == {"value": "llama-2-7b", "from": "MODEL (typed)", "file_had": "llama-3.1-8b"}
