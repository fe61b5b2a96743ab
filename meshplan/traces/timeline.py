"""A profiled step split into named terms by interval arithmetic.

Every instant of the measured step goes to exactly one term, so the terms add up to the step:
- on a GPU trace, an instant when a compute kernel runs on any stream is compute (GEMM, attention, optimizer or
  other kernels, in that order where several run at once); else, when a collective's kernel runs, it is that
  collective's exposed time (communication no compute hides); else the GPU is idle (host gaps, launch latency,
  waits on a pipeline peer outside a kernel);
- on a CPU trace (a gloo run: the collectives run on gloo's own threads), an instant when the main thread runs a
  compute op is compute, found as the innermost op then (its own class, or its nearest classified parent's;
  inside the optimizer's step everything is the optimizer); else, when a gloo thread runs a collective, exposed
  communication; else the main thread's own class: framework (autograd's engine, DDP and FSDP hooks, collective
  calls and waits), host (Python between ops) or unattributed (an op no rule names).
Each collective's whole time (overlapped or not) is the union of its kernels' (or gloo spans') intervals, and its
calls are counted on the host side (``c10d::`` ops, else the ``nccl:`` annotations, else the kernels).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from meshplan.traces.kineto import Span, Trace

COLLECTIVE_KINDS = ("all_gather", "reduce_scatter", "all_reduce", "send_recv", "all_to_all", "broadcast")
COMPUTE_TERMS = ("gemm", "attention", "optimizer", "other_compute")
HOST_TERMS = ("framework", "host", "unattributed")
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_KIND_PATTERNS = (
    ("reduce_scatter", ("reducescatter",)),
    ("all_gather", ("allgather",)),
    ("all_reduce", ("allreduce",)),
    ("all_to_all", ("alltoall",)),
    ("send_recv", ("sendrecv", "send", "recv")),
    ("broadcast", ("broadcast",)),
)
_ATTENTION = ("flash", "fmha", "attention", "attn", "sdpa", "scaled_dot_product")
_GEMM: tuple[str, ...] = (
    "gemm",
    "cutlass",
    "xmma",
    "nvjet",
    "cublas",
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
)
_GEMM += ("aten::_scaled_mm", "aten::_grouped_mm", "aten::matmul")
_OPTIMIZER = ("optimizer.step", "multi_tensor_apply", "fused_adam", "adamw", "_foreach_")
_FRAMEWORK: tuple[str, ...] = (
    "autograd::",
    "distributeddataparallel",
    "fsdp::",
    "torch::autograd",
    "pythonsubclass",
    "detach",
)
_FRAMEWORK += ("c10d::", "record_param_comms", "nccl:", "gloo:", "optimizer.zero_grad", "backward", "register")
_FRAMEWORK += ("dtensor", "redistribute", "ddp", "reducer", "pipelin", "schedule")
_STEP = re.compile(r"ProfilerStep#\d+$")


def collective_kind(name: str) -> str | None:
    """The collective a kernel, gloo span or c10d op name is (None: not a collective)."""
    flat = name.lower().replace("_", "")
    if not flat.startswith(("nccl", "gloo", "c10d::", "recordparamcomms")):
        return None
    for kind, needles in _KIND_PATTERNS:
        if any(n in flat for n in needles):
            return kind
    return None


def op_class(name: str) -> str | None:
    """The term an op or kernel's own time belongs to (None: no rule names it)."""
    low = name.lower()
    if low.startswith(_OPTIMIZER) or any(k in low for k in ("multi_tensor_apply", "fused_adam")):
        return "optimizer"
    if any(k in low for k in _ATTENTION) and not low.startswith("autograd::"):
        return "attention"
    if any(k in low for k in _GEMM):
        return "gemm"
    if _STEP.match(name):
        return "host"
    if any(k in low for k in _FRAMEWORK):
        return "framework"
    if low.startswith(("aten::", "fsdp::")):
        return "other_compute"
    return None


def _kernel_class(span: Span) -> str:
    if span.cat != "kernel":
        return "other_compute"  # memcpy, memset
    own = op_class(span.name)
    return own if own in ("gemm", "attention", "optimizer") else "other_compute"


