"""Properties of the step-time model that must hold for any layout."""

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan import io
from meshplan.core.plan import evaluate
from meshplan.reports.inputs import resolve_cluster
from meshplan.spec.layout import Layout, Recompute, Schedule, ZeroStage
from meshplan.spec.workload import Workload
from meshplan.units import DType

MODEL = io.load_model("llama-3.1-70b")

layouts = st.builds(
    lambda tp, pp, zero, sp, rc, mb: (tp, pp, zero, sp and tp > 1, rc, mb),
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2, 4]),
    zero=st.sampled_from([0, 1, 2, 3]),
    sp=st.booleans(),
    rc=st.sampled_from(list(Recompute)),
    mb=st.sampled_from([1, 2]),
)


def make(args: tuple, gpus: int = 64) -> Layout:
    tp, pp, zero, sp, rc, mb = args
    dp = gpus // (tp * pp)
    return Layout(
        tp=tp,
        pp=pp,
        dp_shard=dp if zero else 1,
        dp_replicate=1 if zero else dp,
        zero=ZeroStage(zero),
        sp=sp,
        recompute=rc,
        micro_batch=mb,
    )


def step(layout: Layout, *, scale_up: float = 1.0, scale_out: float = 1.0, gpu: str = "h100-sxm") -> float:
    cluster = resolve_cluster(gpu=gpu, gpus=layout.num_gpus)
    up, out = cluster.scale_up, cluster.scale_out
    cluster = dataclasses.replace(
        cluster,
        scale_up=dataclasses.replace(up, bandwidth_bytes_per_s=up.bandwidth_bytes_per_s * scale_up),
        scale_out=dataclasses.replace(out, bandwidth_bytes_per_s=out.bandwidth_bytes_per_s * scale_out),
    )
    work = Workload(seq_len=4096, global_batch=layout.dp * layout.micro_batch * 8)
    return float(evaluate(MODEL, cluster, layout, work).step.step_time_s)


@given(args=layouts, factor=st.sampled_from([1.5, 2.0, 8.0]))
def test_more_bandwidth_never_slows_a_step(args: tuple, factor: float) -> None:
    layout = make(args)
    base = step(layout)
    assert step(layout, scale_up=factor) <= base * (1 + 1e-12)
    assert step(layout, scale_out=factor) <= base * (1 + 1e-12)


@given(args=layouts)
def test_a_smaller_bubble_never_slows_a_step(args: tuple) -> None:
    pp = args[1]
    if pp == 1:
        return
    one_f_one_b = make(args)
    zero_bubble = dataclasses.replace(one_f_one_b, schedule=Schedule.ZERO_BUBBLE)
    assert step(zero_bubble) <= step(one_f_one_b)


def test_recompute_only_adds_time() -> None:
    base = make((8, 2, 1, True, Recompute.NONE, 1))
    times = [step(dataclasses.replace(base, recompute=rc)) for rc in Recompute]
    assert times == sorted(times)


def test_an_estimate_near_capacity_warns_of_allocator_retries() -> None:
    """Above 90% of HBM (and fitting) the estimate says the allocator may retry; at 72% it says nothing."""
    model = io.load_model("llama-3.1-8b")
    cluster = resolve_cluster(gpu="h100-sxm", gpus=8)
    layout = Layout(dp_shard=8, zero=ZeroStage.PARAMETERS, micro_batch=1)
    tight = evaluate(model, cluster, layout, Workload(seq_len=12288, global_batch=8))
    roomy = evaluate(model, cluster, layout, Workload(seq_len=8192, global_batch=8))
    share = tight.memory.per_gpu.total_bytes / tight.memory.hbm_bytes
    assert tight.memory.fits and 0.90 < share < 1
    assert [w for w in tight.warnings() if "cudaMalloc retries" in w and f"{share:.0%} of HBM" in w]
    assert roomy.memory.per_gpu.total_bytes / roomy.memory.hbm_bytes < 0.8
    assert not [w for w in roomy.warnings() if "retries" in w]


