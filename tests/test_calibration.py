"""Profiles and the shared-scale fit: what a scale does to a cluster, and that the fit recovers known scales."""

from __future__ import annotations

import math

import pytest

from meshplan.reports.inputs import resolve_cluster
from meshplan.spec.profile import Profile, apply_profile, dump_profile, load_profile, parse_profile
from meshplan.validation.fit import PERTURB, Sensitivity, fit, identified, predict


def test_identity_changes_nothing() -> None:
    cluster = resolve_cluster(gpu="h100-sxm", gpus=16)
    assert apply_profile(cluster, Profile()) is cluster


def test_scales_reach_the_constants_and_efficiency_stays_below_peak() -> None:
    cluster = resolve_cluster(gpu="a100-80gb", gpus=16)
    out = apply_profile(cluster, Profile(compute_scale=2.0, comm_scale=0.5))
    assert out.gpu.calibration.matmul_efficiency_max == 1.0  # 0.78 x 2 capped at peak
    assert out.scale_out.bandwidth_bytes_per_s == pytest.approx(cluster.scale_out.bandwidth_bytes_per_s / 2)
    assert out.scale_up.bandwidth_bytes_per_s == pytest.approx(cluster.scale_up.bandwidth_bytes_per_s / 2)


def test_attention_and_memory_scales_reach_their_constants_only() -> None:
    cluster = resolve_cluster(gpu="h100-sxm", gpus=16)
    cal = cluster.gpu.calibration
    out = apply_profile(cluster, Profile(attention_scale=1.5, memory_scale=2.0)).gpu.calibration
    assert out.matmul_efficiency_max == cal.matmul_efficiency_max
    assert out.attention_scale == pytest.approx(cal.attention_scale * 1.5)
    assert out.attention_efficiency == pytest.approx(cal.attention_efficiency * 1.5)
    assert out.hbm_efficiency == 1.0  # 0.8 x 2 capped at the bandwidth
    assert out.kernel_overhead_s == pytest.approx(cal.kernel_overhead_s / 2)
    both = apply_profile(cluster, Profile(compute_scale=0.5, attention_scale=1.5)).gpu.calibration
    assert both.attention_scale == pytest.approx(cal.attention_scale * 0.75)  # attention's scale is on top of compute's


def test_inline_profile_takes_every_scale_and_names_them_on_errors() -> None:
    got = parse_profile("attention_scale=0.8, memory-scale=1.1")
    assert (got.attention_scale, got.memory_scale, got.compute_scale) == (0.8, 1.1, 1.0)
    assert Profile(memory_scale=0.7).inline() == "memory_scale=0.7"
    with pytest.raises(ValueError, match="memory_scale"):
        parse_profile("hbm_scale=2")


def test_profile_file_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "p.toml"
    profile = Profile(compute_scale=0.9, comm_scale=1.3, attention_scale=1.2, memory_scale=0.7, source="x")
    path.write_text(dump_profile(profile, {"runs": 10}))
    assert load_profile(path) == profile
    path.write_text("compute_scale = 1.0\nbogus = 2\n")
    with pytest.raises(ValueError, match="bogus"):
        load_profile(path)


def _synthetic(truth: Profile, n: int) -> list[Sensitivity]:
    """Runs whose measured time is what the affine model gives at ``truth``: the fit must find it."""
    runs = []
    for i in range(n):
        compute, comm = 1.0 + 0.3 * (i % 4), 0.1 + 0.2 * (i % 3)
        r = Sensitivity(
            source=f"s{i % 3}",
            case=str(i),
            measured=0.0,
            base=compute + comm,
            slopes={"compute_scale": compute, "comm_scale": comm},
            rate=False,
        )
        runs.append(
            Sensitivity(
                source=r.source, case=r.case, measured=predict(r, truth), base=r.base, slopes=r.slopes, rate=False,
            )
        )  # fmt: skip
    return runs


def test_fit_recovers_known_scales() -> None:
    truth = Profile(compute_scale=0.8, comm_scale=0.6)
    got = fit(_synthetic(truth, 12))
    assert got.profile.compute_scale == pytest.approx(0.8, rel=0.02)
    assert got.profile.comm_scale == pytest.approx(0.6, rel=0.06)
    assert got.mean_abs_error < 0.01


