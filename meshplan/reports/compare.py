"""``meshplan compare``: a plan against what its run measured, term by term.

The plan is ``meshplan estimate`` of the layout as typed (the same fields, reports/typed.py). What the run
measured comes from a PyTorch profiler trace (the step split into named terms: meshplan/traces/timeline.py), a
CUDA memory snapshot (live bytes by term, the allocator's reserve: traces/snapshot.py), logged numbers
(traces/logged.py) or the measured fields typed as flags (spec/schema/measured.py; a flag beats the logged file).
Each measured total is attributed to named terms and the rest is printed as unattributed; where the collectives
or the bytes held say the run used another layout, the report says so (reports/compare_layout.py). ``out``
writes the run in the file format ``meshplan calibrate`` reads (a list of ``{args, step_time_s,
peak_memory_bytes}``), through files.py's one safe writer; ``append`` adds it to an existing runs file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from meshplan.files import load_json_file, writable, write_text_safely
from meshplan.reports.compare_layout import layout_flags, predicted_calls
from meshplan.traces.kineto import read_trace
from meshplan.traces.logged import read_logged
from meshplan.traces.snapshot import MemorySnapshot, read_snapshot
from meshplan.traces.timeline import COLLECTIVE_KINDS, StepTerms, step_terms

MEASURED = ("step_time_s", "max_memory_allocated", "max_memory_reserved")
BILL_TERMS = {
    "parameters": ("weights_bytes", "adapter_weights_bytes"),
    "gradients": ("gradients_bytes",),
    "optimizer_state": ("optimizer_moments_bytes", "master_weights_bytes"),
    "activations": ("activations_bytes", "logits_bytes", "activation_workspace_bytes"),
    "comm_buffers": ("comm_buffers_bytes", "dequant_workspace_bytes"),
}
"""Each snapshot term and the bill's keys (reports/estimate.py ``per_gpu``) that predict it."""


def compare_report(
    values: Mapping[str, Any],
    *,
    trace: str | None = None,
    snapshot: str | None = None,
    logged: str | None = None,
    out: str | None = None,
    append: bool = False,
    force: bool = False,
) -> dict[str, Any]:
    """The comparison of ``values`` (every field ``estimate`` takes, and the measured ones) with the run's files."""
    from meshplan.reports.typed import estimate_defaults, estimate_fields, estimate_from_values

    numbers = {k: values.get(k) for k in MEASURED}
    if trace is None and snapshot is None and logged is None and all(v is None for v in numbers.values()):
        raise ValueError("nothing measured to compare: give --trace, --snapshot, --logged or a measured number")
    inputs = [values.get("model"), trace, snapshot, logged]
    if out:
        writable(out, what="--out", inputs=inputs, force=force or append)  # refused before the work, not after
    plan = estimate_from_values({k: v for k, v in values.items() if k not in MEASURED})
    if logged is not None:
        numbers = {k: numbers[k] if numbers[k] is not None else v for k, v in read_logged(logged).items()} | {
            k: v for k, v in numbers.items() if v is not None
        }
    report = compare_with_plan(plan, numbers, trace=trace, snapshot=snapshot, logged=logged)
    run = _calibration_run(values, estimate_fields(), estimate_defaults(), report["time"], report["memory"])
    report["calibration_run"] = run
    if out:
        report["runs_file"] = _write_runs(out, run, inputs, append=append, force=force)
    return report


def compare_with_plan(
    plan: Mapping[str, Any],
    numbers: Mapping[str, float | None],
    *,
    trace: str | None = None,
    snapshot: str | None = None,
    logged: str | None = None,
) -> dict[str, Any]:
    """The comparison of an estimate report ``plan`` with measured ``numbers`` (``MEASURED``, None where not
    measured) and the run's trace and snapshot files."""
    read = read_trace(trace) if trace is not None else None
    terms = step_terms(read) if read is not None else None
    snap = read_snapshot(snapshot) if snapshot is not None else None
    time = _time(plan, terms, numbers.get("step_time_s"))
    memory = _memory(plan, snap, numbers, rank=read.rank if read is not None else None)
    held = {  # bytes the snapshot's frames give to a term, where the history was recorded
        r["term"]: (r["measured_bytes"], r["predicted_bytes"])
        for r in memory["terms"]
        if r["term"] in ("parameters", "optimizer_state") and snap is not None and snap.framed_blocks
    }
    return {
        "model": plan["model"],
        "gpu": plan["gpu"],
        "gpus": plan["gpus"],
        "layout": plan["layout"],
        "measured_from": {"trace": trace, "snapshot": snapshot, "logged": logged},
        "time": time,
        "memory": memory,
        "layout_flags": layout_flags(
            plan["layout"], predicted_calls(plan["collectives"]), terms.calls if terms else None, held
        ),
    }