def test_tp_across_the_fabric_is_slower() -> None:
    """The bandwidth wall: the same TP 16 groups inside one 16-GPU NVLink domain, or split over two 8-GPU nodes."""
    model = io.load_model("gpt3-175b")
    work = Workload(seq_len=2048, global_batch=64)
    layout = Layout(tp=16, pp=4, sp=True, micro_batch=1)
    inside = evaluate(model, resolve_cluster(gpu="h100-sxm", gpus=64, node_size=16), layout, work)
    across = evaluate(model, resolve_cluster(gpu="h100-sxm", gpus=64, node_size=8), layout, work)
    assert across.tp_crosses_domain and not inside.tp_crosses_domain
    assert any("TP=16" in w for w in across.warnings())
    # with one NIC per GPU (rail-optimized) the cross-node share is 1/8 of each buffer: slower, not 18x
    assert float(across.step.exposed_tp_s) > 1.2 * float(inside.step.exposed_tp_s)
    assert float(across.step.step_time_s) > float(inside.step.step_time_s)


def test_mfu_uses_model_flops_and_hfu_adds_recompute() -> None:
    layout = make((8, 1, 1, True, Recompute.FULL, 1))
    cluster = resolve_cluster(gpu="h100-sxm", gpus=64)
    work = Workload(seq_len=4096, global_batch=64)
    s = evaluate(MODEL, cluster, layout, work).step
    flops = s.model_flops_per_step / (s.step_time_s * 64 * 989.4e12)
    assert float(s.mfu) == pytest.approx(float(flops))
    assert float(s.hfu) == pytest.approx(float(s.mfu) * 4 / 3)
    assert float(s.tokens_per_s_per_gpu) == pytest.approx(4096 * 64 / float(s.step_time_s) / 64)


def test_fp8_pays_casts_and_keeps_attention_in_bf16() -> None:
    """FP8 runs the linear GEMMs at the FP8 peak times the kind's FP8 share; the speed-up over bf16 stays well
    below the 2x of the peaks (NeMo and torchtitan measure 1.15-1.4x), and long sequences gain less."""
    from meshplan.reports.estimate import estimate_report
    from meshplan.reports.inputs import LayoutRequest

    def tokens_per_s(precision: str, seq: int) -> float:
        r = estimate_report(
            "llama-3.1-8b", gpu="h100-sxm", gpus=8, layout=LayoutRequest(dp_shard=8, zero=1), seq=seq,
            global_batch=64, precision=precision,
        )  # fmt: skip
        return float(r["tokens_per_s_per_gpu"])

    short = tokens_per_s("fp8", 4096) / tokens_per_s("bf16", 4096)
    long = tokens_per_s("fp8", 32768) / tokens_per_s("bf16", 32768)
    assert 1.05 < short < 1.6
    assert 1.0 < long < short


def _zero3_plan(unit: str, recompute: Recompute, *, overlap: bool = True) -> object:
    from meshplan.reports.conditions import conditions_of
    from meshplan.spec.workload import Overlap

    model = io.load_model("gpt3-175b")  # Megatron's fused QKV: 4 weight matrices per layer
    layout = Layout(dp_shard=64, zero=ZeroStage.PARAMETERS, recompute=recompute)
    work = Workload(
        seq_len=2048,
        global_batch=128,
        conditions=conditions_of({"zero3_unit": unit}),
        overlap=Overlap(dp=overlap, fsdp_prefetch=overlap),
    )
    return evaluate(model, resolve_cluster(gpu="a100-80gb", gpus=64), layout, work)


def _zero3_gathers(plan: object) -> tuple[float, float]:
    calls = [c for c in plan.collectives if c.strategy == "dp" and c.op.value == "all_gather" and c.phase != "step"]  # type: ignore[attr-defined]
    return sum(float(c.count_per_step) for c in calls), sum(float(c.bytes_per_step) for c in calls)


def test_deepspeed_zero3_gathers_each_matrix_and_again_when_recomputing() -> None:
    """Per micro-batch: FSDP gathers each of 96 layers forward and backward; DeepSpeed each of their 4 matrices,
    and a third time in the recomputed forward; the bytes are 2 (or 3) x the 16-bit parameters either way."""
    m = 2  # 128 sequences over 64 ranks
    layer_count, layer_bytes = _zero3_gathers(_zero3_plan("layer", Recompute.NONE))
    module_count, module_bytes = _zero3_gathers(_zero3_plan("module", Recompute.NONE))
    again_count, again_bytes = _zero3_gathers(_zero3_plan("module", Recompute.FULL))
    assert layer_count == 2 * 96 * m
    assert module_count == 4 * layer_count
    assert module_bytes == pytest.approx(layer_bytes, rel=1e-12)
    assert again_count == 3 * 96 * 4 * m
    assert again_bytes == pytest.approx(1.5 * layer_bytes, rel=1e-12)


