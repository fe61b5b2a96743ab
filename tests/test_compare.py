"""meshplan compare: a plan against a real run's files (tests/data/traces/, from `meshplan check`'s own gloo runs;
their README says how each was made), and hostile files refused with one line."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from meshplan.cli import main
from meshplan.traces.kineto import MAX_TRACE_BYTES, Span, Trace, read_trace
from meshplan.traces.snapshot import read_snapshot, summarize
from meshplan.traces.timeline import step_terms

DATA = Path(__file__).parent / "data" / "traces"
MODEL = str(DATA / "tiny-llama.toml")
RUN = ["--gpu", "h100-sxm", "--gpus", "2", "--seq", "16", "--global-batch", "4", "--micro-batch", "2"]
RUN += ["--precision", "fp32"]
ZERO3 = ["--dp-shard", "2", "--zero", "3", "--stack", "torchtitan"]
ZERO1 = ["--dp-shard", "2", "--zero", "1"]


def _files(layout: str) -> list[str]:
    return [
        "--trace",
        str(DATA / f"{layout}_rank0.trace.json"),
        "--snapshot",
        str(DATA / f"{layout}_rank0.snapshot.pickle"),
    ]


def _compare(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["compare", MODEL, *RUN, *args, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["compare", MODEL, *RUN, *ZERO3, *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def _raw_events(layout: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads((DATA / f"{layout}_rank0.trace.json").read_text())["traceEvents"]
    return events


def test_fsdp_run_against_its_plan_attributes_the_step_and_the_peak(capsys: pytest.CaptureFixture[str]) -> None:
    r = _compare(capsys, *ZERO3, *_files("fsdp"))
    events = _raw_events("fsdp")
    # the step, re-derived from the file: the profiler's one ProfilerStep annotation
    (step,) = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
    assert r["time"]["step_time_s_measured"] == pytest.approx(step["dur"] * 1e-6, rel=1e-9)
    assert r["time"]["attributed_fraction"] >= 0.95
    measured = {row["term"]: row["measured_s"] for row in r["time"]["terms"]}
    parts = ("compute", "optimizer", "exposed communication", "idle, bubble and host", "unattributed")
    assert sum(measured[p] for p in parts) == pytest.approx(r["time"]["step_time_s_measured"], rel=1e-9)
    # the collective calls, counted from the file: FSDP2 gathers the root and 4 layers in forward, 4 in backward
    gathers = sum(1 for e in events if e.get("name") == "c10d::_allgather_base_")
    scatters = sum(1 for e in events if e.get("name") == "c10d::_reduce_scatter_base_")
    calls = {c["collective"]: c["measured"] for c in r["time"]["calls_per_step"]}
    assert (calls["all_gather"], calls["reduce_scatter"]) == (gathers, scatters) == (9, 5)
    # the peak, re-derived from the snapshot with a plain unpickler (the file is ours)
    raw = pickle.loads((DATA / "fsdp_rank0.snapshot.pickle").read_bytes())
    reserved = sum(s["total_size"] for s in raw["segments"])
    allocated = sum(b["size"] for s in raw["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    assert r["memory"]["peak_bytes_measured"] == reserved
    assert r["memory"]["attributed_fraction"] >= 0.95
    rows = {row["term"]: row for row in r["memory"]["terms"]}
    assert rows["allocated"]["measured_bytes"] == allocated
    assert rows["allocator reserve and fragmentation"]["measured_bytes"] == reserved - allocated
    # what the run held against the bill: the sharded parameters and AdamW's two moments, within the allocator's
    # 512-byte rounding of each of the ~40 tensors and the rotary buffers
    assert rows["parameters"]["measured_over_predicted"] == pytest.approx(1.0, abs=0.2)
    assert rows["optimizer_state"]["measured_over_predicted"] == pytest.approx(1.0, abs=0.2)
    assert r["layout_flags"] == []


def test_ddp_run_is_flagged_against_a_zero3_plan(capsys: pytest.CaptureFixture[str]) -> None:
    r = _compare(capsys, *ZERO3, *_files("ddp"))
    flags = "\n".join(r["layout_flags"])
    assert "no reduce-scatter in the run" in flags
    assert "parameters: the run holds" in flags  # the whole model on each rank: twice the ZeRO-3 shard
    assert r["time"]["attributed_fraction"] >= 0.95


def test_fsdp_run_is_flagged_against_a_zero1_plan(capsys: pytest.CaptureFixture[str]) -> None:
    r = _compare(capsys, *ZERO1, *_files("fsdp"))
    assert any("as ZeRO-3/FSDP does, where the plan says ZeRO-1" in f for f in r["layout_flags"])


def test_logged_numbers_and_flags_write_a_runs_file_calibrate_reads(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from meshplan.reports.typed import estimate_defaults, estimate_fields, estimate_from_values
    from meshplan.spec.argv import parse_words
    from meshplan.validation.calibrate import load_runs

    out = tmp_path / "runs.json"
    logged = tmp_path / "steps.csv"
    logged.write_text("step_time_s,max_memory_allocated,max_memory_reserved\n0.5,100,200\n0.7,150,180\n0.6,120,260\n")
    r = _compare(capsys, *ZERO3, "--logged", str(logged), "--out", str(out))
    assert r["time"]["step_time_s_measured"] == 0.6  # the median step
    assert r["memory"]["peak_bytes_measured"] == 260  # the most reserved
    r2 = _compare(capsys, *ZERO3, "--step-time-s", "0.25", "--out", str(out), "--append")
    assert r2["time"]["step_time_s_measured"] == 0.25
    runs = load_runs(out)
    assert [run.measured for run in runs] == [0.6, 0.25]
    assert runs[0].peak_memory_bytes == 260
    # the words written are estimate's: the same plan as compare's
    values = parse_words(runs[0].args, fields=estimate_fields(), defaults=estimate_defaults())
    assert estimate_from_values(values)["step_time_s"] == pytest.approx(r["time"]["step_time_s_predicted"])
    assert main(["compare", MODEL, *RUN, *ZERO3, "--step-time-s", "1", "--out", str(out)]) == 2  # exists: --force


def test_gpu_trace_exposed_communication_is_interval_arithmetic(tmp_path: Path) -> None:
    def kernel(name: str, stream: int, start: float, end: float) -> Span:
        return Span(name=name, cat="kernel", lane=f"0:{stream}", start_us=start, end_us=end)

    spans = (
        Span(name="ProfilerStep#3", cat="user_annotation", lane="1:1", start_us=0, end_us=5),
        kernel("sm90_xmma_gemm_bf16", 7, 10, 30),
        kernel("flash_fwd_kernel", 7, 50, 60),
        kernel("ncclDevKernel_AllGather_RING_LL", 20, 20, 45),  # 10 us under the GEMM, 5 exposed... and idle
        kernel("ncclDevKernel_ReduceScatter_Sum", 20, 55, 80),
        kernel("vectorized_elementwise_kernel", 7, 85, 100),
    )
    terms = step_terms(Trace(spans=spans, events=len(spans)))
    assert terms.step_s == pytest.approx(90e-6)  # first kernel to last
    s = {k: v * 1e6 for k, v in terms.seconds.items()}
    assert s["gemm"] == pytest.approx(20) and s["attention"] == pytest.approx(10)
    assert s["exposed_all_gather"] == pytest.approx(15)  # 30 to 45
    assert s["exposed_reduce_scatter"] == pytest.approx(20)  # 60 to 80
    assert s["other_compute"] == pytest.approx(15)
    assert s["idle"] == pytest.approx(10)  # 45 to 50, 80 to 85
    assert terms.collective_s["all_gather"] * 1e6 == pytest.approx(25)
    assert sum(terms.seconds.values()) == pytest.approx(terms.step_s)


def test_snapshot_without_frames_leaves_its_blocks_unattributed() -> None:
    raw = {
        "segments": [
            {
                "total_size": 2 << 20,
                "blocks": [
                    {"size": 1 << 20, "state": "active_allocated"},
                    {"size": 1 << 19, "state": "active_pending_free"},
                    {"size": 1 << 19, "state": "inactive"},
                ],
            }
        ],
        "device_traces": [[{"action": "alloc", "size": 1 << 19}, {"action": "free_completed", "size": 1 << 19}]],
    }
    snap = summarize(raw)
    assert (snap.reserved_bytes, snap.allocated_bytes, snap.by_term["unattributed"]) == (2 << 20, 1 << 20, 1 << 20)
    assert snap.peak_allocated_bytes == (1 << 20) + (1 << 19)  # replayed: the freed half-MiB was live once


def test_foreign_pickle_class_is_refused_with_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    hostile = tmp_path / "snap.pickle"
    hostile.write_bytes(pickle.dumps({"segments": [os.system]}))
    err = _refused(capsys, "--snapshot", str(hostile))
    assert "refused: the pickle names posix.system" in err
    nested = tmp_path / "ordered.pickle"
    from collections import OrderedDict

    nested.write_bytes(pickle.dumps(OrderedDict(segments=[])))
    assert "collections.OrderedDict" in _refused(capsys, "--snapshot", str(nested))


def test_the_hostile_snapshot_never_runs(tmp_path: Path) -> None:
    """A pickle whose reduce calls a function: refused before the call, in a fresh process (nothing imported)."""
    marker = tmp_path / "ran"
    payload = f"import pathlib; pathlib.Path({str(marker)!r}).write_text('x')"

    class Exploit:
        def __reduce__(self) -> tuple[Any, ...]:
            return (exec, (payload,))

    hostile = tmp_path / "exploit.pickle"
    hostile.write_bytes(pickle.dumps({"segments": [], "x": Exploit()}))
    with pytest.raises(ValueError, match=r"refused: the pickle names builtins\.exec"):
        read_snapshot(hostile)
    assert not marker.exists()


def test_truncated_files_are_refused_with_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = (DATA / "fsdp_rank0.trace.json").read_text()
    cut = tmp_path / "cut.json"
    cut.write_text(text[: len(text) // 2])
    assert "ends early (a truncated file?)" in _refused(capsys, "--trace", str(cut))
    data = (DATA / "fsdp_rank0.snapshot.pickle").read_bytes()
    cut_pickle = tmp_path / "cut.pickle"
    cut_pickle.write_bytes(data[: len(data) // 2])
    assert "not a readable pickle" in _refused(capsys, "--snapshot", str(cut_pickle))


def test_oversized_and_crowded_traces_are_refused_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    big = tmp_path / "big.json"
    with big.open("wb") as f:  # sparse: refused by its size before a byte is read
        f.truncate(MAX_TRACE_BYTES + 1)
    assert "the limit is" in _refused(capsys, "--trace", str(big))
    crowded = tmp_path / "crowded.json"
    crowded.write_text('{"traceEvents":[' + ",".join(['{"ph":"i"}'] * 10**6) + "]}")
    assert "holds over 500,000 events" in _refused(capsys, "--trace", str(crowded))
    # the count of events, not the keys, decides: spaced keys are counted as they are decoded
    spaced = tmp_path / "spaced.json"
    spaced.write_text('{"traceEvents":[' + ",".join(['{"ph" : "i"}'] * 30) + "]}")
    with pytest.raises(ValueError, match="holds over 20 events"):
        read_trace(spaced, max_events=20)


def test_nothing_measured_and_bad_logged_numbers(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert "nothing measured" in _refused(capsys)
    logged = tmp_path / "log.json"
    logged.write_text('{"step_time_s": 1, "tokens": 5}')
    assert "unknown keys tokens" in _refused(capsys, "--logged", str(logged))
    logged.write_text('{"step_time_s": -1}')
    assert "positive number" in _refused(capsys, "--logged", str(logged))


def test_check_writes_the_files_compare_reads(tmp_path: Path) -> None:
    """make_traces.py's path, end to end on 2 gloo ranks: real files, read back (slow: torch processes)."""
    if os.environ.get("MESHPLAN_SLOW_TESTS") != "1":
        pytest.skip("set MESHPLAN_SLOW_TESTS=1: launches torch processes (tests/data/traces/ holds their output)")
    code = f"from meshplan.check.runner import run_check; run_check(2, ['fsdp'], trace_dir={str(tmp_path)!r})"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, cwd=Path(__file__).parents[1])
    assert step_terms(read_trace(tmp_path / "fsdp_rank1.trace.json")).calls["all_gather"] == 9
    assert read_snapshot(tmp_path / "fsdp_rank1.snapshot.pickle").by_term["activations"] > 0


