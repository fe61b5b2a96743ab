"""The host floor (core/time/host.py): a layer cannot run faster than the CPU issues its kernels.

Each expected host time is re-derived here from the kernel counts and the per-launch-mode host costs the module
cites: Megatron's fused layer issues 20 kernels, eager PyTorch's 38, plus 2 TP all-reduces (4 collectives under
sequence parallelism); backward issues twice the forward's kernels, at the forward's cost per kernel under
Megatron and at half of it from PyTorch's C++ autograd engine.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from meshplan import io
from meshplan.core.time.host import Launch, host_layer, launch_of
from meshplan.reports.estimate import estimate_report
from meshplan.reports.inputs import LayoutRequest
from meshplan.spec.profile import Profile
from meshplan.spec.workload import Framework, Kernels
from meshplan.validation.calibrate import MeasuredRun, fit_runs, predict

EAGER_US = 30e-6
COMPILE_US = 6e-6


def _tiny(**conditions: Any) -> dict[str, Any]:
    """MPT-125M (12 layers) split 4 ways at 512 tokens, micro-batch 1: a layer's matmuls take microseconds."""
    return estimate_report(
        "mpt-125m",
        gpu="h100-sxm",
        gpus=4,
        layout=LayoutRequest(tp=4),
        seq=512,
        global_batch=8,
        conditions=conditions or None,
    )


def test_the_floor_binds_for_a_tiny_model_at_a_short_sequence() -> None:
    eager, graphed = _tiny(), _tiny(launch="cudagraph")
    host = eager["host"]
    assert host["launch"] == "eager" and host["bound"]
    # Megatron: 20 fused kernels and 2 all-reduces forward, twice that backward at the same cost per kernel
    assert host["host_s_per_layer"] == pytest.approx((20 + 2) * EAGER_US * (1 + 2), rel=1e-9)
    assert host["gpu_s_per_layer"] < host["host_s_per_layer"] / 3
    # one graph launch per layer and pass is far below the GPU's time: the same GPU work, the floor gone
    assert not graphed["host"]["bound"]
    assert graphed["host"]["gpu_s_per_layer"] == pytest.approx(host["gpu_s_per_layer"], rel=1e-12)
    # both phases are host-bound: each of the 8 micro-batches x 12 layers waits host - GPU seconds
    wait = 8 * 12 * (host["host_s_per_layer"] - host["gpu_s_per_layer"])
    gap = eager["breakdown"]["compute_s"] - graphed["breakdown"]["compute_s"]
    assert gap == pytest.approx(wait, rel=1e-9)


def test_the_floor_does_not_bind_for_a_70b_at_4k() -> None:
    def run(launch: str | None) -> dict[str, Any]:
        return estimate_report(
            "llama-3.1-70b",
            gpu="h100-sxm",
            gpus=64,
            layout=LayoutRequest(tp=8, pp=2, zero=1),
            seq=4096,
            global_batch=256,
            conditions={"launch": launch} if launch else None,
        )

    eager, graphed = run(None), run("cudagraph")
    assert not eager["host"]["bound"]
    assert eager["host"]["host_s_per_layer"] == pytest.approx((20 + 2) * EAGER_US * 3, rel=1e-9)
    assert eager["host"]["gpu_s_per_layer"] > 2 * eager["host"]["host_s_per_layer"]
    assert eager["step_time_s"] == graphed["step_time_s"]  # the CPU runs ahead: the floor adds nothing


def test_pytorch_eager_and_compiled_host_costs() -> None:
    model = io.load_model("llama-3.2-1b")
    common: dict[str, Any] = dict(framework=Framework.TORCH, tp=1, sp=False, moe_layer=False)
    eager = host_layer(model, kernels=Kernels.EAGER, launch=Launch.EAGER, **common)
    assert eager.forward_s == pytest.approx(38 * EAGER_US)
    assert eager.backward_s == pytest.approx(2 * 38 * EAGER_US * 0.5)  # C++ autograd: half the cost per kernel
    compiled = host_layer(model, kernels=Kernels.FUSED, launch=Launch.COMPILE, **common)
    assert (compiled.forward_s, compiled.backward_s) == pytest.approx((20 * COMPILE_US, 40 * COMPILE_US))
    slower = host_layer(model, kernels=Kernels.EAGER, launch=Launch.EAGER, speed=0.5, **common)
    assert slower.forward_s == pytest.approx(2 * eager.forward_s)
    # the stack decides the mode unless stated
    assert launch_of(None, kernels=Kernels.EAGER, framework=Framework.TORCH) is Launch.EAGER
    assert launch_of(None, kernels=Kernels.FUSED, framework=Framework.TORCH) is Launch.COMPILE
    assert launch_of(None, kernels=Kernels.FUSED, framework=Framework.MEGATRON) is Launch.EAGER
    assert launch_of("cudagraph", kernels=Kernels.EAGER, framework=Framework.TORCH) is Launch.CUDAGRAPH


