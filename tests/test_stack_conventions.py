"""The run a report answers for is a real stack's, named in every report, and MFU is counted as the papers count it.

- Without ``--stack`` the stack is megatron-core (fp32 main gradients); ``--engine E`` takes E's stack; each report
  says which, and which flags depart from it.
- ``mfu`` is model FLOPs with causal attention over the dense bf16 peak, re-derived here by hand; ``hfu`` and
  ``mfu_fp8_peak`` are their own keys.
- ``plan --engine torchtitan`` scores layouts as torchtitan runs them, and its export says the same.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from meshplan import io
from meshplan.cli import main
from meshplan.reports.conditions import condition_names, conditions_of, overlap_of, precision_of, resolve
from meshplan.spec import requests
from meshplan.spec.workload import Overlap
from meshplan.units import DType
from meshplan.validation.training import case_values, sources

H100 = ["--gpu", "h100-sxm"]
PLAN_70B = ["plan", "llama-3.1-70b", *H100, "--gpus", "64", "--seq", "8192", "--global-batch-tokens", "4194304"]
PLAN_8B = ["plan", "llama-3.1-8b", *H100, "--gpus", "8", "--seq", "8192", "--global-batch-tokens", "1M"]
LAYOUT = ("tp", "pp", "vpp", "cp", "ep", "dp_shard", "dp_replicate", "zero", "micro_batch")

N_8B = 8_030_261_248
H, V, L = 4096, 128_256, 32
MATMUL_8B = N_8B - V * H - (2 * L + 1) * H  # the input lookup and the norms are not matmuls; the head is


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def layout_flags(layout: dict[str, Any]) -> list[str]:
    flags = [f"--{k.replace('_', '-')}={layout[k]}" for k in LAYOUT]
    flags += [f"--recompute={layout['recompute']}", f"--schedule={layout['schedule']}"]
    flags += [f"--cp-kind={layout['cp_kind']}"] + (["--sp"] if layout["sp"] else [])
    return flags


# --- 1. the default stack -------------------------------------------------------------------------------------------


def test_the_70b_plan_names_megatron_core_and_its_winner_fits_with_fp32_gradients(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    saved = tmp_path / "plan.json"
    plan = run_json(capsys, *PLAN_70B, "--top", "1", "--save", str(saved))
    assert plan["stack"] == "megatron-core" and plan["stack_source"] == "default"
    assert plan["differs_from_stack"] == []
    assert plan["conditions"]["precision"] == {"value": "bf16-fp32-grads", "source": "stack"}
    winner = plan["plans"][0]
    # the winner's bill is the one megatron-core gives with its gradients in fp32, and it fits
    args = ["memory", "llama-3.1-70b", *H100, "--gpus", "64", "--seq", "8192", "--global-batch", "512"]
    explicit = ["--stack", "megatron-core", "--grad-dtype", "fp32"]
    stated = run_json(capsys, *args, *layout_flags(winner["layout"]), *explicit)
    assert stated["per_gpu"]["total_bytes"] == pytest.approx(winner["per_gpu"]["total_bytes"], rel=1e-12)
    assert stated["fits"] and winner["per_gpu"]["total_bytes"] <= 0.9 * stated["hbm_bytes_per_gpu"]
    bf16 = run_json(capsys, *args, *layout_flags(winner["layout"]), "--precision", "bf16")
    assert winner["per_gpu"]["gradients_bytes"] == pytest.approx(2 * bf16["per_gpu"]["gradients_bytes"])
    assert bf16["differs_from_stack"] == ["precision"]
    # the text report names the stack on its first lines
    assert main([*PLAN_70B, "--top", "1"]) == 0
    head = capsys.readouterr().out.splitlines()[:4]
    assert any(line.startswith("stack: megatron-core (the default") for line in head)
    # and its Megatron export keeps the fp32 main gradients the plan was billed with
    export = run_json(capsys, "export", "megatron", "--from-plan", str(saved))
    assert "--accumulate-allreduce-grads-in-fp32" in export["command"]
    assert "--main-grads-dtype" not in export["command"]
    assert export["stack"] == "megatron-core"
    assert export["predicted"]["step_time_s"] == pytest.approx(winner["step_time_s"], rel=1e-9)


def test_bf16_gradients_are_exported_only_when_the_plan_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    saved = tmp_path / "plan.json"
    plan = run_json(capsys, *PLAN_8B, "--top", "1", "--precision", "bf16", "--save", str(saved))
    assert plan["differs_from_stack"] == ["precision"]
    export = run_json(capsys, "export", "megatron", "--from-plan", str(saved))
    assert "--main-grads-dtype bf16" in export["command"] and export["differs_from_stack"] == ["precision"]
    assert export["predicted"]["step_time_s"] == pytest.approx(plan["plans"][0]["step_time_s"], rel=1e-9)


@pytest.mark.parametrize(
    "argv",
    [
        ["memory", "llama-3.1-8b", *H100, "--gpus", "8", "--zero", "1", "--dp-shard", "8"],
        ["estimate", "llama-3.1-8b", *H100, "--gpus", "8", "--zero", "1", "--dp-shard", "8"],
        ["fit", "llama-3.1-8b", *H100, "--gpus", "8"],
        ["recipe", "megatron-gpt3-175b", "--no-rank"],
        ["export", "deepspeed", "llama-3.1-8b", *H100, "--gpus", "8", "--zero", "3"],
    ],
    ids=lambda argv: argv[0],
)
def test_every_training_report_names_its_stack(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, *argv)
    assert out["stack"] in requests.field("stack").choices and out["stack_source"] in ("default", "engine")
    assert isinstance(out["differs_from_stack"], list)
    assert main(argv) == 0
    assert "stack: " + out["stack"] in capsys.readouterr().out


def test_a_flag_equal_to_the_stacks_own_is_no_difference(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["fit", "llama-3.1-8b", *H100, "--gpus", "8"]
    assert run_json(capsys, *base, "--precision", "bf16-fp32-grads")["differs_from_stack"] == []
    tt = run_json(capsys, *base, "--stack", "torchtitan", "--precision", "bf16")
    assert tt["stack_source"] == "flag" and tt["differs_from_stack"] == ["precision"]
    assert tt["training_state_bytes_per_param"] == 16  # bf16 weights and grads, fp32 master and moments


def _old_default(values: dict[str, Any]) -> dict[str, Any]:
    """What a run without a stack resolved to before the default became megatron-core: its stated values, else the
    schema's defaults."""
    return {k: values[k] if values.get(k) is not None else requests.field(k).default for k in condition_names()}