def _ratio(measured: float | None, predicted: float | None) -> float | None:
    return measured / predicted if measured is not None and predicted else None


def _row(term: str, measured: float | None, predicted: float | None, unit: str, note: str = "") -> dict[str, Any]:
    return {
        "term": term,
        f"measured_{unit}": measured,
        f"predicted_{unit}": predicted,
        "measured_over_predicted": _ratio(measured, predicted),
        "note": note,
    }


def _time(plan: Mapping[str, Any], terms: StepTerms | None, logged_step_s: float | None) -> dict[str, Any]:
    b = plan["breakdown"]
    by_kind: dict[str, list[float]] = {k: [0.0, 0.0] for k in COLLECTIVE_KINDS}
    for c in plan["collectives"]:
        if int(c["group_size"]) > 1:
            by_kind[c["op"]][0] += float(c["time_s_per_step"])
            by_kind[c["op"]][1] += float(c["exposed_s_per_step"])
    step_s = logged_step_s if logged_step_s is not None else terms.step_s if terms else None
    out: dict[str, Any] = {
        "step_time_s_measured": step_s,
        "step_time_s_predicted": plan["step_time_s"],
        "measured_over_predicted": _ratio(step_s, plan["step_time_s"]),
        "step_from": "logged" if logged_step_s is not None else "trace" if terms else None,
    }
    if terms is None:
        out["terms"] = [_row("step", step_s, plan["step_time_s"], "s")]
        return out
    s = terms.seconds
    compute = sum(s[k] for k in ("gemm", "attention", "other_compute"))
    rows = [
        _row("compute", compute, b["compute_s"], "s", "every compute kernel (CPU: op) on the critical path"),
        _row("compute: GEMM", s["gemm"], None, "s"),
        _row("compute: attention", s["attention"], None, "s"),
        _row("compute: other kernels", s["other_compute"], None, "s", "elementwise, norms, copies"),
        _row("optimizer", s["optimizer"], b["optimizer_s"], "s"),
        _row("exposed communication", terms.exposed_comm_s, b["exposed_comm_s"], "s", "no compute runs meanwhile"),
    ]
    for kind in COLLECTIVE_KINDS:
        total, exposed = by_kind[kind]
        if total or terms.collective_s[kind]:
            rows.append(_row(f"{kind}", terms.collective_s[kind], total, "s", "whole time, overlapped or not"))
            rows.append(_row(f"{kind}: exposed", s[f"exposed_{kind}"], exposed, "s"))
    idle = s["idle"] if terms.on_device else s["framework"] + s["host"]
    where = "GPU idle: host gaps, launch waits" if terms.on_device else "framework (autograd, hooks) and Python"
    rows.append(_row("idle, bubble and host", idle, b["bubble_s"] + b["host_s"], "s", where))
    if not terms.on_device:
        rows.append(_row("host: framework", s["framework"], None, "s", "autograd engine, DDP/FSDP hooks, calls"))
        rows.append(_row("host: Python between ops", s["host"], None, "s"))
    named = terms.step_s - s.get("unattributed", 0.0)
    rows.append(_row("unattributed", s.get("unattributed", 0.0), None, "s", "ops no rule names"))
    out |= {
        "trace_step_s": terms.step_s,
        "trace_steps": terms.steps,
        "trace_on_device": terms.on_device,
        "attributed_fraction": named / terms.step_s,
        "terms": rows,
        "calls_per_step": [
            {
                "collective": k,
                "measured": terms.calls[k],
                "measured_in_backward": terms.calls_in_backward[k],
                "predicted": predicted_calls(plan["collectives"]).get(k, 0.0),
            }
            for k in COLLECTIVE_KINDS
            if terms.calls[k] or predicted_calls(plan["collectives"]).get(k)
        ],
    }
    return out


