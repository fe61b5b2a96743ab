"""estimate's timeline: the step drawn stage by stage is a decomposition of the step-time model's own terms.

Every stage's row must end at ``step_time_s`` and sum, by kind, to ``breakdown``'s compute, bubble and exposed
traffic of each axis (relative 1e-9 here, 1e-6 asked); where the drawn order is the schedule's own (GPipe, 1F1B,
interleaved with whole micro-batch groups), its idle time must be the model's bubble unscaled; the chunks a stage
holds at most must be the pipeline's in-flight count (Narayanan et al. 2021; Megatron's interleaved warm-up),
re-derived here; the memory curve's peak must be ``memory``'s stage bill.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from meshplan.reports.bills import memory_report
from meshplan.reports.estimate import estimate_report
from meshplan.reports.inputs import LayoutRequest

KEYS = ("compute_s", "bubble_s", "optimizer_s", "host_s", "exposed_comm_s")
KEYS += tuple(f"exposed_{a}_s" for a in ("tp", "cp", "ep", "pp", "dp"))
LAYOUT = ("tp", "pp", "vpp", "cp", "ep", "dp_shard", "zero", "schedule", "micro_batch", "sp", "recompute")


def estimate(model: str, gpus: int, **kw: Any) -> dict[str, Any]:
    lay = {k: kw.pop(k) for k in list(kw) if k in LAYOUT}
    return estimate_report(model, gpu="h100-sxm", gpus=gpus, layout=LayoutRequest(**lay), timeline=True, **kw)


def assert_decomposes(r: dict[str, Any]) -> None:
    tl, b, step = r["timeline"], r["breakdown"], r["step_time_s"]
    assert tl["totals"] == tl["stages"][0]["totals"]
    for row in tl["stages"]:
        t = row["totals"]
        assert t["step_time_s"] == pytest.approx(step, rel=1e-9)
        for k in KEYS:
            assert t[k] == pytest.approx(b[k], rel=1e-9, abs=1e-12 * step), (row["stage"], k)
        ivs = row["intervals"]
        assert ivs[0]["start_s"] == 0.0
        for a, c in itertools.pairwise(ivs):  # laid end to end, nothing overlaps, nothing negative
            assert c["start_s"] == pytest.approx(a["end_s"], abs=1e-12 * step)
            assert a["end_s"] >= a["start_s"]
        for h in row["hidden"]:
            assert not h["exposed"] and h["end_s"] <= step * (1 + 1e-9)
    for mem, bill in zip(tl["memory"], r["stages"], strict=True):
        assert max(p[1] for p in mem["points"]) == pytest.approx(bill["total_bytes"], rel=1e-12)
        assert mem["points"][0][1] == pytest.approx(bill["total_bytes"] - bill["activations_bytes"], rel=1e-12)


CASES = [
    ("llama-3.1-8b", 64, dict(tp=2, pp=4, global_batch=256)),
    ("llama-3.1-8b", 64, dict(tp=2, pp=4, vpp=2, schedule="interleaved", global_batch=256)),
    ("llama-3.1-8b", 64, dict(tp=8, dp_shard=8, zero=3, global_batch=64)),
    ("llama-3.1-8b", 64, dict(tp=4, pp=2, cp=2, sp=True, global_batch=64, seq=32768)),
    ("mixtral-8x7b", 64, dict(tp=2, pp=4, ep=8, global_batch=256)),
    ("llama-3.1-8b", 64, dict(tp=2, pp=4, schedule="gpipe", global_batch=64, recompute="full")),
    ("llama-3.1-8b", 64, dict(tp=2, pp=4, schedule="zero-bubble", global_batch=256)),
    ("llama-3.1-8b", 64, dict(tp=2, pp=4, schedule="dualpipe", global_batch=256)),
    ("llama-3.1-8b", 64, dict(tp=1, pp=8, global_batch=2048)),  # folded: 256 micro-batches
    ("llama-3.1-8b", 64, dict(tp=2, pp=4, vpp=2, schedule="interleaved", global_batch=40)),  # a partial group
    ("llama-3.1-8b", 64, dict(tp=2, pp=4, vpp=4, schedule="interleaved", global_batch=40)),  # groups of 4 deadlock
    ("llama-3.1-405b", 1008, dict(tp=8, pp=126, global_batch=256)),  # too deep for two groups: 3 drawn
]


@pytest.mark.parametrize(("model", "gpus", "kw"), CASES)
def test_every_stage_row_is_the_models_step(model: str, gpus: int, kw: dict[str, Any]) -> None:
    assert_decomposes(estimate(model, gpus, **kw))


def test_a_deep_pipeline_says_how_much_it_drew() -> None:
    tl = estimate("llama-3.1-405b", 1008, tp=8, pp=126, global_batch=256)["timeline"]
    assert tl["drawn_as"].endswith("3 of 256 micro-batches drawn, the rest folded into one block a stage")
    assert sum(len(s["intervals"]) for s in tl["stages"]) < 8000
    assert max(i["count"] for i in tl["stages"][0]["intervals"]) == 253


def test_the_axes_left_exposed_are_drawn_on_their_own() -> None:
    """CP, EP and ZeRO-3 layouts draw their own axis's exposed traffic; a pipeline draws its sends."""
    cp = estimate("llama-3.1-8b", 64, tp=4, pp=2, cp=2, sp=True, global_batch=64, seq=32768)["timeline"]
    ep = estimate("mixtral-8x7b", 64, tp=2, pp=4, ep=8, global_batch=256)["timeline"]
    z3 = estimate("llama-3.1-8b", 64, tp=8, dp_shard=8, zero=3, global_batch=64)["timeline"]
    axes = {name: {i["axis"] for s in tl["stages"] for i in s["intervals"] + s["hidden"]} for name, tl in
            (("cp", cp), ("ep", ep), ("z3", z3))}  # fmt: skip
    assert {"cp", "pp"} <= axes["cp"] and {"ep", "pp"} <= axes["ep"] and "dp" in axes["z3"]
    assert z3["pp"] == 1 and not any(i["kind"] == "bubble" for i in z3["stages"][0]["intervals"])


