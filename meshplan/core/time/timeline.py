"""One step drawn as a Gantt chart: the step-time model's own terms laid out stage by stage.

The model times every pipeline stage as its slowest one (step_time.py): a chunk's forward and backward, each with
the TP, CP and EP traffic compute cannot hide and the host sync after each send, plus one pipeline send (the
model's exposed sends spread over the 2 (m v + p - 1) slots of its critical path). Here those slots run in the
schedule's own order (GPipe; 1F1B; Megatron's interleaved order, micro-batch groups of N through each of the v
chunks), each waiting for the one it depends on; the idle time left on a stage is the bubble, of which the share
of the fill-and-drain sends the model counts, 2 (p - 1) of them, is drawn as waiting on other stages' sends. After
the last backward come the tied embeddings' all-reduce, the data-parallel traffic left exposed, the optimizer step
and the host's overhead, on every stage alike. Traffic hidden behind compute is listed apart, under the chunk it
runs beside (data-parallel traffic in the share the model's one exposed total leaves hidden).

The timeline is a decomposition, not a second model: every stage's row sums, by kind, to the model's compute,
bubble and exposed traffic of each axis, and ends at the model's step time. Where the drawn order does not give
the model's bubble (zero-bubble and DualPipe, drawn in 1F1B order) the idle gaps are scaled to it and
``drawn_as`` says so; an interleaved step whose micro-batches the group size N does not divide runs them all as
one group (groups of N then wait on themselves, tests/test_timeline.py), which gives the model's bubble.

A step with more than ``MAX_SLOTS`` slots folds the middle of its steady state into one block per stage (``count``
chunks), keeping two micro-batch groups drawn (fewer in a pipeline too deep for them), and ``drawn_as`` says how
many it drew.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.core import pipeline
from meshplan.core.comm.cost import Collective
from meshplan.core.time.step_time import StageStep, StepTime
from meshplan.spec.layout import LayoutLike, Schedule

MAX_SLOTS = 800
"""Forward and backward chunks drawn over all stages; beyond, the steady state folds into one block a stage."""
_PHASES = (("tp", ("tp", "sp")), ("cp", ("cp",)), ("ep", ("ep", "etp")))


@dataclass(frozen=True, slots=True, kw_only=True)
class Interval:
    """One stretch of one stage's step: ``kind`` forward, backward, bubble, comm, optimizer or host."""

    start_s: float
    end_s: float
    kind: str
    axis: str | None = None
    """For comm: tp, cp, ep, pp or dp."""
    exposed: bool = True
    """For comm: on the critical path (False: run beside compute, drawn under it)."""
    what: str = ""
    micro_batch: int | None = None
    chunk: int | None = None
    count: int = 1
    """Micro-batches folded into this stretch (more than one only in a folded steady state)."""

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True, kw_only=True)
class StageRow:
    stage: int
    intervals: tuple[Interval, ...]
    hidden: tuple[Interval, ...]
    """Traffic run beside compute (exposed False), each under the chunk or span it hides behind."""
    in_flight: tuple[tuple[float, float], ...]
    """(time, chunks whose activations the stage holds) after each change, from 0 to the step's end."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    schedule: str
    drawn_as: str
    micro_batches: int
    vpp: int
    slot_send_s: float
    """The pipeline send each slot pays (the model's exposed sends over its 2 (m v + p - 1) slots)."""
    bubble_scale: float
    """The model's bubble over the idle time of the drawn order (1 where the order gives the model's bubble)."""
    rows: tuple[StageRow, ...]


@dataclass(frozen=True, slots=True)
class _Op:
    forward: bool
    micro_batch: int
    chunk: int


def _orders(schedule: Schedule, *, p: int, v: int, m: int, group: int) -> list[list[_Op]]:
    """Each rank's chunk order: GPipe all forwards then all backwards; 1F1B warm-up, pairs, cool-down; interleaved
    by Megatron's schedules.py (micro-batch groups of N through each chunk; a step of p micro-batches all warm-up)."""
    if schedule is Schedule.GPIPE:
        return [[_Op(True, j, 0) for j in range(m)] + [_Op(False, j, 0) for j in range(m)] for _ in range(p)]
    fwd = [(j, c) for g in range(0, m, group) for c in range(v) for j in range(g, min(g + group, m))]
    bwd = [(j, v - 1 - c) for j, c in fwd]
    out = []
    for r in range(p):
        total = m * v
        warm = min(p - r - 1, m) if v == 1 else (total if m == p else min(2 * (p - r - 1) + (v - 1) * group, total))
        ops = [_Op(True, *fwd[k]) for k in range(warm)]
        for b, k in enumerate(range(warm, total)):
            ops += [_Op(True, *fwd[k]), _Op(False, *bwd[b])]
        out.append(ops + [_Op(False, *bwd[b]) for b in range(total - warm, total)])
    return out


def _dependency(op: _Op, r: int, *, p: int, v: int) -> tuple[int, _Op] | None:
    if op.forward:
        if r:
            return r - 1, op
        return (p - 1, _Op(True, op.micro_batch, op.chunk - 1)) if op.chunk else None
    if r < p - 1:
        return r + 1, op
    if op.chunk < v - 1:
        return 0, _Op(False, op.micro_batch, op.chunk + 1)
    return r, _Op(True, op.micro_batch, op.chunk)


def _simulate(orders: list[list[_Op]], *, p: int, v: int, f: float, b: float) -> list[list[float]] | None:
    """Start of each op of each rank, a forward taking ``f`` and a backward ``b`` (None: the order deadlocks)."""
    done: dict[tuple[int, _Op], float] = {}
    starts: list[list[float]] = [[] for _ in range(p)]
    clock = [0.0] * p
    moved = True
    while moved:
        moved = False
        for r in range(p):
            while len(starts[r]) < len(orders[r]):
                op = orders[r][len(starts[r])]
                dep = _dependency(op, r, p=p, v=v)
                if dep is not None and dep not in done:
                    break
                at = clock[r] if dep is None else max(clock[r], done[dep])
                starts[r].append(at)
                clock[r] = at + (f if op.forward else b)
                done[(r, op)] = clock[r]
                moved = True
    return starts if all(len(st) == len(o) for st, o in zip(starts, orders, strict=True)) else None


@dataclass(frozen=True, slots=True, kw_only=True)
class _Slot:
    """A forward or backward chunk's parts in seconds: compute, exposed TP/CP/EP, host sync, send; and hidden."""

    compute: float
    exposed: dict[str, float]
    sync: float
    send: float
    hidden: dict[str, float]

    @property
    def work(self) -> float:
        return self.compute + sum(self.exposed.values()) + self.sync


def _dp_traffic(st: StageStep, *, m: int) -> tuple[float, float, float, float, float]:
    """Data-parallel traffic as step_time's ``_dp_exposed`` counts it: per micro-batch in each forward (ZeRO-3's
    gathers) and backward (ZeRO-2/3's reduce-scatters), once a step behind the last backward (the gradients'
    reduce), once behind the first forward (ZeRO-1/2's parameter gather); last, the once-a-step calls that nothing
    hides (the gather a PyTorch-native engine runs inside its optimizer step)."""
    fwd = bwd = once = first = whole = 0.0
    for c in st.calls:
        if c.strategy not in ("dp", "dp-experts") or not bool(c.count_per_step > 0):
            continue
        if bool(c.per_micro_batch):
            fwd += float(c.time_s) / m if c.phase == "forward" else 0.0
            bwd += float(c.time_s) / m if c.phase == "backward" else 0.0
        elif c.phase == "step" and not bool(c.overlappable):
            whole += float(c.call_s)
        else:
            once += float(c.call_s) if c.phase == "backward" else 0.0
            first += float(c.call_s) if c.phase == "step" else 0.0
    return fwd, bwd, once, first, whole


def _slots(
    st: StageStep, *, m: int, per: float, send: float, dp: tuple[float, float] = (0.0, 0.0)
) -> tuple[_Slot, _Slot]:
    x = {k: float(v) for k, v in st.exposed.items()}
    traffic: dict[str, float] = {}
    for c in st.calls:
        for axis, strategies in _PHASES:
            if c.strategy in strategies and c.phase in ("forward", "backward"):
                key = f"{axis}_{c.phase[0]}"
                traffic[key] = traffic.get(key, 0.0) + float(c.time_s) / m
    chunk = float(st.chunk_s)

    def slot(ph: str, total: float, dp_s: float) -> _Slot:
        exposed = {a: x.get(f"{a}_{ph}", 0.0) / per for a, _ in _PHASES}
        hidden = {a: max(traffic.get(f"{a}_{ph}", 0.0) / per - exposed[a], 0.0) for a, _ in _PHASES}
        compute = total / per - sum(exposed.values()) - chunk / per
        return _Slot(compute=compute, exposed=exposed, sync=chunk / per, send=send, hidden=hidden | {"dp": dp_s / per})

    return slot("f", float(st.fwd_s), dp[0]), slot("b", float(st.bwd_s), dp[1])


def _pieces(sl: _Slot, *, forward: bool, mb: int | None, chunk: int | None, count: int = 1) -> list[Interval]:
    """A slot's stretches from time 0 (compute, the exposed traffic, the sync, the send), zero-length ones left out."""
    kind = "forward" if forward else "backward"
    parts = [(kind, None, "compute", sl.compute)] + [("comm", a, "exposed", t) for a, t in sl.exposed.items()]
    parts += [("comm", "pp", "host sync after the send", sl.sync), ("comm", "pp", "send", sl.send)]
    out, t = [], 0.0
    for k, axis, what, d in parts:
        if d * count > 0:
            out.append(Interval(start_s=t, end_s=t + d * count, kind=k, axis=axis, what=what, micro_batch=mb,
                                chunk=chunk, count=count))  # fmt: skip
            t += d * count
    return out


def step_timeline(st: StageStep, step: StepTime, lay: LayoutLike, *, m: int, group: int | None) -> Timeline:
    """The Gantt chart of one layout's step from its slowest stage's ``stage_step`` and its ``step_time``."""
    p, v, copies = int(lay.pp), int(lay.vpp), int(pipeline.stage_copies(lay.schedule))
    schedule = Schedule(int(lay.schedule))
    group = group or p
    reduce = sum((float(c.time_s) for c in st.calls if c.strategy == "pp" and c.op is Collective.ALL_REDUCE), 0.0)
    slots = 2 * (m * v + p - 1)
    send = (float(st.pp_s) - reduce - 2 * m * float(st.chunk_s) / copies) / slots if p > 1 else 0.0
    dp_f, dp_b, dp_once, dp_first, dp_whole = _dp_traffic(st, m=m)
    traffic = m * (dp_f + dp_b) + dp_once + dp_first
    # the model's data-parallel exposure is one total: of each piece, the share it hides is drawn under its compute
    hides = max(traffic - float(step.exposed_dp_s) + dp_whole, 0.0) / traffic if traffic > 0 else 0.0
    f, b = _slots(st, m=m, per=copies * v, send=send, dp=(dp_f * hides, dp_b * hides))
    drawn = m
    while drawn > 2 * group and 2 * drawn * v * p > MAX_SLOTS:  # two groups at least: a steady state to fold
        drawn = max(2 * group, (drawn // 2) // group * group)
    if 2 * drawn * v * p > 2 * MAX_SLOTS and drawn > group:  # a deep pipeline: one group
        drawn = group
    # a deeper one: fewer micro-batches than a group (1F1B and GPipe keep the model's bubble whatever m is; the
    # interleaved schedule only from p micro-batches, so it keeps p unless even those are far too many)
    if 2 * drawn * v * p > (8 if v > 1 else 2) * MAX_SLOTS:
        drawn = max(1, min(drawn, MAX_SLOTS // (2 * v * p)))
    scaled = schedule in (Schedule.ZERO_BUBBLE, Schedule.DUALPIPE)
    drawn_as = "1f1b order, gaps scaled to the model's bubble" if scaled else "the schedule's own order"
    if schedule is Schedule.INTERLEAVED and v > 1 and drawn % group:
        # groups of N that do not divide m wait on themselves or idle more than the model's bubble: one group of
        # all m (every micro-batch through chunk 0, then chunk 1, ...) runs and gives the model's bubble
        drawn_as += f", all {drawn} micro-batches in one group (N = {group} does not divide them)"
        group = drawn
    orders = _orders(schedule, p=p, v=v, m=drawn, group=group)
    fs, bs = f.work + f.send, b.work + b.send
    starts = _simulate(orders, p=p, v=v, f=fs, b=bs)
    if starts is None:  # never seen: an order waiting on itself is drawn as GPipe
        orders = _orders(Schedule.GPIPE, p=p, v=v, m=drawn, group=group)
        chunks = (range(v), range(v - 1, -1, -1))  # forwards through the chunks in order, backwards the other way
        orders = [[_Op(o.forward, o.micro_batch, c) for o in row for c in chunks[not o.forward]] for row in orders]
        starts = _simulate(orders, p=p, v=v, f=fs, b=bs)
        drawn_as = "gpipe order"
        assert starts is not None
    span = max(s + (fs if o.forward else bs) for row, so in zip(orders, starts, strict=True)
               for o, s in zip(row, so, strict=True))  # fmt: skip
    idle = span - sum(fs if o.forward else bs for o in orders[0])
    waits = 2 * (p - 1) * send  # the fill-and-drain sends the model counts on the critical path
    scale = (float(step.bubble_s) + waits) / idle if idle > 0 else 1.0
    if abs(scale - 1) > 1e-9 and not scaled:  # not seen in the tests' layouts: said where it happens
        drawn_as += f", gaps scaled to the model's bubble (x{scale:.3g})"
    if drawn < m:
        drawn_as += f"; {drawn} of {m} micro-batches drawn, the rest folded into one block a stage"
    rows = [
        _row(
            r,
            orders[r],
            starts[r],
            span,
            f=f,
            b=b,
            step=step,
            folded=(m - drawn) * v,
            reduce=reduce,
            waits=waits,
            dp_once=(dp_once * hides, dp_first * hides),
        )
        for r in range(p)
    ]
    return Timeline(schedule=schedule.name, drawn_as=drawn_as, micro_batches=m, vpp=v, slot_send_s=send,
                    bubble_scale=scale, rows=tuple(rows))  # fmt: skip


def _row(
    r: int,
    order: list[_Op],
    starts: list[float],
    span: float,
    *,
    f: _Slot,
    b: _Slot,
    step: StepTime,
    folded: int,
    reduce: float,
    waits: float,
    dp_once: tuple[float, float],
) -> StageRow:
    """One stage's stretches laid end to end: its idle gaps, scaled to the model's bubble plus the fill-and-drain
    sends ``waits`` (each gap's share of those drawn as waiting on sends), the slots, the folded steady state
    (``folded`` chunks each way) in the middle, then the step's tail; ``dp_once``: the hidden share of the
    data-parallel traffic issued once a step, behind the last backward and behind the first forward."""
    ends = [s + (f.work + f.send if o.forward else b.work + b.send) for o, s in zip(order, starts, strict=True)]
    gaps = [s - e for s, e in zip(starts, [0.0, *ends[:-1]], strict=True)] + [span - ends[-1]]
    bubble = float(step.bubble_s)
    idle = sum(gaps)
    per = (bubble + waits) / idle if idle > 0 else 0.0
    share = waits / (bubble + waits) if bubble + waits > 0 else 0.0
    out: list[Interval] = []
    hidden: list[Interval] = []
    flight: list[tuple[float, float]] = [(0.0, 0.0)]
    t, held, fold_at = 0.0, 0, len(order) // 2
    marks = {True: -1.0, False: -1.0}  # where the first forward and the last backward start

    def place(items: list[Interval]) -> float:
        for it in items:
            out.append(_shift(it, t))
        return items[-1].end_s if items else 0.0

    def gap(g: float) -> float:
        d = g * per
        wait = [Interval(start_s=0.0, end_s=d * (1 - share), kind="bubble", what="idle: waiting on other stages")]
        wait.append(Interval(start_s=wait[0].end_s, end_s=d, kind="comm", axis="pp",
                             what="waiting on other stages' sends"))  # fmt: skip
        return place([w for w in wait if w.duration_s > 0])

    if idle == 0 and bubble + waits > 0:  # no gap to hold the model's bubble: it goes first
        t += gap(1.0) if (per := bubble + waits) else 0.0
    for i, op in enumerate(order):
        t += gap(gaps[i])
        if i == fold_at and folded > 0:  # the folded steady state: ``folded`` chunks each way, nothing held more
            for sl, fw in ((f, True), (b, False)):
                _hide(hidden, sl, t, count=folded)
                t += place(_pieces(sl, forward=fw, mb=None, chunk=None, count=folded))
            flight.append((t, float(held)))
        sl = f if op.forward else b
        _hide(hidden, sl, t)
        if not op.forward or marks[True] < 0:
            marks[op.forward] = t
        t += place(_pieces(sl, forward=op.forward, mb=op.micro_batch, chunk=op.chunk))
        held += 1 if op.forward else -1
        flight.append((t, float(held)))
    t += gap(gaps[-1])
    for at, d, what in ((marks[False], dp_once[0], "the gradients' reduce, behind the last backward"),
                        (marks[True], dp_once[1], "the parameters' gather, behind the first forward")):  # fmt: skip
        if d > 0:
            hidden.append(Interval(start_s=at, end_s=at + d, kind="comm", axis="dp", exposed=False, what=what))
    tail = [("comm", "pp", "all-reduce of the tied embeddings", reduce)]
    tail += [("comm", "dp", "data-parallel / ZeRO traffic left exposed", float(step.exposed_dp_s))]
    tail += [("optimizer", None, "optimizer step", float(step.optimizer_s)), ("host", None, "host", float(step.host_s))]
    for kind, axis, what, d in tail:
        if d > 0:
            out.append(Interval(start_s=t, end_s=t + d, kind=kind, axis=axis, what=what))
            t += d
    flight.append((t, 0.0))
    return StageRow(stage=r, intervals=tuple(out), hidden=tuple(hidden), in_flight=tuple(flight))


def _hide(hidden: list[Interval], sl: _Slot, t: float, count: int = 1) -> None:
    """Record the traffic a slot runs beside its compute (from the slot's start); the row's clock is unchanged."""
    for axis, d in sl.hidden.items():
        if d * count > 0:
            hidden.append(Interval(start_s=t, end_s=t + d * count, kind="comm", axis=axis, exposed=False,
                                   what="hidden behind compute", count=count))  # fmt: skip


def _shift(it: Interval, t: float) -> Interval:
    return Interval(start_s=it.start_s + t, end_s=it.end_s + t, kind=it.kind, axis=it.axis, exposed=it.exposed,
                    what=it.what, micro_batch=it.micro_batch, chunk=it.chunk, count=it.count)  # fmt: skip
