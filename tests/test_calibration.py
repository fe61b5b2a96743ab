"""Profiles and the shared-scale fit: what a scale does to a cluster, and that the fit recovers known scales."""

from __future__ import annotations

import math

import pytest

from meshplan.calibration import PERTURB, Sensitivity, fit, identified, predict
from meshplan.reports.inputs import resolve_cluster
from meshplan.spec.profile import Profile, apply_profile, dump_profile, load_profile


def test_identity_changes_nothing() -> None:
    cluster = resolve_cluster(gpu="h100-sxm", gpus=16)
    assert apply_profile(cluster, Profile()) is cluster


def test_scales_reach_the_constants_and_efficiency_stays_below_peak() -> None:
    cluster = resolve_cluster(gpu="a100-80gb", gpus=16)
    out = apply_profile(cluster, Profile(compute_scale=2.0, comm_scale=0.5))
    assert out.gpu.calibration.matmul_efficiency_max == 1.0  # 0.78 x 2 capped at peak
    assert out.scale_out.bandwidth_bytes_per_s == pytest.approx(cluster.scale_out.bandwidth_bytes_per_s / 2)
    assert out.scale_up.bandwidth_bytes_per_s == pytest.approx(cluster.scale_up.bandwidth_bytes_per_s / 2)


def test_profile_file_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "p.toml"
    path.write_text(dump_profile(Profile(compute_scale=0.9, comm_scale=1.3, source="x"), {"runs": 10}))
    assert load_profile(path) == Profile(compute_scale=0.9, comm_scale=1.3, source="x")
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
            d_compute=compute,
            d_comm=comm,
            rate=False,
        )
        runs.append(
            Sensitivity(
                source=r.source, case=r.case, measured=predict(r, truth), base=r.base, d_compute=compute,
                d_comm=comm, rate=False,
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
        Sensitivity(source="a", case=str(i), measured=1.0, base=1.0, d_compute=1.0, d_comm=0.0, rate=True)
        for i in range(3)
    ]
    assert identified(runs) == {"compute_scale": True, "comm_scale": False}
    assert math.isclose(PERTURB, 0.9)
