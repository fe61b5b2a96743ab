"""meshplan calibrate: a profile fitted from a user's own runs improves the prediction of that cluster's other
runs, and runs that cannot identify a constant are refused."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from meshplan.spec.profile import CONSTANTS, IDENTITY, Profile, dump_profile, load_profile
from meshplan.validation.calibrate import MeasuredRun, calibrate_report, fit_runs, load_runs, predict

TRUTH = Profile(compute_scale=0.8, comm_scale=0.5)
"""The hidden cluster: GPUs 20% below the catalog's efficiency, a network at half its bandwidth."""

SHAPES = [  # model, GPUs, tp, pp, micro-batch, sequence
    ("llama-3.1-8b", 8, 1, 1, 1, 4096), ("llama-3.1-8b", 16, 2, 1, 2, 4096), ("llama-3.1-8b", 32, 1, 1, 1, 8192),
    ("llama-3.1-8b", 64, 4, 1, 1, 8192), ("llama-3.1-70b", 64, 8, 2, 1, 4096), ("llama-3.1-70b", 128, 8, 4, 1, 4096),
    ("llama-3.1-70b", 256, 4, 4, 1, 8192), ("llama-2-13b", 16, 2, 1, 1, 4096), ("llama-2-13b", 32, 4, 1, 2, 4096),
    ("llama-2-7b", 8, 1, 1, 2, 4096), ("llama-2-70b", 64, 8, 1, 1, 4096), ("llama-3.1-8b", 128, 2, 1, 1, 8192),
    ("llama-2-13b", 64, 1, 1, 1, 4096), ("llama-3.1-70b", 512, 8, 8, 1, 8192),
]  # fmt: skip


def _args(model: str, gpus: int, tp: int, pp: int, mb: int, seq: int) -> tuple[str, ...]:
    dp = gpus // (tp * pp)
    out = [model, "--gpu", "h100-sxm", "--gpus", str(gpus), "--tp", str(tp), "--pp", str(pp), "--dp-shard", str(dp)]
    out += ["--zero", "1", "--micro-batch", str(mb), "--seq", str(seq), "--global-batch", str(dp * mb * 8)]
    return tuple(out + (["--sp"] if tp > 1 else []))


def _measured_on(truth: Profile, shapes: list[tuple[str, int, int, int, int, int]], metric: str) -> list[MeasuredRun]:
    """Synthetic measurements: the model's own prediction of each shape on a cluster of hidden profile ``truth``."""
    runs = [MeasuredRun(args=_args(*s), metric=metric, measured=1.0) for s in shapes]
    values = predict(runs, truth)
    return [MeasuredRun(args=r.args, metric=r.metric, measured=v) for r, v in zip(runs, values, strict=True)]


@pytest.fixture(scope="module")
def measured() -> list[MeasuredRun]:
    return _measured_on(TRUTH, SHAPES, "tokens_per_s_per_gpu")


def test_ten_runs_at_least_halve_the_error_on_the_others(measured: list[MeasuredRun]) -> None:
    train, test = measured[:10], measured[10:]
    profile, numbers = fit_runs(train)
    assert numbers["fitted"] == ["compute_scale", "comm_scale"]
    before = statistics.mean(abs(p / r.measured - 1) for r, p in zip(test, predict(test, IDENTITY), strict=True))
    after = statistics.mean(abs(p / r.measured - 1) for r, p in zip(test, predict(test, profile), strict=True))
    assert after <= before / 2, (before, after)
    assert profile.compute_scale == pytest.approx(TRUTH.compute_scale, rel=0.05)
    assert numbers["mean_abs_error_held_out"] < numbers["mean_abs_error_before"] / 2


def test_too_few_runs_are_refused(measured: list[MeasuredRun]) -> None:
    with pytest.raises(ValueError, match="at least 3"):
        fit_runs(measured[:2])


def test_runs_that_cannot_move_the_network_do_not_fit_it() -> None:
    """Single-GPU runs have no collective: the bandwidth scale is not identified and stays 1."""
    runs = [
        MeasuredRun(
            args=("llama-3.2-1b", "--gpu", "h100-sxm", "--gpus", "1", "--seq", str(seq), "--global-batch", "8"),
            metric="step_time_s",
            measured=1.0,
        )
        for seq in (1024, 2048, 4096)
    ]
    values = predict(runs, Profile(compute_scale=0.9))
    runs = [MeasuredRun(args=r.args, metric=r.metric, measured=v) for r, v in zip(runs, values, strict=True)]
    profile, numbers = fit_runs(runs)
    assert numbers["fitted"] == ["compute_scale"] and profile.comm_scale == 1.0


