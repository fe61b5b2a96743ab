"""meshplan validate holds the step-time targets on published measured runs (regression bounds).

Targets (from the step-time issue, measured by `meshplan validate`):
- Korthikanti et al. 2022 Table 5, 8 iteration times: mean |error| <= 3%, max <= 7%
  (Calculon: 3.65% mean, 8.87% max on exactly these);
- Narayanan et al. 2021 Table 1, 10 throughputs: mean |error| <= 0.8 x that of the best single constant;
- Llama 3 Table 4, 3 MFUs: each within 3 points; both published drops with the right sign, within 2 points.
"""

import statistics
from pathlib import Path

import pytest

from meshplan.validation.training import best_constant_error


@pytest.fixture(scope="module")
def report(validation_report: dict) -> dict:
    return validation_report


def test_every_target_holds(report: dict) -> None:
    failed = [(s["source"], c) for s in report["sources"] for c in s["checks"] if not c["ok"]]
    assert not failed, failed
    assert report["all_ok"]


def test_korthikanti_bounds(report: dict) -> None:
    src = next(s for s in report["sources"] if s["source"] == "korthikanti2022")
    assert src["cases"] == 8
    assert src["mean_abs_error"] <= 0.03 and src["max_abs_error"] <= 0.07


def test_narayanan_beats_the_best_constant(report: dict) -> None:
    src = next(s for s in report["sources"] if s["source"] == "narayanan2021")
    runs = [r for r in report["runs"] if r["source"] == "narayanan2021"]
    assert len(runs) == 10
    constant = best_constant_error([r["measured"] for r in runs])
    assert constant == pytest.approx(0.0535, abs=0.002)  # the bar stated in the issue: about 5.4%
    assert src["mean_abs_error"] <= 0.8 * constant
    # and it predicts why larger models reach more: the largest beats the smallest
    by_case = {r["case"]: r["predicted"] for r in runs}
    assert by_case["1008.0B"] > by_case["1.7B"] * 1.1


def test_llama3_mfu_and_drops(report: dict) -> None:
    runs = {r["case"]: r for r in report["runs"] if r["source"] == "llama3"}
    for r in runs.values():
        assert abs(r["predicted"] - r["measured"]) <= 0.03
    base, more, long = runs["8K, 8,192 GPUs"], runs["8K, 16,384 GPUs"], runs["128K, 16,384 GPUs"]
    for a, b in ((base, more), (more, long)):
        got, want = b["predicted"] - a["predicted"], b["measured"] - a["measured"]
        assert got < 0 and abs(got - want) <= 0.02


@pytest.fixture(scope="module")
def held_out(report: dict) -> dict:
    return {s["source"]: s for s in report["held_out"]["sources"]}


def test_every_source_is_held_out_once(report: dict, held_out: dict) -> None:
    assert set(held_out) == {s["source"] for s in report["sources"]}
    for s in held_out.values():
        assert len(s["loso_residuals"]) == s["cases"]


# Regression bounds on the held-out errors as measured on this branch (docs/validation.md);
# the goals are reported by
# `meshplan validate` under "goals" and are not all met yet.
HELD_OUT_BOUNDS = {  # each a little above today's held-out error (meshplan validate): a regression fails
    # (the GEMM shape law moved Llama 3 1.5% -> 2.3% and torchtitan H100 5.5% -> 6.5%, the narrow GEMMs of their
    # TP 8 rows; llm-foundry A100 5.6% -> 4.7%, weak scaling 5.4% -> 4.9%, llm-foundry H100 7.6% -> 7.0%; then the
    # row-parallel output-gradient all-gather overlapped under userbuffers: weak scaling 4.9% -> 4.7%; then FP8's
    # share over the law's factor: DeepSeek-V3 4.6% -> 5.3% held out, its scale fitted on the others now 0.98;
    # then Megatron-Bridge's B200 MXFP8 DeepSeek-V3 row and its two GPT-OSS 120B rows, +42% to +43% each:
    # Megatron-Bridge 7.1% -> 13.3%; then PyTorch's sequence-parallel copies, FP8 gathers and per-op recompute
    # gathers moved torchtitan H100's TP rows, and the compute-scale grid went from 1.6% to 0.4% steps: the scale
    # fitted without llm-foundry H100 0.996 -> 0.988, its held-out error 7.0% -> 7.2%, its model unchanged)
    "bloom": 0.08,
    "deepseek_v3": 0.055,
    "korthikanti2022": 0.03,
    "llama3": 0.025,
    "narayanan2021": 0.032,
    "narayanan2021_table2": 0.015,
    "narayanan2021_zero3": 0.09,
    "torchtitan_a100": 0.02,
    "torchtitan_h100": 0.07,
    "megascale2024": 0.04,
    "megatron_bridge": 0.14,
    "nemo2407_h100": 0.03,
    "megatron_h100_weak": 0.048,
    "llm_foundry_a100": 0.05,
    "llm_foundry_h100": 0.073,
}