def test_snapshot_opcodes_that_build_more_than_plain_data_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(b"\x80\x04]r\xff\xff\xff\x7f.")  # a list memoized at slot 2^31 - 1: the unpickler would allocate
    with pytest.raises(ValueError, match="memo index 2,147,483,647"):
        read_snapshot(path)
    path.write_bytes(pickle.dumps({"segments": [bytearray(b"x")]}, protocol=5))  # out-of-band buffer data
    with pytest.raises(ValueError, match="refused: the pickle names the opcode BYTEARRAY8"):
        read_snapshot(path)
    path.write_bytes(
        pickle.dumps({"segments": [{"total_size": 10, "blocks": [{"size": 20, "state": "active_allocated"}]}]})
    )
    with pytest.raises(ValueError, match="allocated blocks"):
        read_snapshot(path)


def test_a_kineto_gpu_trace_file_is_read_by_stream(tmp_path: Path) -> None:
    """A GPU trace as Kineto writes one (kernels on pid = device, tid = stream; host ops on the process's threads)."""

    def event(name: str, cat: str, pid: int, tid: int, ts: float, dur: float, **args: Any) -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}

    events = [
        event("ProfilerStep#7", "user_annotation", 100, 100, 0, 200),
        event("c10d::allreduce_", "cpu_op", 100, 100, 5, 2),
        event("nccl:all_reduce", "user_annotation", 100, 100, 5, 2),
        event("ampere_bf16_s16816gemm_bf16_128x128", "kernel", 0, 7, 10, 100, stream=7),
        event("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "kernel", 0, 20, 50, 100, stream=20),
        {"ph": "X", "cat": "kernel", "name": "bad", "pid": 0, "tid": 7, "ts": "NaN", "dur": 1},  # dropped
        {"ph": "f", "cat": "ac2g", "id": 1, "pid": 0, "tid": 7, "ts": 10},
    ]
    path = tmp_path / "gpu.json"
    path.write_text(
        json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 3, "world_size": 8}, "traceEvents": events})
    )
    trace = read_trace(path)
    assert (trace.rank, trace.world_size, trace.events, trace.on_device) == (3, 8, 7, True)
    terms = step_terms(trace)
    assert terms.step_s == pytest.approx(140e-6)  # kernels from 10 to 150
    assert terms.seconds["gemm"] == pytest.approx(100e-6)
    assert terms.seconds["exposed_all_reduce"] == pytest.approx(40e-6)  # 110 to 150
    assert terms.collective_s["all_reduce"] == pytest.approx(100e-6)
    assert terms.calls["all_reduce"] == 1  # the c10d op, not also the nccl: annotation