def test_zero3_without_overlap_pays_all_its_traffic() -> None:
    hidden = _zero3_plan("module", Recompute.FULL)
    exposed = _zero3_plan("module", Recompute.FULL, overlap=False)
    traffic = sum(float(c.time_s) for c in exposed.collectives if c.strategy == "dp")  # type: ignore[attr-defined]
    assert exposed.step.exposed_dp_s == pytest.approx(traffic, rel=1e-9)  # type: ignore[attr-defined]
    assert hidden.step.exposed_dp_s < exposed.step.exposed_dp_s  # type: ignore[attr-defined]


def _dp_calls_by_kind(plan: object) -> dict[tuple[str, str], tuple[float, float, float]]:
    return {
        (c.op.value, c.phase): (float(c.call_s), float(c.count_per_step), float(c.size_bytes))
        for c in plan.collectives  # type: ignore[attr-defined]
        if c.strategy == "dp" and c.count_per_step and c.phase != "step"
    }


def test_listed_zero3_collectives_pay_a_view_and_a_copy_per_rank() -> None:
    """DeepSpeed 0.3's list collectives, per call: a view per rank of the 64 (a launch gap each), a copy per rank
    (launch-bound or bound by a read and a write of the buffer in HBM), and the zero-fill of the gathered buffer
    (one pass) or the gradient's pre-division (two passes)."""
    flat, listed = _zero3_plan("module", Recompute.FULL), _zero3_plan("parameter", Recompute.FULL)
    gpu = resolve_cluster(gpu="a100-80gb", gpus=64).gpu
    launches = 64 * gpu.calibration.kernel_overhead_s
    per_byte = 1 / (gpu.hbm_bandwidth_bytes_per_s * gpu.calibration.hbm_efficiency)
    a, b = _dp_calls_by_kind(flat), _dp_calls_by_kind(listed)
    assert set(a) == set(b) == {("all_gather", "forward"), ("all_gather", "backward"), ("reduce_scatter", "backward")}
    for (op, phase), (call_s, count, size) in a.items():
        passes = 1 if op == "all_gather" else 2
        host = launches + max(launches, 2 * size * per_byte) + passes * size * per_byte
        assert b[op, phase] == pytest.approx((call_s + host, count, size), rel=1e-12)


def test_deepspeed_03_regathers_the_persistent_parameters_every_step() -> None:
    """DeepSpeed 0.3 gathers its whole-kept biases and norms again after each optimizer step and unflattens them a
    parameter and a rank at a time: GPT-3 holds 8 per layer (two LayerNorms' weight and bias, the fused QKV, output,
    fc1 and fc2 biases) and the final norm's 2; each pays 6 host operations and 4 per rank of the 64, one launch
    gap each, beside the list all_gather of 13 h elements per layer plus 2 h."""
    from meshplan.core.comm.persistent import persistent_sizes
    from meshplan.spec.workload import Framework

    h = 12288
    gpt3 = io.load_model("gpt3-175b")
    assert sorted(persistent_sizes(gpt3, Framework.MEGATRON, moe_layer=False)) == sorted(
        [h, h, 3 * h, h, h, h, 4 * h, h]
    )
    assert persistent_sizes(io.load_model("llama-3.1-8b"), Framework.TORCH, moe_layer=False) == (4096, 4096)
    flat, listed = _zero3_plan("module", Recompute.FULL), _zero3_plan("parameter", Recompute.FULL)

    def step_gathers(plan: object) -> list:
        return [c for c in plan.collectives if c.strategy == "dp" and c.phase == "step" and c.count_per_step]  # type: ignore[attr-defined]

    assert step_gathers(flat) == []
    (call,) = step_gathers(listed)
    assert float(call.count_per_step) == 1 and float(call.size_bytes) == (96 * 13 * h + 2 * h) * 2
    gpu = resolve_cluster(gpu="a100-80gb", gpus=64).gpu
    launch = gpu.calibration.kernel_overhead_s
    per_byte = 1 / (gpu.hbm_bandwidth_bytes_per_s * gpu.calibration.hbm_efficiency)
    listed_host = 64 * launch + max(64 * launch, 2 * float(call.size_bytes) * per_byte)
    unflatten = (96 * 8 + 2) * (6 + 4 * 64) * launch
    assert 0 < float(call.call_s) - listed_host - unflatten < 2e-3  # the wire: 26 MB over 8 nodes