def test_report_writes_a_profile_file(tmp_path: Path, measured: list[MeasuredRun]) -> None:
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([{"args": list(r.args), "tokens_per_s_per_gpu": r.measured} for r in measured[:4]]))
    out = tmp_path / "profile.toml"
    report = calibrate_report(str(path), out=str(out))
    assert load_profile(out).compute_scale == pytest.approx(report["profile"]["compute_scale"], rel=1e-3)
    assert len(report["runs_detail"]) == 4


@pytest.mark.parametrize(
    ("runs", "needle"),
    [
        ({"args": ["x"]}, "list of runs"),
        ([{"args": ["llama-3.1-8b"], "step_time_s": 1, "tokens_per_s_per_gpu": 2}], "exactly one"),
        ([{"args": ["llama-3.1-8b"], "step_time_s": -1}], "step_time_s must be"),
        ([{"args": ["llama-3.1-8b"], "step_time_s": float("inf")}], "step_time_s' is not a finite number"),
        ([{"args": ["llama-3.1-8b"], "step_time_s": 1e300}], "step_time_s must be"),
        ([{"args": ["llama-3.1-8b"], "tokens_per_s_per_gpu": 1e-300}], "tokens_per_s_per_gpu must be"),
        ([{"args": ["llama-3.1-8b", "--help"], "step_time_s": 1}], "help"),
        ([{"args": ["llama-3.1-8b"], "step_time_s": 1, "peak_memory_bytes": float("nan")}], "peak_memory_bytes"),
        ([{"args": ["llama-3.1-8b"], "step_time_s": True}], "step_time_s must be"),
        ([{"args": ["llama-3.1-8b", "--profile", "p.toml"], "step_time_s": 1}], "--profile"),
        ([{"args": "llama-3.1-8b", "step_time_s": 1}], "args"),
        ([{"args": ["llama-3.1-8b"], "step_time_s": 1, "mfu": 0.4}], "unknown"),
    ],
)
def test_bad_runs_files_are_one_line_errors(tmp_path: Path, runs: object, needle: str) -> None:
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(runs))
    with pytest.raises(ValueError, match=needle):
        load_runs(path)


def test_runs_the_catalog_already_predicts_fit_nothing(measured: list[MeasuredRun]) -> None:
    """Measured exactly as the catalog predicts: no scale predicts them better held out, so none is fitted (a scale
    fitted anyway would only carry the other runs' noise)."""
    runs = [
        MeasuredRun(args=r.args, metric=r.metric, measured=v)
        for r, v in zip(measured[:6], predict(measured[:6], IDENTITY), strict=True)
    ]
    profile, numbers = fit_runs(runs)
    assert numbers["fitted"] == [] and profile.is_identity
    none = [c for c in numbers["held_out_by_choice"] if c["scales"] == []]
    assert none and none[0]["mean_abs_error_held_out"] == pytest.approx(0.0, abs=1e-12)


KERNELS = Profile(attention_scale=0.7, memory_scale=0.6)
"""A hidden cluster whose matmuls and network are as the catalog says, but whose attention kernel reaches 70% of
the catalog's share of peak and whose memory-bound kernels run at 60% of its speed (an older driver, eager ops)."""

KERNEL_SHAPES = [  # model, GPUs, tp, pp, micro-batch, sequence: small models and long sequences tell them apart
    ("llama-3.2-1b", 8, 1, 1, 4, 2048), ("llama-3.2-1b", 8, 1, 1, 1, 16384), ("mpt-3b", 8, 1, 1, 2, 4096),
    ("mpt-1b", 16, 2, 1, 1, 32768), ("llama-3.1-8b", 8, 1, 1, 1, 8192), ("llama-3.1-8b", 16, 2, 1, 1, 65536),
    ("llama-3.1-8b", 32, 1, 1, 2, 2048), ("llama-2-7b", 8, 1, 1, 4, 1024), ("llama-3.1-70b", 64, 8, 1, 1, 16384),
    ("llama-3.2-1b", 16, 1, 1, 8, 1024), ("llama-3.1-8b", 64, 4, 1, 1, 32768), ("mpt-760m", 8, 1, 1, 1, 8192),
    ("llama-2-13b", 16, 2, 1, 1, 4096), ("llama-3.1-70b", 128, 8, 2, 1, 8192),
]  # fmt: skip