def test_tuned_interleaving_runs_on_the_stated_stack(report: dict) -> None:
    """A tuned vpp cuts each pipeline stage into whole layers unless the run file says its stack cuts unevenly
    (Megatron-LM 2021 and Megatron-Core r0.8 refuse a remainder): no prediction rests on a layout the stack refuses."""
    from meshplan.validation import training as v

    checked = 0
    for name, data in v.sources().items():
        for case in data["case"]:
            case = {**data.get("defaults", {}), **case}
            if "vpp" not in case.get("tune", []) or case.get("vpp_chunks", "whole-layers") == "any":
                continue
            run = next(r for r in report["runs"] if r["source"] == name and r["case"] == case["id"])
            pp, vpp = run["layout"].get("pp", 1), run["layout"].get("vpp", 1)
            assert v._model(case).num_layers % (pp * vpp) == 0, (name, case["id"], pp, vpp)
            checked += 1
    assert checked >= 25  # Narayanan Tables 1 and 2, the Megatron-Core weak-scaling table


@pytest.mark.parametrize("source", sorted(HELD_OUT_BOUNDS))
def test_held_out_error_does_not_regress(held_out: dict, source: str) -> None:
    assert held_out[source]["loso_mean_abs_error"] <= HELD_OUT_BOUNDS[source]


def test_llama3_held_out_beats_its_best_constant(held_out: dict) -> None:
    """H100's constants are no longer fitted on the Llama 3 rows alone: held out, they still predict them."""
    s = held_out["llama3"]
    assert s["loso_mean_abs_error"] < 0.8 * s["best_constant_error"]


def test_the_stored_band_is_the_current_one(report: dict) -> None:
    """catalog/held_out.toml (estimate's P10-P90) matches the held-out residuals of today's model."""
    from meshplan import io
    from meshplan.validation.training import held_out_band

    stored, now = io.held_out_band(), held_out_band(report)
    assert stored["runs"] == now["runs"]
    assert stored["time_ratio_p10"] == pytest.approx(now["time_ratio_p10"], abs=0.01)
    assert stored["time_ratio_p90"] == pytest.approx(now["time_ratio_p90"], abs=0.01)
    assert stored["time_ratio_p10"] < 1 < stored["time_ratio_p90"]
    # the runs with context parallelism, and those with expert parallelism but no CP: their own bands, re-derived
    # here from the residuals and the layouts
    metric = {s["source"]: s["metric"] for s in report["sources"]}
    members = {
        "cp": lambda lay: lay.get("cp", 1) > 1,
        "ep": lambda lay: lay.get("cp", 1) == 1 and lay.get("ep", 1) > 1,
    }
    for axis, count in (("cp", 14), ("ep", 6)):
        assert stored[f"{axis}_runs"] == now[f"{axis}_runs"] == count
        for q in ("p10", "p50", "p90"):
            assert stored[f"{axis}_time_ratio_{q}"] == pytest.approx(now[f"{axis}_time_ratio_{q}"], abs=0.01)
        mine = {(r["source"], r["case"]) for r in report["runs"] if members[axis](r["layout"])}
        ratios = []
        for s in report["held_out"]["sources"]:
            cases = [r["case"] for r in report["runs"] if r["source"] == s["source"]]
            for case, e in zip(cases, s["loso_residuals"], strict=True):
                if (s["source"], case) in mine:
                    ratios.append(1 / (1 + e) if metric[s["source"]].endswith("_s") else 1 + e)
        assert len(ratios) == count
        assert stored[f"{axis}_time_ratio_p50"] == pytest.approx(statistics.median(ratios), abs=0.01)
        assert stored[f"{axis}_time_ratio_p50"] > 1  # held out, the model runs fast on both