def test_zero3_gradients_all_reduced_in_buckets_move_twice_the_bytes() -> None:
    """DeepSpeed 0.3 without contiguous gradients: each unit's gradient all-reduced whole instead of
    reduce-scattered, as many calls of the same size, each slower than the reduce-scatter beside its six HBM
    passes (flatten, divide, copy back)."""
    from meshplan.reports.conditions import conditions_of

    model = io.load_model("gpt3-175b")
    cluster = resolve_cluster(gpu="a100-80gb", gpus=64)
    layout = Layout(dp_shard=64, zero=ZeroStage.PARAMETERS, recompute=Recompute.FULL)

    def plan(reduce: str) -> object:
        conditions = conditions_of({"zero3_unit": "module", "zero3_grad_reduce": reduce})
        return evaluate(model, cluster, layout, Workload(seq_len=2048, global_batch=128, conditions=conditions))

    rs, ar = _dp_calls_by_kind(plan("reduce-scatter")), _dp_calls_by_kind(plan("all-reduce"))
    assert ("reduce_scatter", "backward") not in ar
    rs_s, rs_count, rs_size = rs["reduce_scatter", "backward"]
    ar_s, ar_count, ar_size = ar["all_reduce", "backward"]
    assert (ar_count, ar_size) == (rs_count, rs_size) == (2 * 96 * 4, rs_size)
    hbm = 6 * ar_size / (cluster.gpu.hbm_bandwidth_bytes_per_s * cluster.gpu.calibration.hbm_efficiency)
    assert 1.5 * rs_s < ar_s - hbm < 2.5 * rs_s  # twice the bus bytes, the tree's latency instead of the ring's
    assert ar["all_gather", "forward"] == rs["all_gather", "forward"]


def test_torchtitan_selective_policies_repeat_what_they_drop() -> None:
    """Per layer (every second layer in full): half of what full recompute adds; per op: more than Megatron's
    attention core, less than full recompute."""
    from meshplan.reports.conditions import conditions_of

    model = io.load_model("llama-3.1-8b")
    cluster = resolve_cluster(gpu="a100-80gb", gpus=8)

    def compute_s(recompute: Recompute, selective: str = "core-attention") -> float:
        work = Workload(seq_len=4096, global_batch=8, conditions=conditions_of({"selective": selective}))
        layout = Layout(dp_shard=8, zero=ZeroStage.PARAMETERS, recompute=recompute)
        return float(evaluate(model, cluster, layout, work).step.compute_s)

    none, full = compute_s(Recompute.NONE), compute_s(Recompute.FULL)
    assert compute_s(Recompute.SELECTIVE, "layer") - none == pytest.approx((full - none) / 2, rel=1e-9)
    op, core = compute_s(Recompute.SELECTIVE, "op"), compute_s(Recompute.SELECTIVE)
    assert none < core < op < full


def test_overlapped_interleaved_sends_without_host_sync_drop_the_chunk_cost() -> None:
    """Megatron-Core's overlapped interleaved sends (pp_host_sync off) skip the fixed cost of every chunk: the
    exposed pipeline time falls by 2 m v x pipeline_step_overhead_s; blocking sends keep it either way."""
    from meshplan.reports.conditions import conditions_of

    model = io.load_model("llama-2-70b")
    cluster = resolve_cluster(gpu="h100-sxm", gpus=64)
    one_f_one_b = Layout(tp=4, sp=True, pp=4, dp_shard=4, zero=ZeroStage.OPTIMIZER)
    interleaved = dataclasses.replace(one_f_one_b, vpp=5, schedule=Schedule.INTERLEAVED)

    def plan(layout: Layout, sync: str) -> object:
        work = Workload(seq_len=4096, global_batch=64, conditions=conditions_of({"pp_host_sync": sync}))
        return evaluate(model, cluster, layout, work)

    m, chunk = 64 / 4, 5 * cluster.gpu.calibration.pipeline_step_overhead_s
    synced, free = plan(interleaved, "on"), plan(interleaved, "off")
    assert synced.step.exposed_pp_s - free.step.exposed_pp_s == pytest.approx(2 * m * chunk, rel=1e-9)  # type: ignore[attr-defined]
    assert plan(one_f_one_b, "off").step.step_time_s == plan(one_f_one_b, "on").step.step_time_s  # type: ignore[attr-defined]