def test_a_pipeline_rank_is_held_against_its_own_stage() -> None:
    from meshplan.reports.compare import stage_of
    from meshplan.reports.typed import estimate_defaults, estimate_fields, estimate_from_values
    from meshplan.spec.argv import parse_words

    words = [MODEL, *RUN, "--gpus", "4", "--pp", "2", "--dp-shard", "2", "--zero", "1", "--global-batch", "8"]
    plan = estimate_from_values(parse_words(words, fields=estimate_fields(), defaults=estimate_defaults()))
    # PP is the outermost axis (stride 2 on 4 GPUs): ranks 0 and 1 hold stage 0, ranks 2 and 3 stage 1
    assert [stage_of(plan, r)[0] for r in (0, 1, 2, 3)] == [0, 0, 1, 1]
    assert stage_of(plan, None)[0] == plan["heaviest_stage"]
    first, last = plan["stages"]
    assert first["activations_bytes"] > last["activations_bytes"]  # 1F1B: the first stage holds pp micro-batches
    with pytest.raises(ValueError, match="outside the plan's 4 GPUs"):
        stage_of(plan, 4)


def test_a_zero1_run_is_flagged_against_a_zero3_plan() -> None:
    """Megatron's distributed optimizer: a reduce-scatter and an all-gather per bucket, once per step."""
    from meshplan.reports.compare_layout import layout_flags

    plan = {"all_gather": 18.0, "reduce_scatter": 9.0}  # ZeRO-3: each unit gathered for forward and backward
    flags = layout_flags({"zero": 3}, plan, {"all_gather": 9.0, "reduce_scatter": 9.0})
    assert len(flags) == 1 and "once per step as ZeRO-1/2 does, where the plan (ZeRO-3)" in flags[0]
    assert layout_flags({"zero": 3}, plan, {"all_gather": 17.0, "reduce_scatter": 9.0}) == []
