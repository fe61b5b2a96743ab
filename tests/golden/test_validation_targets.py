"""meshplan validate holds the step-time targets on published measured runs (regression bounds).

Targets (from the step-time issue, measured by `meshplan validate`):
- Korthikanti et al. 2022 Table 5, 8 iteration times: mean |error| <= 3%, max <= 7%
  (Calculon: 3.65% mean, 8.87% max on exactly these);
- Narayanan et al. 2021 Table 1, 10 throughputs: mean |error| <= 0.8 x that of the best single constant;
- Llama 3 Table 4, 3 MFUs: each within 3 points; both published drops with the right sign, within 2 points.
"""

import itertools
import math
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
RELEASED = ("fms_fsdp", "kempnerforge_mfu", "kempnerforge_weak", "megatron_moe_zoo", "qwen_lora", "torchtitan_h200")
"""The sources released with published_runs_3.json, added as they were typed, never used to set a constant."""

HELD_OUT_BOUNDS = {  # each a little above today's held-out error (meshplan validate): a regression fails
    # (the GEMM shape law moved Llama 3 1.5% -> 2.3% and torchtitan H100 5.5% -> 6.5%, the narrow GEMMs of their
    # TP 8 rows; llm-foundry A100 5.6% -> 4.7%, weak scaling 5.4% -> 4.9%, llm-foundry H100 7.6% -> 7.0%; then the
    # row-parallel output-gradient all-gather overlapped under userbuffers: weak scaling 4.9% -> 4.7%; then FP8's
    # share over the law's factor: DeepSeek-V3 4.6% -> 5.3% held out, its scale fitted on the others now 0.98;
    # then Megatron-Bridge's B200 MXFP8 DeepSeek-V3 row and its two GPT-OSS 120B rows, +42% to +43% each:
    # Megatron-Bridge 7.1% -> 13.3%; then PyTorch's sequence-parallel copies, FP8 gathers and per-op recompute
    # gathers moved torchtitan H100's TP rows, and the compute-scale grid went from 1.6% to 0.4% steps: the scale
    # fitted without llm-foundry H100 0.996 -> 0.988, its held-out error 7.0% -> 7.2%, its model unchanged)
    # (the released sources joined the fit: the compute scale fitted without BLOOM 0.996 -> 1.000, 7.7% -> 8.1%)
    "bloom": 0.085,
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
    # the released sources (published_runs_3.json), never used to set a constant: their held-out errors as they
    # joined (docs/validation.md, "Released sources, before they were used"), bounds a little above
    "fms_fsdp": 0.15,
    "kempnerforge_mfu": 0.12,
    "kempnerforge_weak": 0.145,
    "megatron_moe_zoo": 0.27,
    "qwen_lora": 0.225,
    "torchtitan_h200": 0.03,
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
    """catalog/held_out.toml (estimate's band) is the rule of validation/band.py on today's held-out residuals,
    re-derived here from the residuals and the layouts: per source its P10 and P90, then the k-th smallest P10
    and k-th largest P90 over the K sources, k = K + 1 - ceil(0.9 (K + 1)); a class of under 9 sources, and a
    layout no published run resembles (the unseen bounds), spans every held-out run and the every-run band."""
    import math

    from meshplan import io
    from meshplan.validation.training import held_out_band

    stored, now = io.held_out_band(), held_out_band(report)
    assert report["band"] == now  # validate carries the band it stores
    metric = {s["source"]: s["metric"] for s in report["sources"]}
    members = {
        None: lambda lay: True,
        "cp": lambda lay: lay.get("cp", 1) > 1,
        "ep": lambda lay: lay.get("cp", 1) == 1 and lay.get("ep", 1) > 1,
    }
    counts = {None: (258, 21), "cp": (17, 5), "ep": (12, 3)}
    widest: tuple[float, float] = (0.0, 0.0)
    for axis, member in members.items():
        by_source: dict[str, list[float]] = {}
        for s in report["held_out"]["sources"]:
            runs = [r for r in report["runs"] if r["source"] == s["source"]]
            for run, e in zip(runs, s["loso_residuals"], strict=True):
                if member(run["layout"]):
                    by_source.setdefault(s["source"], []).append(
                        1 / (1 + e) if metric[s["source"]].endswith("_s") else 1 + e
                    )
        k_sources = len(by_source)
        prefix = f"{axis}_" if axis else ""
        assert (stored[f"{prefix}runs"], stored[f"{prefix}sources"]) == counts[axis]
        assert sum(len(x) for x in by_source.values()) == counts[axis][0] and k_sources == counts[axis][1]
        k = k_sources + 1 - math.ceil(0.9 * (k_sources + 1) - 1e-9)
        assert stored[f"{prefix}promised"] == (k > 0)
        if k > 0:
            tenths = [
                statistics.quantiles(sorted(x), n=10, method="inclusive") if len(x) > 2 else [min(x)] * 8 + [max(x)]
                for x in by_source.values()
            ]
            lo, hi = sorted(t[0] for t in tenths)[k - 1], sorted(t[-1] for t in tenths)[-k]
        else:
            lo, hi = widest
        if axis is None:
            values = [r for x in by_source.values() for r in x]
            widest = (min(min(values), lo), max(max(values), hi))
            assert stored["unseen_time_ratio_p10"] == pytest.approx(widest[0], abs=0.005)
            assert stored["unseen_time_ratio_p90"] == pytest.approx(widest[1], abs=0.005)
            assert now["unseen_time_ratio_p10"] == pytest.approx(widest[0], rel=1e-12)
        key = f"{prefix}time_ratio"
        assert stored[f"{key}_p10"] == pytest.approx(lo, abs=0.005) and now[f"{key}_p10"] == pytest.approx(
            lo, rel=1e-12
        )
        assert stored[f"{key}_p90"] == pytest.approx(hi, abs=0.005) and now[f"{key}_p90"] == pytest.approx(
            hi, rel=1e-12
        )
        assert stored[f"{key}_p10"] < 1 < stored[f"{key}_p90"]
        if axis is not None:  # the class's median, every source weighing the same
            weighted = sorted((r, 1 / (k_sources * len(x))) for x in by_source.values() for r in x)
            cumulative = itertools.accumulate(w for _, w in weighted)
            median = next(r for (r, _), c in zip(weighted, cumulative, strict=True) if c >= 0.5 - 1e-12)
            assert stored[f"{key}_p50"] == pytest.approx(median, abs=0.005)
    # each source weighs the same: llm-foundry's 58 and 52 runs give one P10 and one P90 each, as BLOOM's one run
    # gives its ratio twice; and the every-run band is wider than the old pooled P10-P90 (0.913-1.073 on 212 runs)
    assert stored["time_ratio_p10"] < 0.9 and stored["time_ratio_p90"] > 1.2


def test_the_stored_mfu_range_is_the_published_runs_measured_mfu(report: dict) -> None:
    """catalog/published_mfu.toml (what estimate, recipe and plan hold their MFU to) re-derived from today's validate
    run: each run's measured MFU is its predicted MFU times predicted over measured step time (a rate's measured
    over predicted value), and, per GPU kind, class and matmul kind, the lowest, the highest, the runs, the sources
    and the run that measured the highest are the stored ones."""
    import tomllib
    from importlib import resources

    from meshplan.validation import training as v
    from meshplan.validation.mfu_range import published_mfu_range

    text = (resources.files("meshplan") / "catalog" / "published_mfu.toml").read_text(encoding="utf-8")
    stored = tomllib.loads(text)
    cells: dict[tuple[str, str, str], list[tuple[float, str, str]]] = {}
    for r in report["runs"]:
        ratio = r["predicted"] / r["measured"] if r["metric"].endswith("_s") else r["measured"] / r["predicted"]
        assert r["measured_mfu"] == pytest.approx(r["mfu"] * ratio, rel=1e-12)
        cp, ep = r["layout"].get("cp", 1), r["layout"].get("ep", 1)
        classes = [c for c, member in (("cp", cp > 1), ("ep", ep > 1), ("cp_ep", cp > 1 or ep > 1)) if member]
        for cls in classes or ["moe" if r["moe"] else "dense"]:
            cells.setdefault((r["gpu"], cls, r["matmul"]), []).append((r["mfu"] * ratio, r["source"], r["case"]))
    assert sum(len(kinds) for classes in stored.values() for kinds in classes.values()) == len(cells)
    for (gpu, cls, matmul), members in cells.items():
        cell = stored[gpu][cls][matmul]
        top = max(members)
        assert cell["mfu_max"] == pytest.approx(top[0], abs=5e-5) and cell["highest"] == f"{top[1]}: {top[2]}"
        assert cell["mfu_min"] == pytest.approx(min(m[0] for m in members), abs=5e-5)
        assert (cell["runs"], cell["sources"]) == (len(members), len({m[1] for m in members}))
    derived = published_mfu_range(report)
    assert {(g, c, m) for g in derived for c in derived[g] for m in derived[g][c]} == set(cells)
    for (gpu, cls, matmul), members in cells.items():
        assert derived[gpu][cls][matmul]["mfu_max"] == pytest.approx(max(members)[0], rel=1e-12)
    # one measured MFU from its FLOPs: Korthikanti et al.'s first row, a published iteration time
    data = v.sources()["korthikanti2022"]
    case = {**data.get("defaults", {}), **data["case"][0]}
    run = next(r for r in report["runs"] if r["source"] == "korthikanti2022" and r["case"] == case["id"])
    step = v._evaluate(case, run["layout"]).step
    measured = step.model_flops_per_step / (run["measured"] * step.num_gpus * step.bf16_peak_flops)
    assert run["measured_mfu"] == pytest.approx(float(measured), rel=1e-9)
    # the 70B-on-A100 warning's bound: no published A100 run measured above 65% in the reports' convention
    assert stored["a100-80gb"]["dense"]["16-bit"]["mfu_max"] < 0.65


RELEASED_RUNS = {
    "fms_fsdp": 8,
    "kempnerforge_mfu": 11,
    "kempnerforge_weak": 11,
    "megatron_moe_zoo": 9,
    "qwen_lora": 5,
    "torchtitan_h200": 2,
}


def test_the_released_sources_load_evaluate_and_stand_behind_the_band(report: dict) -> None:
    """Each released source's runs load and are predicted (a positive, finite value beside the published one), are
    held out once, and count among the sources behind the band validate reports and estimate prints."""
    from meshplan import io

    assert set(RELEASED_RUNS) == set(RELEASED)
    for name, count in RELEASED_RUNS.items():
        runs = [r for r in report["runs"] if r["source"] == name]
        assert len(runs) == count
        assert all(math.isfinite(r["predicted"]) and r["predicted"] > 0 and r["measured"] > 0 for r in runs)
        (held,) = [s for s in report["held_out"]["sources"] if s["source"] == name]
        assert len(held["loso_residuals"]) == count
    band = report["band"]
    for key in ("time_ratio_p10", "time_ratio_p90", "runs", "sources", "promised"):
        assert key in band and key in io.held_out_band()
    for axis in ("cp", "ep"):
        assert {f"{axis}_sources", f"{axis}_runs", f"{axis}_promised"} <= set(band)
    assert band["sources"] == len(report["sources"]) == 15 + len(RELEASED)
    assert band["runs"] == len(report["runs"]) == 212 + sum(RELEASED_RUNS.values())


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
    released = [s for s in report["scaling"] if s["source"] in RELEASED]
    steps = [s for s in report["scaling"] if s["source"] not in RELEASED]
    assert len(steps) == 32
    (titan,) = [s for s in steps if s["from_case"] == "T1 8B, 8 GPUs, FSDP"]
    assert (titan["gpus_from"], titan["gpus_to"]) == (8, 128)
    assert titan["measured_change"] == pytest.approx(5605 / 5762 - 1, rel=1e-12)
    gaps = [abs(s["predicted_change"] - s["measured_change"]) for s in steps]
    assert sum(g <= 0.05 for g in gaps) >= 27
    assert max(gaps) <= 0.11
    assert sum(gaps) / len(gaps) <= 0.03
    # the released sources' 13 steps (KempnerForge's two reports, torchtitan on H200), never fitted: all within 5
    # points but KempnerForge's 70B from 8 to 32 H200, published +28.9% a GPU where the model has -8.3% (its 8-GPU
    # run peaked at 128.5 of 140 GiB allocated, billed over HBM: docs/validation.md)
    assert len(released) == 13
    (worst,) = [s for s in released if abs(s["predicted_change"] - s["measured_change"]) > 0.05]
    assert (worst["source"], worst["gpus_from"], worst["gpus_to"]) == ("kempnerforge_weak", 8, 32)
    assert worst["measured_change"] == pytest.approx(18.09 / 14.03 - 1, rel=1e-9)  # the batch per GPU is fixed