def test_megatron_cross_entropy_moves_52_bytes_per_logit() -> None:
    """Megatron's unfused vocab-parallel loss on the fp32 upcast: 38 bytes per logit in forward, 14 in
    backward, against the 8 + 8 of a plain fp32 log-softmax."""
    from meshplan.core.time.compute import LOSS_BYTES, MEGATRON_CE_BYTES, head_time
    from meshplan.spec.conditions import LossKind

    model = io.load_model("llama-3.1-8b")
    gpu = resolve_cluster(gpu="h100-sxm", gpus=8).gpu
    kw = dict(tokens=8192, tp=1, peak_flops=gpu.peak_flops[DType.BF16], hbm_bytes_per_s=gpu.hbm_bandwidth_bytes_per_s)
    plain = head_time(model, cal=gpu.calibration, act_bytes=2, loss_bytes=LOSS_BYTES[LossKind.FRAMEWORK], **kw)  # type: ignore[arg-type]
    megatron = head_time(model, cal=gpu.calibration, act_bytes=2, loss_bytes=MEGATRON_CE_BYTES, **kw)  # type: ignore[arg-type]
    per_byte = 8192 * model.vocab_size / (gpu.hbm_bandwidth_bytes_per_s * gpu.calibration.hbm_efficiency)
    assert megatron[0] - plain[0] == pytest.approx(30 * per_byte, rel=1e-9)
    assert megatron[1] - plain[1] == pytest.approx(6 * per_byte, rel=1e-9)