@pytest.mark.parametrize("index", range(10))
def test_narayanan_table_1_typed_as_a_user_would_gives_what_validate_gives(
    index: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each Narayanan et al. Table 1 row, as the `meshplan estimate` command its run file states (the 2021 stack's
    conditions as flags, the layout validate chose, the paper's model as a model file), has validate's step time."""
    import json

    from meshplan import io
    from meshplan.cli import main
    from meshplan.validation import training as v

    data = v.sources()["narayanan2021"]
    case = {**data.get("defaults", {}), **data["case"][index]}
    result = v.run_case("narayanan2021", case, data["source"]["metric"])
    path = tmp_path / "model.toml"
    path.write_text(io.model_to_toml(v._model(case)), encoding="utf-8")
    assert main([*v.estimate_args(case, result.layout, model=str(path)), "--json"]) in (0, None)
    typed = json.loads(capsys.readouterr().out)
    want = v._evaluate(case, result.layout)
    assert typed["step_time_s"] == pytest.approx(float(want.step.step_time_s), rel=1e-9)
    assert typed["per_gpu"]["total_bytes"] == pytest.approx(float(want.memory.per_gpu.total_bytes), rel=1e-9)


@pytest.mark.parametrize("name", sorted(__import__("meshplan.validation.training", fromlist=["sources"]).sources()))
def test_each_source_typed_as_a_user_would_gives_what_validate_gives(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first run of every source, as the `meshplan estimate` command its run file states (every condition and
    fleet field as a flag: the fabric, its NICs per node, the stack's switches), has validate's step time."""
    import json

    from meshplan import io
    from meshplan.cli import main
    from meshplan.validation import training as v

    data = v.sources()[name]
    case = {**data.get("defaults", {}), **data["case"][0]}
    result = v.run_case(name, case, data["source"]["metric"])
    model = None
    if case.get("model_overrides"):
        model = tmp_path / "model.toml"
        model.write_text(io.model_to_toml(v._model(case)), encoding="utf-8")
    assert main([*v.estimate_args(case, result.layout, model=str(model) if model else None), "--json"]) in (0, None)
    typed = json.loads(capsys.readouterr().out)
    assert typed["step_time_s"] == pytest.approx(float(v._evaluate(case, result.layout).step.step_time_s), rel=1e-9)


def test_every_published_run_billed_over_hbm_has_its_verdict(report: dict) -> None:
    """A run that trained but is billed over HBM is listed in validate_memory.RUNS_OVER_HBM, whose verdicts name the
    saving that would close the gap (`meshplan validate --memory`): none is shown failing without its reason."""
    from meshplan.validation.memory import RUNS_OVER_HBM

    over = {(r["source"], r["case"]) for r in report["runs"] if not r["fits"]}
    covered = set(RUNS_OVER_HBM) | {("llama3", "8K, 8,192 GPUs"), ("llama3", "8K, 16,384 GPUs")}  # PUBLISHED_LAYOUTS
    assert over <= covered, over - covered


def test_the_fall_of_per_gpu_throughput_with_fleet_size(report: dict) -> None:
    """Runs alike but for the fleet size (and the batch, micro-batch and data parallelism that follow it), step by
    step: torchtitan's 8B FSDP from 8 to 128 H100s published 5,762 and 5,605 tokens/s per GPU (-2.7%, re-derived
    here). Today 27 of the 32 steps are within the issue's 5 points, 2.8 points off on average; the worst are two
    DeepSpeed ZeRO-3 steps (published falls of 39% and 51%, predicted 29% and 40%), MPT-760M and MPT-30B from 8 to 16
    H100s, and MegaScale from 6,144 to 8,192 GPUs."""
    steps = report["scaling"]
    assert len(steps) == 32
    (titan,) = [s for s in steps if s["from_case"] == "T1 8B, 8 GPUs, FSDP"]
    assert (titan["gpus_from"], titan["gpus_to"]) == (8, 128)
    assert titan["measured_change"] == pytest.approx(5605 / 5762 - 1, rel=1e-12)
    gaps = [abs(s["predicted_change"] - s["measured_change"]) for s in steps]
    assert sum(g <= 0.05 for g in gaps) >= 27
    assert max(gaps) <= 0.11
    assert sum(gaps) / len(gaps) <= 0.03
