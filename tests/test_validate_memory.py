"""``meshplan validate --memory`` as regression bounds: the published peak-memory figures (docs/validation.md).

Each bound is the error reached when it was set plus a small margin: a change to the bill that makes a source
worse fails here. The issue's targets: mean <= 8%, max <= 20%, each source below its best single constant.
"""

from __future__ import annotations

from typing import Any

import pytest

from meshplan import io
from meshplan.spec import requests
from meshplan.validation.memory import best_constant_error, case_values

# source: (mean |error| at most, max |error| at most)
# torchtitan_h100's max went 12.1% -> 14.6% when the loss-parallel cross-entropy's 16-byte peak was billed: its
# interleaved 1F1B row, already +11.7% (its 1F1B twin -9.6%), peaks on the last stage; the mean fell 4.3% -> 4.0%.
BOUNDS = {"korthikanti2022_figure1": (0.012, 0.03), "torchtitan_h100": (0.045, 0.15)}


@pytest.fixture
def result(memory_validation_report: dict[str, Any]) -> dict[str, Any]:
    """The session's report (tests/conftest.py): computed once for every test that reads it."""
    return memory_validation_report


@pytest.mark.parametrize("source", sorted(BOUNDS))
def test_error_bounds(source: str, result: dict[str, Any]) -> None:
    (row,) = [s for s in result["sources"] if s["source"] == source]
    mean, worst = BOUNDS[source]
    assert row["mean_abs_error"] <= mean and row["max_abs_error"] <= worst
    assert row["mean_abs_error"] < row["best_constant_error"]


RELEASED = {"kempnerforge_mfu": 11, "kempnerforge_weak": 11, "qwen_lora": 8, "torchtitan_h200": 2}
"""The released sources (published_runs_3.json) and their cases: reported, held to no target."""


def test_targets_hold(result: dict[str, Any]) -> None:
    r = result
    summary = r["summary"]
    assert summary["targeted_mean_abs_error"] <= 0.08 and summary["targeted_max_abs_error"] <= 0.20
    assert r["all_ok"]
    targeted = {s["source"] for s in r["sources"] if s["targets"]}
    assert targeted == set(BOUNDS)
    assert summary["targeted_cases"] == sum(s["cases"] for s in r["sources"] if s["targets"]) == 30


def test_released_sources_load_and_are_reported_without_targets(result: dict[str, Any]) -> None:
    """Each released source's memory cases load, are billed, and count in the all-cases mean, which is re-derived
    here; they carry no target (their errors are reported in docs/validation.md, never fitted)."""
    r = result
    released = {s["source"]: s for s in r["sources"] if not s["targets"]}
    assert {name: s["cases"] for name, s in released.items()} == RELEASED
    assert all(s["ok"] for s in released.values())
    errors = [abs(x["error"]) for x in r["runs"]]
    assert len(errors) == 30 + sum(RELEASED.values())
    assert r["summary"]["mean_abs_error"] == pytest.approx(sum(errors) / len(errors), rel=1e-12)
    assert all(x["predicted_gib"] > 0 and x["command"].startswith("meshplan memory ") for x in r["runs"])


def test_korthikanti_figure_1_activations_within_2_percent(result: dict[str, Any]) -> None:
    rows = [x for x in result["runs"] if x["source"] == "korthikanti2022_figure1" and x["metric"] == "activations"]
    assert len(rows) == 8 and all(abs(x["error"]) <= 0.025 for x in rows)


def test_llama3_405b_8k_names_the_saving_it_needs(result: dict[str, Any]) -> None:
    """Billed over 85.5e9 bytes under Megatron accounting with N = 16; the report names what closes the gap."""
    v16k, v8k, deepseek, *runs = result["verdicts"]
    assert not v16k["fits"] and 5e9 < v16k["over_bytes_per_gpu"] < 12e9
    assert any(s["closes_gap"] and "SwiGLU" in s["saving"] for s in v16k["savings"])
    assert any(s["closes_gap"] and s["saving"] == "both of the above" for s in v8k["savings"])
    # DeepSeek-V3 trained on 80 GB H800s: it fits with the recompute its report states (RMSNorm and the MLA
    # up-projections, Sec. 3.2.3; the MoE SwiGLU's output, Sec. 3.3.2), 99.5 GB without it
    assert deepseek["fits"] and 70e9 < deepseek["memory_bytes_per_gpu"] < deepseek["hbm_bytes_per_gpu"]
    assert "--recompute-modules layernorm,mla_up_proj,moe_act" in deepseek["command"]
    # every published run the throughput validation bills over HBM names a saving that closes its gap
    over = [v for v in runs if not v["fits"]]
    assert over and all(any(s["closes_gap"] for s in v["savings"]) for v in over)


def test_every_layout_billed_over_hbm_names_its_cause(result: dict[str, Any]) -> None:
    """Each trained layout billed over HBM names the term that puts it over (the bill's largest) and the first
    unstated condition listed that closes the gap alone."""
    from meshplan.validation.memory import BILL_TERMS

    over = [v for v in result["verdicts"] if not v["fits"]]
    assert len(over) >= 5
    for v in over:
        cause = v["cause"]
        assert f"{cause['term']}_bytes" in BILL_TERMS
        assert cause["term_bytes_per_gpu"] / cause["term_share"] == pytest.approx(v["memory_bytes_per_gpu"])
        assert cause["term_share"] > 1 / len(BILL_TERMS)  # the largest of the terms holds more than their mean
        first = next(s["saving"] for s in v["savings"] if s["bytes"] >= v["over_bytes_per_gpu"])
        assert cause["closed_by"] == first
    # the model zoo's long-context layouts (trained on 80 GB H100s, the moe module recomputed) are no longer billed
    # over HBM (124.8 GB, when the routed rows and the router inside Megatron's checkpoint were billed as kept):
    # tests/golden/test_validation_targets.py holds every run billed over HBM to this list
    assert not any("Qwen3-235B" in v["case"] for v in result["verdicts"])