def test_published_runs_that_named_no_stack_state_what_they_were_validated_with() -> None:
    """validate's numbers stay unchanged: each published run without a stack resolves, under megatron-core, to the
    conditions it had before (its file states the ones megatron-core would change)."""
    checked = 0
    for name, data in sources().items():
        for case in data["case"]:
            values = case_values({**data.get("defaults", {}), **case})
            if values.get("stack"):
                continue
            old, (new, block) = _old_default(values), resolve(values)
            assert block["stack"] == "megatron-core"
            where = f"{name}: {case['id']}"
            assert (old["framework"] or "megatron") == new["framework"] == "megatron", where
            # unset, Megatron's own loss is vocab-parallel: the same as megatron-core's stated "on"
            assert dataclasses.replace(conditions_of(old), loss_parallel=None) == dataclasses.replace(
                conditions_of(new), loss_parallel=None
            ), where
            assert conditions_of(new).loss_parallel is True, where
            assert Overlap(**overlap_of(old)) == Overlap(**overlap_of(new)), where
            assert precision_of(old["precision"], old) == precision_of(new["precision"], new), where
            checked += 1
    assert checked > 50


# --- 2. the MFU convention ------------------------------------------------------------------------------------------


def test_mfu_is_causal_over_the_bf16_peak_by_hand(capsys: pytest.CaptureFixture[str]) -> None:
    """Llama 3.1 8B, data parallel over 8 H100s, 8K tokens: 6 N_matmul + 6 L a (d_qk + d_v) s / 2 per token."""
    s, batch = 8192, 64
    argv = ["estimate", "llama-3.1-8b", *H100, "--gpus", "8", "--seq", str(s), "--global-batch", str(batch)]
    out = run_json(capsys, *argv)
    per_token = 6 * MATMUL_8B + 6 * L * 32 * (128 + 128) * s / 2
    peak = io.load_gpu("h100-sxm").peak(DType.BF16)
    assert peak == pytest.approx(989.4e12, rel=1e-3)
    assert out["mfu"] == pytest.approx(per_token * s * batch / (out["step_time_s"] * 8 * peak), rel=1e-12)
    assert out["hfu"] == pytest.approx(out["mfu"], rel=1e-12)  # cuDNN skips the masked half; nothing recomputed
    assert out["mfu_fp8_peak"] is None and "causal" in out["mfu_convention"] and "bf16 peak" in out["mfu_convention"]
    # unfused attention computes the whole s x s product; HFU counts it, MFU does not
    eager = run_json(capsys, *argv, "--attention", "eager")
    full = 6 * MATMUL_8B + 6 * L * 32 * (128 + 128) * s
    assert eager["hfu"] / eager["mfu"] == pytest.approx(full / per_token, rel=1e-12)
    # selective recompute runs the attention's forward again: a third of its (causal) FLOPs
    sel = run_json(capsys, *argv, "--recompute", "selective")
    assert sel["hfu"] / sel["mfu"] == pytest.approx(1 + (per_token - 6 * MATMUL_8B) / 3 / per_token, rel=1e-12)