def test_a_context_parallel_estimate_takes_the_cp_runs_band_and_warns(capsys: pytest.CaptureFixture[str]) -> None:
    """catalog/held_out.toml keeps a band of its own for the published runs with context parallelism (the model
    runs fast on them held out); an estimate with cp > 1 prints that band and says so, one without does not."""
    import json

    from meshplan.cli import main

    band = io.held_out_band()
    args = ["estimate", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq", "8192", "--json"]
    for cp, key in ((2, "cp_time_ratio"), (1, "time_ratio")):
        # ZeRO-3 leaves both layouts room (a layout past 90% of HBM has its P90 widened: test_memory_terms.py)
        assert main([*args, "--cp", str(cp), "--dp-shard", str(8 // cp), "--zero", "3"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["step_time_s_p10"] == pytest.approx(band[f"{key}_p10"] * out["step_time_s"], rel=1e-9)
        assert out["step_time_s_p90"] == pytest.approx(band[f"{key}_p90"] * out["step_time_s"], rel=1e-9)
        said = [w for w in out["warnings"] if w.startswith("context parallelism")]
        assert bool(said) == (cp > 1)
        assert ("with context parallelism" in out["uncertainty"]) == (cp > 1)
        # how many sources stand behind the band, beside it (JSON and text), and whether they make its promise
        sources = int(band["cp_sources" if cp > 1 else "sources"])
        assert out["step_time_band_sources"] == sources and f"of {sources} sources" in out["uncertainty"]
        assert ("too few sources" in out["uncertainty"]) == (not band["cp_promised" if cp > 1 else "promised"])


def test_an_expert_parallel_estimate_takes_the_ep_runs_band_and_warns(capsys: pytest.CaptureFixture[str]) -> None:
    """The published runs with expert parallelism (and no CP) have a band of their own too; a layout with both CP
    and EP takes the band covering the two classes' bands (the lower P10, the higher P90), never the narrower, and
    warns with both classes' medians."""
    import json

    from meshplan.cli import main

    band = io.held_out_band()
    args = ["estimate", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "32", "--seq", "8192", "--json", "--zero", "1"]
    args += ["--pp", "2", "--recompute", "full"]  # EP with PP: mixes published runs used (no widening); room in HBM
    layouts = (
        (["--ep", "8", "--dp-shard", "16"], ("ep",)),
        (["--ep", "8", "--cp", "2", "--tp", "2", "--dp-shard", "4"], ("cp", "ep")),
    )
    for extra, keys in layouts:
        assert main([*args, *extra]) == 0
        out = json.loads(capsys.readouterr().out)
        lo = min(band[f"{key}_time_ratio_p10"] for key in keys)
        hi = max(band[f"{key}_time_ratio_p90"] for key in keys)
        assert out["step_time_s_p10"] == pytest.approx(lo * out["step_time_s"], rel=1e-9)
        assert out["step_time_s_p90"] == pytest.approx(hi * out["step_time_s"], rel=1e-9)
        assert out["step_time_band_sources"] == min(int(band[f"{key}_sources"]) for key in keys)
        assert "widened" not in out["uncertainty"]
        for key in keys:
            name = {"ep": "expert parallelism", "cp": "context parallelism"}[key]
            assert [w for w in out["warnings"] if w.startswith(name)]
            assert f"with {name}" in out["uncertainty"]
            # never narrower than either class's own band
            assert out["step_time_s_p10"] <= band[f"{key}_time_ratio_p10"] * out["step_time_s"] * (1 + 1e-12)
            assert out["step_time_s_p90"] >= band[f"{key}_time_ratio_p90"] * out["step_time_s"] * (1 - 1e-12)
    # today both classes rest on too few sources (5 and 3): each spans every held-out run (validation/band.py step
    # 3), wider than the every-run band
    for key in ("cp", "ep"):
        assert not band[f"{key}_promised"]
        assert band[f"{key}_time_ratio_p10"] == band["unseen_time_ratio_p10"] < band["time_ratio_p10"]
        assert band[f"{key}_time_ratio_p90"] == band["unseen_time_ratio_p90"] > band["time_ratio_p90"]


def test_the_published_runs_per_gpu_kind_are_the_run_files_cases_and_the_bands_runs() -> None:
    """io.published_runs_by_gpu counts each case of catalog/runs on its GPU kind (the case's own, else its file's
    default), re-read here from the files, and the counts add up to the runs the held-out band was taken over."""
    import tomllib
    from importlib import resources

    expected: dict[str, int] = {}
    for entry in (resources.files("meshplan") / "catalog" / "runs").iterdir():
        if not entry.name.endswith(".toml"):
            continue
        data = tomllib.loads(entry.read_text(encoding="utf-8"))
        for case in data["case"]:
            gpu = case["gpu"] if "gpu" in case else data["defaults"]["gpu"]
            expected[gpu] = expected.get(gpu, 0) + 1
    assert io.published_runs_by_gpu() == expected
    assert sum(expected.values()) == int(io.held_out_band()["runs"])
    assert "mi300x" not in expected and "h100-sxm" in expected


def test_a_gpu_kind_no_published_run_ran_on_is_named_in_the_band_and_the_warnings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On a GPU kind none of the published runs ran on (MI300X), the estimate warns that its band is other kinds'
    errors and its band says so, and the plan's band too; on H100, whose runs make the band, neither; with a
    cluster profile (the user's own scales) there is no warning."""
    import json

    from meshplan.cli import main

    args = ["llama-3.1-8b", "--gpus", "8", "--seq", "8192", "--global-batch", "8", "--dp-shard", "8", "--zero", "3"]
    args.append("--json")
    for gpu, alien in (("mi300x", True), ("h100-sxm", False)):
        assert main(["estimate", *args, "--gpu", gpu]) == 0
        out = json.loads(capsys.readouterr().out)
        said = [w for w in out["warnings"] if w.startswith(f"{gpu}: none of the")]
        assert bool(said) == alien
        assert ("no published run used the GPU kind " + gpu in out["uncertainty"]) == alien
        if alien:
            assert f"none of the {int(io.held_out_band()['runs'])} published training runs" in said[0]
            assert all(kind in said[0] for kind in io.published_runs_by_gpu())
    assert main(["estimate", *args, "--gpu", "mi300x", "--profile", "compute_scale=0.8"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert not [w for w in out["warnings"] if w.startswith("mi300x: none of the")]
    plan = ["plan", "llama-3.1-8b", "--gpu", "mi300x", "--gpus", "8", "--seq", "8192"]
    assert main([*plan, "--global-batch-tokens", "1M", "--top", "1", "--json"]) == 0
    assert "no published run used the GPU kind mi300x" in json.loads(capsys.readouterr().out)["uncertainty"]