def test_a_full_recompute_gelu_run_is_offered_only_savings_that_apply(result: dict[str, Any]) -> None:
    """Narayanan's ZeRO-3 530B rows recompute every layer of a GELU model: no SwiGLU product or norm output is
    kept to save, only the layer inputs (in FP8, or on the host)."""
    zero3 = next(v for v in result["verdicts"] if "530B on 640 GPUs" in v["case"])
    names = [s["saving"] for s in zero3["savings"]]
    assert len(names) == 2 and "FP8" in names[0] and "host memory" in names[1]


def test_cases_use_schema_names_only(result: dict[str, Any]) -> None:
    keys = {f.name for f in requests.FIELDS}
    for name in ("torchtitan_h100", "korthikanti2022_figure1"):
        for row in [x for x in result["runs"] if x["source"] == name]:
            assert row["command"].startswith("meshplan memory ")
    assert case_values({"gpu": "h100-sxm"}, {"model": "llama-3.1-8b", "gpus": 8, "id": "x"})["gpus"] == 8
    with pytest.raises(ValueError, match="unknown memory run key"):
        case_values({}, {"model": "llama-3.1-8b", "gpus": 8, "layout": {"tp": 2}})
    assert "stack" in keys and io.load_gpu("h100-sxm-96gb").hbm_bytes > 96e9


def test_best_constant_by_hand() -> None:
    # guessing 2 for (1, 2, 4): errors 1, 0, 0.5 -> 0.5; guessing 1: 0, 0.5, 0.75 -> 0.4167; 4: 3, 1, 0 -> 1.33
    assert best_constant_error([1.0, 2.0, 4.0]) == pytest.approx(1.25 / 3)


@pytest.mark.parametrize(
    ("source", "index"),
    [
        ("torchtitan_h100", 0),
        ("torchtitan_h100", 6),
        ("torchtitan_h100", 17),
        ("kempnerforge_weak", 5),
        ("qwen_lora", 7),
    ],
)
def test_a_case_command_typed_into_the_cli_bills_what_validate_billed(
    source: str, index: int, capsys: pytest.CaptureFixture[str], result: dict[str, Any]
) -> None:
    """The command each case prints (schema values as flags, spec.argv.flag_args) is the case: run through
    `meshplan memory`, it bills the heaviest stage validate billed (FSDP, TP x FSDP x PP, CP x TP x PP cases; a
    released source's TP x FSDP with bf16 state and unsynced gradients, and its Q-LoRA fine-tuning)."""
    import json
    import shlex

    from meshplan.cli import main

    row = [x for x in result["runs"] if x["source"] == source][index]
    assert main([*shlex.split(row["command"])[1:], "--json"]) in (0, None)
    typed = json.loads(capsys.readouterr().out)
    assert typed["per_gpu"]["total_bytes"] == pytest.approx(row["memory_bytes_per_gpu"], rel=1e-12)


def test_the_tp_rows_of_pytorch_stacks_are_billed_their_loss_and_sequence_parallel_inputs(
    result: dict[str, Any],
) -> None:
    """torchtitan's 70B at TP 8 (131,072 tokens a micro-batch) was 11% low before its loss-parallel cross-entropy
    was billed at 16 bytes a local logit (tests/test_loss_parallel_peak.py); KempnerForge's TP rows were 5-19% high
    before their sequence parallelism (kempnerforge/distributed/tensor_parallel.py) was typed."""
    rows = {(x["source"], x["case"]): x["error"] for x in result["runs"]}
    assert abs(rows[("torchtitan_h100", "T4 70B, 256 GPUs, FSDP 32 x TP 8")]) < 0.02
    kf_tp = [e for (src, case), e in rows.items() if src.startswith("kempnerforge") and "TP" in case]
    assert len(kf_tp) == 18 and max(abs(e) for e in kf_tp) < 0.05


def test_kempnerforge_tp_rows_keep_a_tp_share_of_each_checkpointed_input(
    result: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The 7B at TP 4 (4 sequences of 4,096 a micro-batch, full recompute): with its sequence parallelism typed,
    each of the 32 layers keeps a quarter of its bf16 input, 2 T h / 4, where without it every rank kept all of it,
    and the final norm (SequenceParallel too) a quarter of what it keeps; the head's gathered input and the loss
    are the same either way."""
    import json

    from meshplan.cli import main
    from meshplan.core.memory.activations import norm_bytes_per_token
    from meshplan.spec.workload import Framework

    (row,) = [x for x in result["runs"] if x["case"] == "7B, 4 GPUs, TP 4"]
    argv = row["command"].split()[1:]
    assert "--sp" in argv

    def bill(args: list[str]) -> dict[str, float]:
        assert main([*args, "--json"]) == 0
        return json.loads(capsys.readouterr().out)["per_gpu"]

    with_sp, without = bill(argv), bill([a for a in argv if a != "--sp"])
    tokens, hidden, layers, tp = 4 * 4096, 4096, 32, 4
    norm = norm_bytes_per_token(io.load_model("llama-3.1-8b"), act_bytes=2, framework=Framework.TORCH)
    saved_less = tokens * (layers * 2 * hidden + norm) * (1 - 1 / tp)
    assert without["activations_bytes"] - with_sp["activations_bytes"] == pytest.approx(saved_less, rel=1e-9)
    assert with_sp["logits_bytes"] == without["logits_bytes"] == pytest.approx(8 * tokens * 128256)
    assert with_sp["allocated_bytes"] / 2**30 == pytest.approx(row["predicted_gib"], rel=1e-9)