def test_unidentified_scale_is_flagged() -> None:
    runs = [
        Sensitivity(
            source="a", case=str(i), measured=1.0, base=1.0, slopes={"compute_scale": 1.0, "comm_scale": 0.0}, rate=True
        )
        for i in range(3)
    ]
    assert identified(runs) == {"compute_scale": True, "comm_scale": False}
    assert math.isclose(PERTURB, 0.9)


def test_fit_of_three_scales_thins_its_grids_and_still_finds_them() -> None:
    truth = Profile(compute_scale=0.8, attention_scale=1.3, memory_scale=0.6)
    runs = []
    for i in range(12):
        slopes = {"compute_scale": 1.0 + 0.3 * (i % 4), "attention_scale": 0.2 * (i % 3), "memory_scale": 0.1 * (i % 5)}
        r = Sensitivity(source="s", case=str(i), measured=1.0, base=sum(slopes.values()), slopes=slopes, rate=False)
        runs.append(
            Sensitivity(source="s", case=str(i), measured=predict(r, truth), base=r.base, slopes=slopes, rate=False)
        )
    got = fit(runs, free=("compute_scale", "attention_scale", "memory_scale"))
    assert got.profile.compute_scale == pytest.approx(0.8, rel=0.05)
    assert got.profile.attention_scale == pytest.approx(1.3, rel=0.1)
    assert got.profile.memory_scale == pytest.approx(0.6, rel=0.1)
    assert got.profile.comm_scale == 1.0


def test_a_host_time_per_step_adds_to_every_step_in_estimate_and_plan_alike() -> None:
    """``step_overhead_s`` adds its seconds to the step, shows as its own term, moves nothing else, and the
    planner's steps carry it as estimate's do."""
    from meshplan.reports.estimate import estimate_report
    from meshplan.reports.inputs import LayoutRequest
    from meshplan.reports.plan import plan_report

    run = dict(gpu="h100-sxm", gpus=16, layout=LayoutRequest(tp=2), seq=4096, global_batch=32)
    base = estimate_report("llama-3.1-8b", **run)  # type: ignore[arg-type]
    slow = estimate_report("llama-3.1-8b", profile="step_overhead_s=0.25", **run)  # type: ignore[arg-type]
    assert base["breakdown"]["host_s"] == 0.0 and slow["breakdown"]["host_s"] == 0.25
    assert slow["step_time_s"] == pytest.approx(base["step_time_s"] + 0.25, abs=1e-12)
    others = {k: v for k, v in base["breakdown"].items() if k != "host_s"}
    assert {k: slow["breakdown"][k] for k in others} == others
    tokens = 32 * 4096
    assert slow["tokens_per_s_per_gpu"] == pytest.approx(tokens / (16 * (base["step_time_s"] + 0.25)), rel=1e-12)
    plans = plan_report("llama-3.1-8b", gpu="h100-sxm", gpus=16, seq=4096, global_batch_tokens=tokens, top=3)
    slowed = plan_report(
        "llama-3.1-8b",
        gpu="h100-sxm",
        gpus=16,
        seq=4096,
        global_batch_tokens=tokens,
        top=3,
        profile="step_overhead_s=0.25",
    )
    assert [p["layout"] for p in slowed["plans"]] == [p["layout"] for p in plans["plans"]]  # the ranking stands
    for a, b in zip(plans["plans"], slowed["plans"], strict=True):
        assert b["step_time_s"] == pytest.approx(a["step_time_s"] + 0.25, abs=1e-12)
    with pytest.raises(ValueError, match="step_overhead_s"):
        Profile(step_overhead_s=-0.1)


def test_profile_files_with_a_word_for_a_number_are_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "p.toml"
    path.write_text('compute_scale = "fast"\n')
    with pytest.raises(ValueError, match="compute_scale must be a number"):
        load_profile(path)
    path.write_text("step_overhead_s = 0.2\n")
    assert load_profile(path).step_overhead_s == 0.2
    assert parse_profile("step_overhead_s=0.2").inline() == "step_overhead_s=0.2"