def test_an_fp8_run_is_divided_by_the_bf16_peak_and_carries_its_fp8_figure(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "llama-3.1-8b", *H100, "--gpus", "8", "--seq", "8192", "--global-batch", "64"]
    bf16, fp8 = run_json(capsys, *argv), run_json(capsys, *argv, "--precision", "fp8")
    assert fp8["step_time_s"] < bf16["step_time_s"]
    # the same model FLOPs over the same peak: a faster step is a higher MFU, in proportion
    assert fp8["mfu"] / bf16["mfu"] == pytest.approx(bf16["step_time_s"] / fp8["step_time_s"], rel=1e-12)
    gpu = io.load_gpu("h100-sxm")
    assert fp8["mfu_fp8_peak"] == pytest.approx(fp8["mfu"] * gpu.peak(DType.BF16) / gpu.peak(DType.FP8), rel=1e-12)
    assert fp8["mfu_fp8_peak"] < bf16["mfu"] < fp8["mfu"]


def test_validation_compares_llama3_in_its_own_count() -> None:
    """Llama 3's published MFU is compared as before: whole-context attention over the bf16 peak (the numbers
    validate printed before the reports' MFU became causal; the 128K row's since the backward gathers K/V again:
    0.3961838808188329 before)."""
    from meshplan.validation.training import run_source

    predicted = [r.predicted for r in run_source("llama3")]
    assert predicted == pytest.approx([0.44111425799452947, 0.4075754554179624, 0.3905327897194382], rel=1e-12)


# --- 10. --engine implies its stack ---------------------------------------------------------------------------------


def test_plan_for_torchtitan_is_scored_under_torchtitan(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    saved = tmp_path / "plan.json"
    implied = run_json(capsys, *PLAN_8B, "--engine", "torchtitan", "--save", str(saved))
    stated = run_json(capsys, *PLAN_8B, "--engine", "torchtitan", "--stack", "torchtitan")
    assert implied["stack"] == stated["stack"] == "torchtitan"
    assert (implied["stack_source"], stated["stack_source"]) == ("engine", "flag")
    same = ("stack", "stack_source", "elapsed_s")
    assert {k: v for k, v in implied.items() if k not in same} == {k: v for k, v in stated.items() if k not in same}
    # the export's header is plan 1's prediction, and it runs what the plan's layout says
    best = implied["plans"][0]
    export = run_json(capsys, "export", "torchtitan", "--from-plan", str(saved))
    assert export["predicted"]["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-9)
    assert export["stack"] == "torchtitan" and export["stack_source"] == "engine"
    text = export["files"]["meshplan_torchtitan.py"]
    lay = best["layout"]
    assert f"data_parallel_shard_degree = {lay['dp_shard']}" in text
    assert f"context_parallel_degree = {lay['cp']}" in text
    for p in implied["plans"]:  # FSDP2 shards over dp_shard x cp: ZeRO-2 or 3 wherever that is over 1
        if p["layout"]["dp_shard"] * p["layout"]["cp"] > 1:
            assert p["layout"]["zero"] in (2, 3)


def test_zero_over_the_context_ranks_is_exported(capsys: pytest.CaptureFixture[str]) -> None:
    """ZeRO-1 over dp_shard x cp = 4 with dp_shard 1: Megatron's distributed optimizer; torchtitan refuses it (its
    FSDP2 shards over those ranks whatever the plan says)."""
    lay = ["--tp", "2", "--cp", "4", "--zero", "1", "--seq", "8192", "--global-batch", "8"]
    megatron = run_json(capsys, "export", "megatron", "llama-3.1-8b", *H100, "--gpus", "8", *lay)
    assert "--use-distributed-optimizer" in megatron["command"]
    refusals = {"0": "FSDP2 over the data and context-parallel ranks", "1": "shard only the optimizer state (ZeRO-1)"}
    for zero, why in refusals.items():
        argv = ["export", "torchtitan", "llama-3.1-8b", *H100, "--gpus", "8", "--tp", "2", "--cp", "4", "--zero", zero]
        assert main([*argv, "--cp-kind", "all-gather"]) == 2
        assert why in capsys.readouterr().err
    fsdp = run_json(capsys, "export", "torchtitan", "llama-3.1-8b", *H100, "--gpus", "8", "--tp", "2", "--cp", "4",
                    "--zero", "3", "--cp-kind", "all-gather")  # fmt: skip
    assert "fsdp_reshard_after_forward = 'always'" in fsdp["files"]["meshplan_torchtitan.py"]