def stage_of(plan: Mapping[str, Any], rank: int | None) -> tuple[int, str]:
    """The pipeline stage whose bill a rank's memory is held against, and why that one: the rank's own stage where
    the trace names the rank (its index along the PP axis, by the axis's stride in the placement), else the
    heaviest stage (the bill's ``per_gpu``)."""
    pp = plan["placement"].get("pp")
    if rank is None or pp is None:
        return int(plan["heaviest_stage"]), "the heaviest stage"
    if rank >= int(plan["gpus"]):
        raise ValueError(f"the trace's rank {rank} is outside the plan's {plan['gpus']} GPUs")
    return (rank // int(pp["stride"])) % int(pp["size"]), f"rank {rank}'s stage (the trace's rank)"


def _memory(
    plan: Mapping[str, Any], snap: MemorySnapshot | None, numbers: Mapping[str, Any], *, rank: int | None = None
) -> dict[str, Any]:
    stage, why = stage_of(plan, rank)
    bill = plan["stages"][stage]
    allocated = snap.allocated_bytes if snap else numbers.get("max_memory_allocated")
    reserved = snap.reserved_bytes if snap else numbers.get("max_memory_reserved")
    if snap is None and numbers.get("max_memory_allocated") is None and reserved is None:
        return {"terms": [], "peak_bytes_measured": None, "stage_billed": stage, "stage_billed_is": why}
    rows = []
    if snap is not None:
        for term, keys in BILL_TERMS.items():
            rows.append(_row(term, snap.by_term[term], sum(float(bill[k]) for k in keys), "bytes"))
        rows.append(_row("unattributed", snap.by_term["unattributed"], None, "bytes", "blocks without named frames"))
    rows.append(_row("allocated", allocated, bill["allocated_bytes"], "bytes", "memory_allocated"))
    reserve = reserved - allocated if reserved is not None and allocated is not None else None
    predicted_reserve = float(bill["reserved_bytes"]) - float(bill["allocated_bytes"])
    rows.append(
        _row("allocator reserve and fragmentation", reserve, predicted_reserve, "bytes", "reserved - allocated")
    )
    rows.append(_row("reserved", reserved, bill["reserved_bytes"], "bytes", "memory_reserved: the allocator's peak"))
    outside = float(bill["framework_bytes"]) + float(bill["runtime_reserve_bytes"])
    rows.append(_row("outside the allocator", None, outside, "bytes", "CUDA context, NCCL: no snapshot sees it"))
    peak = reserved if reserved is not None else allocated
    unattributed = snap.by_term["unattributed"] if snap else 0
    out: dict[str, Any] = {
        "peak_bytes_measured": peak,
        "peak_bytes_predicted": float(bill["reserved_bytes"])
        if reserved is not None
        else float(bill["allocated_bytes"]),
        "attributed_fraction": (peak - unattributed) / peak if snap is not None and peak else None,
        "terms": rows,
        "stage_billed": stage,
        "stage_billed_is": why,
        "activations_by_stage_predicted": [float(s["activations_bytes"]) for s in plan["stages"]],
    }
    if snap is not None:
        out |= {
            "snapshot_segments": snap.segments,
            "snapshot_framed_blocks": snap.framed_blocks,
            "snapshot_largest_free_block_bytes": snap.largest_free_block_bytes,
            "snapshot_history_peak_allocated_bytes": snap.peak_allocated_bytes,
            "snapshot_history_peak_reserved_bytes": snap.peak_reserved_bytes,
        }
    return out


def _calibration_run(
    values: Mapping[str, Any],
    fields: Any,
    defaults: Mapping[str, Any],
    time: Mapping[str, Any],
    memory: Mapping[str, Any],
) -> dict[str, Any] | None:
    """The run as one entry of ``meshplan calibrate``'s runs file (None without a measured step time)."""
    from meshplan.spec.argv import flag_args

    if time["step_time_s_measured"] is None:
        return None
    given = {
        f.name: values[f.name]
        for f in fields
        if f.name not in ("model", "profile") and values.get(f.name) != defaults.get(f.name)
    }
    run: dict[str, Any] = {
        "args": [str(values["model"]), *flag_args(given)],
        "step_time_s": time["step_time_s_measured"],
    }
    if memory.get("peak_bytes_measured"):
        run["peak_memory_bytes"] = float(memory["peak_bytes_measured"])
    return run


def _write_runs(out: str, run: dict[str, Any] | None, inputs: list[Any], *, append: bool, force: bool) -> str:
    if run is None:
        raise ValueError(
            "--out: no measured step time to write (calibrate fits step times): give --trace, --logged or --step-time-s"
        )
    runs: list[Any] = []
    if append and Path(out).exists():
        runs = load_json_file(out, what="runs file")
        if not isinstance(runs, list):
            raise ValueError(f"--append: {out} is not a runs file (a JSON list of runs)")
    write_text_safely(
        out, json.dumps([*runs, run], indent=1) + "\n", what="--out", inputs=inputs, force=force or append
    )
    return out