def test_slow_attention_and_memory_bound_kernels_are_fitted_as_such() -> None:
    """From 10 runs of small models and long sequences the fit names the two scales that differ and halves the
    error on the other runs; the matmul and network scales stay at 1."""
    runs = _measured_on(KERNELS, KERNEL_SHAPES, "step_time_s")
    train, test = runs[:10], runs[10:]
    profile, numbers = fit_runs(train)
    assert numbers["fitted"] == ["attention_scale", "memory_scale"]
    assert profile.attention_scale == pytest.approx(KERNELS.attention_scale, rel=0.06)
    assert profile.memory_scale == pytest.approx(KERNELS.memory_scale, rel=0.06)
    assert profile.compute_scale == 1.0 and profile.comm_scale == 1.0
    before = statistics.mean(abs(p / r.measured - 1) for r, p in zip(test, predict(test, IDENTITY), strict=True))
    after = statistics.mean(abs(p / r.measured - 1) for r, p in zip(test, predict(test, profile), strict=True))
    assert before > 0.05 and after <= before / 2, (before, after)


def test_a_host_time_per_step_is_fitted_as_seconds_not_as_a_scale() -> None:
    """A cluster whose host adds 0.3 s to every step (data loading, logging) on GPUs 10% below the catalog: the
    fit takes the compute scale and the host time, finds both, and predicts the other runs to within 1%, where
    no pair of scales can (a fixed time weighs most on the shortest steps)."""
    runs = _measured_on(Profile(compute_scale=0.9, step_overhead_s=0.3), SHAPES, "tokens_per_s_per_gpu")
    train, test = runs[:10], runs[10:]
    profile, numbers = fit_runs(train)
    assert numbers["fitted"] == ["compute_scale", "step_overhead_s"]
    assert profile.compute_scale == pytest.approx(0.9, rel=0.03)
    assert profile.step_overhead_s == pytest.approx(0.3, rel=0.15)
    after = statistics.mean(abs(p / r.measured - 1) for r, p in zip(test, predict(test, profile), strict=True))
    assert after < 0.01
    held = {tuple(c["scales"]): c["mean_abs_error_held_out"] for c in numbers["held_out_by_choice"]}
    scales_only = min(v for k, v in held.items() if "step_overhead_s" not in k)
    assert numbers["mean_abs_error_held_out"] < scales_only / 2, held


def test_the_profiles_band_is_its_runs_held_out_and_estimate_prints_it(
    tmp_path: Path, measured: list[MeasuredRun]
) -> None:
    """On a cluster the fitted constants describe exactly, each run predicted with the profile fitted on the
    others lands within a few percent of its measurement: the band is narrow around 1. With a band of 0.7-1.3
    in the file, estimate's P10 and P90 are the step time times 0.7 and 1.3, and a profile without a band falls
    back to the published runs' band."""
    from meshplan.reports.estimate import estimate_report
    from meshplan.reports.inputs import LayoutRequest

    profile, numbers = fit_runs(measured[:10])
    assert 0.97 < numbers["time_ratio_p10"] <= numbers["time_ratio_p90"] < 1.03, numbers
    # the catalog alone: the hidden cluster is slower (compute 0.8, network 0.5), so measured over predicted > 1
    catalog_ratios = [v / r.measured for r, v in zip(measured, predict(measured, IDENTITY), strict=True)]
    assert min(catalog_ratios) > 1.05
    path = tmp_path / "p.toml"
    path.write_text(dump_profile(profile, {"runs": 10, "time_ratio_p10": 0.7, "time_ratio_p90": 1.3}))
    run = dict(gpu="h100-sxm", gpus=8, layout=LayoutRequest(), seq=4096, global_batch=32)
    out = estimate_report("llama-3.1-8b", profile=str(path), **run)  # type: ignore[arg-type]
    assert out["step_time_s_p10"] == pytest.approx(0.7 * out["step_time_s"], rel=1e-12)
    assert out["step_time_s_p90"] == pytest.approx(1.3 * out["step_time_s"], rel=1e-12)
    assert "profile's 10 runs" in out["uncertainty"]
    path.write_text(dump_profile(profile))  # no [fit] table: the published runs' band
    assert "published runs" in estimate_report("llama-3.1-8b", profile=str(path), **run)["uncertainty"]  # type: ignore[arg-type]
    path.write_text(dump_profile(profile, {"runs": 10, "time_ratio_p10": 1.3, "time_ratio_p90": 0.7}))
    with pytest.raises(ValueError, match="time_ratio_p10"):
        estimate_report("llama-3.1-8b", profile=str(path), **run)  # type: ignore[arg-type]