def in_flight_chunks(schedule: str, *, p: int, v: int, m: int, stage: int) -> int:
    """Chunks a stage holds at its peak: GPipe all m; 1F1B min(p - i, m); interleaved Megatron's warm-up
    (v - 1) N + 2 (p - 1 - i) plus the first steady forward, at most m v (all of them when m = p), with groups of
    N = p micro-batches, or one group of all m where p does not divide m."""
    if schedule == "gpipe":
        return m
    if v == 1:
        return min(p - stage, m)
    group = p if m % p == 0 else m
    return m * v if m == p else min((v - 1) * group + 2 * (p - 1 - stage) + 1, m * v)


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pp=hs.sampled_from([2, 4, 8]),
    vpp=hs.sampled_from([2, 4]),
    groups=hs.integers(1, 4),
    extra=hs.integers(0, 7),
    schedule=hs.sampled_from(["1f1b", "gpipe", "interleaved"]),
)
def test_the_schedules_own_order_gives_the_models_bubble(
    pp: int, vpp: int, groups: int, extra: int, schedule: str
) -> None:
    """Whatever the micro-batches (a partial last group included), the simulated order's idle time is the model's
    bubble, unscaled, and each stage holds at most the pipeline's in-flight count."""
    v = vpp if schedule == "interleaved" else 1
    m = groups * pp + extra % pp
    tp = 64 // (8 * pp)
    r = estimate("llama-3.1-8b", 64, tp=tp, pp=pp, vpp=v, schedule=schedule, global_batch=m * 8)
    assert r["layout"]["dp_replicate"] * r["layout"]["dp_shard"] == 8
    tl = r["timeline"]
    assert_decomposes(r)
    assert tl["bubble_scale"] == pytest.approx(1.0, rel=1e-9)
    assert tl["drawn_as"].startswith("the schedule's own order") and "scaled" not in tl["drawn_as"]
    if 2 * m * v * pp <= 800:  # nothing folded
        for mem in tl["memory"]:
            want = in_flight_chunks(schedule, p=pp, v=v, m=m, stage=mem["stage"])
            assert mem["most_chunks_held"] == want


def test_each_chunk_waits_for_the_one_before_it() -> None:
    """In the drawn interleaved order a chunk's forward starts after the previous stage's (or chunk's) forward
    of the same micro-batch has ended, and its backward after the next stage's backward."""
    tl = estimate("llama-3.1-8b", 64, tp=2, pp=4, vpp=2, schedule="interleaved", global_batch=64)["timeline"]
    p, v = tl["pp"], tl["vpp"]
    spans: dict[tuple[str, int, int, int], tuple[float, float]] = {}
    for row in tl["stages"]:
        for i in row["intervals"]:
            if i["kind"] in ("forward", "backward"):
                spans[(i["kind"], row["stage"], i["micro_batch"], i["chunk"])] = (i["start_s"], i["end_s"])
    assert len(spans) == 2 * p * v * tl["micro_batches"]
    for (kind, s, j, c), (start, _) in spans.items():
        if kind == "forward" and (s or c):
            before = spans[("forward", s - 1, j, c)] if s else spans[("forward", p - 1, j, c - 1)]
            assert start >= before[1] - 1e-12
        if kind == "backward" and (s < p - 1 or c < v - 1):
            after = spans[("backward", s + 1, j, c)] if s < p - 1 else spans[("backward", 0, j, c + 1)]
            assert start >= after[1] - 1e-12


def test_the_placement_names_who_shares_a_node() -> None:
    r = estimate("llama-3.1-8b", 64, tp=2, pp=4, global_batch=256)
    pl = r["timeline"]["placement"]
    assert pl["gpus_per_node"] == 8 and pl["nodes"] == 8
    assert pl["axes"]["tp"]["group_of_rank_0"] == [0, 1] and not pl["axes"]["tp"]["crosses_fabric"]
    assert pl["axes"]["pp"]["group_of_rank_0"] == [0, 16, 32, 48] and pl["axes"]["pp"]["crosses_fabric"]
    for axis, a in pl["axes"].items():
        assert a["crosses_fabric"] == r["placement"][axis]["crosses_fabric"]