@dataclass(frozen=True, slots=True)
class StepTerms:
    """One profiled step, measured: seconds per step, each instant counted once."""

    step_s: float
    steps: int
    on_device: bool
    seconds: dict[str, float]
    """The step's partition: compute terms, ``exposed_<kind>`` for each collective, and ``idle`` (GPU) or the host
    terms (CPU). Adds up to ``step_s``."""
    collective_s: dict[str, float]
    """Each collective kind's whole time per step, overlapped or not."""
    calls: dict[str, float]
    """Each collective kind's calls per step."""
    calls_in_backward: dict[str, float]
    """Of those, the calls issued after the first autograd op of the step (per step)."""

    @property
    def exposed_comm_s(self) -> float:
        return sum(v for k, v in self.seconds.items() if k.startswith("exposed_"))


def _union(intervals: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _sweep(
    labelled: Sequence[tuple[float, float, str]], order: Sequence[str], lo: float, hi: float, rest: str
) -> dict[str, float]:
    """Time from ``lo`` to ``hi`` given to the first label of ``order`` active at each instant (``rest``: none)."""
    points: list[tuple[float, int, str]] = []
    for a, b, label in labelled:
        a, b = max(a, lo), min(b, hi)
        if b > a:
            points += [(a, 1, label), (b, -1, label)]
    points.sort()
    active: Counter[str] = Counter()
    out: dict[str, float] = dict.fromkeys([*order, rest], 0.0)
    t = lo
    for time, delta, label in points:
        if time > t:
            top = next((name for name in order if active[name] > 0), rest)
            out[top] += time - t
            t = time
        active[label] += delta
    out[rest] += max(hi - t, 0.0)
    return out


def _flatten(spans: Sequence[Span], lo: float, hi: float) -> list[tuple[float, float, str]]:
    """One thread's nested ops as flat segments, each labelled with its innermost op's term (``host`` where no op
    runs)."""
    out: list[tuple[float, float, str]] = []
    stack: list[tuple[float, str]] = []
    t = lo

    def emit(until: float) -> None:
        nonlocal t
        if until > t:
            out.append((t, until, stack[-1][1] if stack else "host"))
            t = until

    for s in sorted(spans, key=lambda s: (s.start_us, -s.end_us)):
        if s.end_us <= lo or s.start_us >= hi:
            continue
        while stack and stack[-1][0] <= s.start_us:
            emit(stack[-1][0])
            stack.pop()
        emit(max(s.start_us, lo))
        parent_end, parent = stack[-1] if stack else (hi, None)
        own = op_class(s.name)
        label = (
            "optimizer"
            if parent == "optimizer"
            else own
            if own is not None and not (own == "framework" and parent in COMPUTE_TERMS)
            else parent
            if parent not in (None, "host")
            else "unattributed"
        )
        stack.append((min(s.end_us, parent_end), label))
    while stack:
        emit(stack[-1][0])
        stack.pop()
    emit(hi)
    return out


def _window(trace: Trace, main: str | None) -> tuple[float, float, int]:
    steps = sorted((s for s in trace.spans if _STEP.match(s.name)), key=lambda s: s.start_us)
    device = [s for s in trace.spans if s.cat in DEVICE_CATEGORIES]
    if trace.on_device:
        first = steps[0].start_us if steps else float("-inf")
        inside = [s for s in device if s.start_us >= first] or device
        return min(s.start_us for s in inside), max(s.end_us for s in inside), max(len(steps), 1)
    if steps:
        return steps[0].start_us, steps[-1].end_us, len(steps)
    mine = [s for s in trace.spans if s.lane == main]
    return min(s.start_us for s in mine), max(s.end_us for s in mine), 1


def _host_window(trace: Trace, lo: float, hi: float) -> tuple[float, float]:
    """The profiled steps on the host (where the calls that launch a GPU step's kernels are), else ``lo``-``hi``."""
    steps = [s for s in trace.spans if _STEP.match(s.name)]
    if not steps:
        return lo, hi
    return min(s.start_us for s in steps), max(s.end_us for s in steps)


def _main_lane(trace: Trace) -> str | None:
    steps = [s.lane for s in trace.spans if _STEP.match(s.name)]
    if steps:
        return steps[0]
    ops = Counter(s.lane for s in trace.spans if s.cat == "cpu_op")
    return ops.most_common(1)[0][0] if ops else None


def _calls(trace: Trace, main: str | None, work: list[tuple[Span, str]]) -> list[tuple[float, str]]:
    """Each collective call (start, kind), counted once on the host side where the trace shows it."""
    host = [s for s in trace.spans if s.lane == main]
    for prefix in ("c10d::", "nccl:"):
        calls = [(s.start_us, k) for s in host if s.name.startswith(prefix) and (k := collective_kind(s.name))]
        if calls:
            return sorted(calls)
    return sorted((s.start_us, kind) for s, kind in work)


def step_terms(trace: Trace) -> StepTerms:
    """The trace's step, measured, split into named terms (see the module's docstring)."""
    main = _main_lane(trace)
    lo, hi, steps = _window(trace, main)
    if hi <= lo:
        raise ValueError("the trace's step has no duration")
    if trace.on_device:
        work = [(s, k) for s in trace.spans if s.cat == "kernel" and (k := collective_kind(s.name))]
    else:
        work = [(s, k) for s in trace.spans if s.lane != main and (k := collective_kind(s.name))]
    calls = _calls(trace, main, work)
    work = _relabel(work, [k for _t, k in calls])
    comm = [(s.start_us, s.end_us, f"exposed_{k}") for s, k in work]
    if trace.on_device:
        busy = [
            (s.start_us, s.end_us, _kernel_class(s))
            for s in trace.spans
            if s.cat in DEVICE_CATEGORIES and collective_kind(s.name) is None
        ]
        order, rest = [*COMPUTE_TERMS, *(f"exposed_{k}" for k in COLLECTIVE_KINDS)], "idle"
        seconds = _sweep(busy + comm, order, lo, hi, rest)
    else:
        host = _flatten([s for s in trace.spans if s.lane == main and s.cat in ("cpu_op", "user_annotation")], lo, hi)
        order = [*COMPUTE_TERMS, *(f"exposed_{k}" for k in COLLECTIVE_KINDS), *HOST_TERMS]
        seconds = _sweep(host + comm, order, lo, hi, "host")
    c_lo, c_hi = _host_window(trace, lo, hi)  # calls are host ops: counted within the profiled steps
    backward = _backward_start(trace, main, c_lo)
    per_step = 1e-6 / steps
    return StepTerms(
        step_s=(hi - lo) * per_step,
        steps=steps,
        on_device=trace.on_device,
        seconds={k: v * per_step for k, v in seconds.items()},
        collective_s={
            kind: _union(
                (max(s.start_us, lo), min(s.end_us, hi))
                for s, k in work
                if k == kind and s.end_us > lo and s.start_us < hi
            )
            * per_step
            for kind in COLLECTIVE_KINDS
        },
        calls={kind: sum(1 for t, k in calls if k == kind and c_lo <= t <= c_hi) / steps for kind in COLLECTIVE_KINDS},
        calls_in_backward={
            kind: sum(1 for t, k in calls if k == kind and max(backward, c_lo) <= t <= c_hi) / steps
            for kind in COLLECTIVE_KINDS
        },
    )


def _relabel(work: list[tuple[Span, str]], kinds: list[str]) -> list[tuple[Span, str]]:
    """The collectives' work spans with the kinds their host-side calls name, matched in order, where the two
    counts agree (gloo runs a reduce-scatter as an all-reduce; NCCL an all-to-all as send/recv kernels)."""
    ordered = sorted(work, key=lambda w: w[0].start_us)
    if len(ordered) != len(kinds):
        return ordered
    return [(s, kind) for (s, _), kind in zip(ordered, kinds, strict=True)]


def _backward_start(trace: Trace, main: str | None, lo: float) -> float:
    starts = [
        s.start_us for s in trace.spans if s.lane == main and s.name.startswith("autograd::engine") and s.start_us >= lo
    ]
    return min(starts, default=float("inf"))


__all__ = ["COLLECTIVE_KINDS", "COMPUTE_TERMS", "HOST_TERMS", "StepTerms", "collective_kind", "op_class", "step_terms"]