def test_the_band_is_a_prediction_interval_for_the_next_run() -> None:
    """Re-derived by hand for three runs: log ratios' mean and sample spread, Student's t at 0.90 for 2 degrees of
    freedom (1.886), widened by sqrt(1 + 1/3) for a next run; many runs tend to the normal's +-1.2816 sigma."""
    import math

    from meshplan.validation.calibrate import prediction_band

    ratios = [0.9, 1.0, 1.15]
    logs = [math.log(x) for x in ratios]
    half = 1.886 * statistics.stdev(logs) * math.sqrt(1 + 1 / 3)
    lo, hi = prediction_band(ratios)
    assert lo == pytest.approx(math.exp(statistics.mean(logs) - half), rel=1e-9)
    assert hi == pytest.approx(math.exp(statistics.mean(logs) + half), rel=1e-9)
    assert lo < min(ratios) and hi > max(ratios)  # three runs say little: the band is wider than they are
    many = [math.exp(0.1 * x) for x in (-1.0, 1.0) * 500]  # log sd 0.1
    lo, hi = prediction_band(many)
    assert math.log(hi) == pytest.approx(1.2816 * 0.1 * math.sqrt(1 + 1 / 1000) * math.sqrt(1000 / 999), rel=1e-3)


HOST_SHAPES = [  # model, GPUs, tp, micro-batch, sequence: small micro-batches under eager launches are host-bound
    ("llama-3.2-1b", 8, 1, 1, 512), ("llama-3.2-1b", 8, 1, 2, 1024), ("mpt-125m", 8, 1, 1, 2048),
    ("mpt-350m", 8, 2, 1, 1024), ("llama-3.1-8b", 8, 1, 1, 512), ("mpt-760m", 16, 1, 1, 512),
    ("llama-3.2-1b", 8, 4, 1, 2048), ("llama-3.1-8b", 16, 2, 1, 4096), ("llama-3.1-8b", 8, 1, 2, 2048),
    ("mpt-1b", 8, 1, 1, 1024), ("llama-2-7b", 16, 2, 1, 4096), ("mpt-125m", 16, 1, 4, 512),
    ("llama-3.2-1b", 32, 1, 1, 4096), ("mpt-3b", 8, 1, 1, 2048),
]  # fmt: skip
HOST = Profile(host_scale=0.6, step_overhead_s=0.03)
"""A hidden cluster whose hosts issue kernels at 60% of the catalog's speed and spend 30 ms a step beside them."""


def _host_runs() -> list[MeasuredRun]:
    runs = []
    for model, gpus, tp, mb, seq in HOST_SHAPES:
        args = [model, "--gpu", "h100-sxm", "--gpus", str(gpus), "--tp", str(tp), "--micro-batch", str(mb)]
        args += ["--seq", str(seq), "--global-batch", str(gpus // tp * mb * 4), "--launch", "eager"]
        runs.append(MeasuredRun(args=tuple(args), metric="step_time_s", measured=1.0))
    values = predict(runs, HOST)
    return [MeasuredRun(args=r.args, metric=r.metric, measured=v) for r, v in zip(runs, values, strict=True)]


def test_a_slow_host_is_fitted_as_the_per_layer_floor_not_as_a_per_step_constant() -> None:
    """Host-bound runs (micro-batch 1 or 2, eager launches): the host's speed moves them, so host_scale is
    identified, and the fit takes it with the per-step time, recovering both; the error on the other runs halves.
    Offered the per-step constant alone, the fit cannot reproduce the floor: a floor costs per layer and
    micro-batch, so it weighs differently on each run, which no one number of seconds per step does."""
    runs = _host_runs()
    train, test = runs[:10], runs[10:]
    profile, numbers = fit_runs(train)
    assert numbers["identified"]["host_scale"] and "host_scale" not in numbers["not_identified"]
    assert numbers["fitted"] == ["host_scale", "step_overhead_s"]
    assert profile.host_scale == pytest.approx(HOST.host_scale, rel=0.05)
    # within a grid step (the host time's grid steps 22%: fit.py GRIDS)
    assert profile.step_overhead_s == pytest.approx(HOST.step_overhead_s, rel=0.22)
    before = statistics.mean(abs(p / r.measured - 1) for r, p in zip(test, predict(test, IDENTITY), strict=True))
    after = statistics.mean(abs(p / r.measured - 1) for r, p in zip(test, predict(test, profile), strict=True))
    assert before > 0.2 and after <= before / 2, (before, after)
    no_floor, _ = fit_runs(train, offered=tuple(c for c in CONSTANTS if c != "host_scale"))
    stand_in = statistics.mean(abs(p / r.measured - 1) for r, p in zip(test, predict(test, no_floor), strict=True))
    assert stand_in > 3 * after, (stand_in, after)


def test_runs_no_host_binds_refuse_the_host_scale_and_say_why(measured: list[MeasuredRun]) -> None:
    """Large models at micro-batch 1-2 under the stack's default launch: the GPUs are the slower side in every
    layer, a 10% slower host moves no run, and host_scale is left at 1 with the reason."""
    profile, numbers = fit_runs(measured[:10])
    assert not numbers["identified"]["host_scale"] and profile.host_scale == 1.0
    assert "host-bound" in numbers["not_identified"]["host_scale"]