def test_tp_and_moe_add_launches_scalar_and_vectorized_alike() -> None:
    mixtral = io.load_model("mixtral-8x7b")
    tp = np.array([1, 2, 4, 8])
    sp = np.array([False, False, True, True])
    args: dict[str, Any] = dict(kernels=Kernels.FUSED, launch=Launch.EAGER, framework=Framework.MEGATRON)
    many = host_layer(mixtral, tp=tp, sp=sp, moe_layer=True, **args)
    for i in range(len(tp)):
        one = host_layer(mixtral, tp=int(tp[i]), sp=bool(sp[i]), moe_layer=True, **args)
        assert float(many.forward_s[i]) == pytest.approx(float(one.forward_s))
    collectives = [0, 2, 4, 4]  # none, 2 all-reduces, 2 all-gathers + 2 reduce-scatters
    expected = [(20 + c + 16) * EAGER_US for c in collectives]  # a MoE layer adds 16 routing kernels
    assert np.allclose(many.forward_s, expected)


def test_the_estimate_text_says_host_bound(capsys: pytest.CaptureFixture[str]) -> None:
    from meshplan.cli import main

    argv = ["estimate", "mpt-125m", "--gpu", "h100-sxm", "--gpus", "4", "--tp", "4", "--seq", "512"]
    main([*argv, "--global-batch", "8"])
    assert "host-bound: the CPU issues a layer's kernels in 1.98 ms" in capsys.readouterr().out
    main([*argv, "--global-batch", "8", "--launch", "cudagraph"])
    assert "host-bound" not in capsys.readouterr().out


def _runs(truth: Profile, shapes: list[tuple[str, int, int, int]]) -> list[MeasuredRun]:
    """Synthetic step times of ``shapes`` (model, GPUs = TP, sequence, global batch) on a cluster ``truth``."""
    runs = []
    for m, tp, seq, batch in shapes:
        args = (m, "--gpu", "h100-sxm", "--gpus", str(tp), "--tp", str(tp), "--seq", str(seq))
        runs.append(MeasuredRun(args=(*args, "--global-batch", str(batch)), metric="step_time_s", measured=1.0))
    values = predict(runs, truth)
    return [MeasuredRun(args=r.args, metric=r.metric, measured=v) for r, v in zip(runs, values, strict=True)]


def test_calibrate_fits_the_hosts_speed_where_runs_are_host_bound() -> None:
    shapes = [("mpt-125m", 1, 512, 8), ("mpt-125m", 2, 512, 8), ("mpt-125m", 4, 512, 8), ("mpt-125m", 2, 256, 16)]
    profile, numbers = fit_runs(_runs(Profile(host_scale=0.5), shapes))
    assert numbers["identified"]["host_scale"] and numbers["fitted"] == ["host_scale"]
    assert profile.host_scale == pytest.approx(0.5, rel=0.02)
    assert "host_scale" not in numbers["not_identified"]


def test_calibrate_refuses_the_hosts_speed_where_no_run_is_host_bound() -> None:
    shapes = [("llama-3.1-8b", 1, 4096, 8), ("llama-3.1-8b", 2, 4096, 8), ("llama-3.1-8b", 2, 8192, 8)]
    profile, numbers = fit_runs(_runs(Profile(compute_scale=0.8), shapes))
    assert not numbers["identified"]["host_scale"] and profile.host_scale == 1.0
    assert numbers["not_identified"]["host_scale"].startswith("no run is host-bound")