def test_the_memory_peaks_are_memorys_own_stage_bills() -> None:
    kw = dict(tp=2, pp=4, vpp=2, schedule="interleaved")
    tl = estimate("llama-3.1-8b", 64, global_batch=256, **kw)["timeline"]
    bill = memory_report("llama-3.1-8b", gpu="h100-sxm", gpus=64, layout=LayoutRequest(**kw), global_batch=256)
    assert [m["peak_bytes"] for m in tl["memory"]] == [s["total_bytes"] for s in bill["stages"]]


def test_without_the_flag_there_is_no_timeline() -> None:
    r = estimate_report("llama-3.1-8b", gpu="h100-sxm", gpus=8, layout=LayoutRequest(tp=8))
    assert "timeline" not in r


def test_the_cli_draws_a_line_per_stage(capsys: pytest.CaptureFixture[str]) -> None:
    from meshplan.cli import main

    argv = ["estimate", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "64", "--tp", "2", "--pp", "4"]
    assert main([*argv, "--global-batch", "64", "--timeline"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("stage ")]
    assert len(lines) == 4 and all(ln.count("|") == 2 for ln in lines)
    gantt = [ln.split("|")[1] for ln in lines]
    assert all(len(g) == 72 for g in gantt)
    assert gantt[0][0] == "F" and gantt[3][0] == "."  # the last stage waits for the first forward to reach it
    assert "step timeline (1f1b, 8 micro-batches" in out


def test_the_api_adds_the_timeline_and_refuses_bad_input() -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from meshplan.server.app import create_app

    q = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 64, "tp": 2, "pp": 4, "global_batch": 64}
    with TestClient(create_app(), base_url="http://127.0.0.1") as client:
        got = client.get("/api/estimate", params=q | {"timeline": "true"})
        plain = client.get("/api/estimate", params=q)
        bad = client.get("/api/estimate", params=q | {"timeline": "sometimes"})
        odd = client.get("/api/estimate", params=q | {"timeline": "true", "pp": 3})
    assert got.status_code == 200 and "timeline" in got.json() and "timeline" not in plain.json()
    assert got.json()["timeline"]["totals"]["step_time_s"] == pytest.approx(got.json()["step_time_s"], rel=1e-9)
    for r in (bad, odd):
        assert 400 <= r.status_code < 500 and set(r.json()) == {"error"}


def test_data_parallel_traffic_hides_where_the_model_hides_it() -> None:
    """ZeRO-1 under a pipeline: the gradients' reduce runs beside the last backward, the parameters' gather beside
    the first forward; what hides and what is exposed together are the data-parallel traffic of the step."""
    r = estimate("llama-3.1-8b", 64, tp=2, pp=4, zero=1, global_batch=64)
    dp_traffic = sum(c["time_s_per_step"] for c in r["collectives"] if c["strategy"] in ("dp", "dp-experts"))
    for row in r["timeline"]["stages"]:
        chunks = [i for i in row["intervals"] if i["kind"] in ("forward", "backward") and i["what"] == "compute"]
        first_f = min(i["start_s"] for i in chunks if i["kind"] == "forward")
        last_b = max(i["start_s"] for i in chunks if i["kind"] == "backward")
        hidden = {i["what"]: i for i in row["hidden"] if i["axis"] == "dp"}
        assert hidden["the gradients' reduce, behind the last backward"]["start_s"] == last_b
        assert hidden["the parameters' gather, behind the first forward"]["start_s"] == first_f
        drawn = sum(i["end_s"] - i["start_s"] for i in hidden.values()) + row["totals"]["exposed_dp_s"]
        assert drawn == pytest.approx(dp_traffic, rel=1e-9)


def test_a_gather_inside_the_optimizer_step_is_drawn_exposed_whole() -> None:
    """ZeRO-1 under a PyTorch-native stack gathers the updated parameters inside the optimizer step: nothing of it is
    drawn beside the first forward, and what hides and what is exposed still make the step's data-parallel traffic."""
    r = estimate("llama-3.1-8b", 64, tp=2, pp=4, zero=1, global_batch=64, conditions={"stack": "deepspeed"})
    dp_traffic = sum(c["time_s_per_step"] for c in r["collectives"] if c["strategy"] in ("dp", "dp-experts"))
    gather = [c for c in r["collectives"] if c["strategy"] == "dp" and c["phase"] == "step"]
    assert len(gather) == 1 and gather[0]["time_s_per_step"] > 0
    assert_decomposes(r)
    for row in r["timeline"]["stages"]:
        hidden = {i["what"]: i for i in row["hidden"] if i["axis"] == "dp"}
        assert "the parameters' gather, behind the first forward" not in hidden
        assert row["totals"]["exposed_dp_s"] >= gather[0]["time_s_per_step"]
        drawn = sum(i["end_s"] - i["start_s"] for i in hidden.values()) + row["totals"]["exposed_dp_s"]
        assert drawn == pytest.approx(dp_traffic, rel=1e-9)
