"""The pipeline's bubble and exposed sends against event simulations of Megatron's own schedule orders.

Interleaved, overlapped sends (Megatron-Core r0.8 schedules.py, forward_backward_pipelining_with_interleaving with
--overlap-p2p-comm): each rank runs its warm-up forwards, then forward/backward pairs, then the cool-down
backwards, every forward waiting for its receive; sends do not block the sender. 1F1B with blocking sends (the
2021 Megatron-LM's batch_isend_irecv exchanges): each exchange is a rendezvous of the two ranks.
"""

from types import SimpleNamespace

import pytest

from meshplan.core.time.step_time import _bubble, _pp_exposed
from meshplan.spec.layout import Schedule


def _chunk(k: int, p: int, v: int, forward: bool) -> int:
    c = (k % (p * v)) // p  # schedules.py get_model_chunk_id
    return c if forward else v - 1 - c


def _micro_batch(k: int, p: int, v: int) -> int:
    return (k // (p * v)) * p + k % p  # get_microbatch_id_in_model_chunk


def _interleaved_ops(r: int, p: int, v: int, m: int) -> list[tuple[str, int]]:
    total = m * v
    warm = total if m == p else min(2 * (p - r - 1) + (v - 1) * p, total)
    ops = [("F", k) for k in range(warm)]
    for b, k in enumerate(range(warm, total)):
        ops += [("F", k), ("B", b)]
    return ops + [("B", b) for b in range(total - warm, total)]


def simulate_interleaved(p: int, v: int, m: int, *, t_f: float, t_b: float, send_s: float) -> float:
    """Makespan of the overlapped interleaved schedule with per-chunk times ``t_f``, ``t_b``."""
    order = [_interleaved_ops(r, p, v, m) for r in range(p)]
    done: dict[tuple[int, str, int, int], float] = {}
    clock, at = [0.0] * p, [0] * p
    moved = True
    while moved:
        moved = False
        for r in range(p):
            while at[r] < len(order[r]):
                kind, k = order[r][at[r]]
                c, i = _chunk(k, p, v, kind == "F"), _micro_batch(k, p, v)
                if kind == "F":
                    dep = None if r == c == 0 else ((r - 1, "F", c, i) if r else (p - 1, "F", c - 1, i))
                elif r == p - 1 and c == v - 1:
                    dep = (r, "F", c, i)
                else:
                    dep = (r + 1, "B", c, i) if r < p - 1 else (0, "B", c + 1, i)
                if dep is not None and dep not in done:
                    break
                ready = 0.0 if dep is None else done[dep] + (send_s if dep[0] != r else 0.0)
                clock[r] = max(clock[r], ready) + (t_f if kind == "F" else t_b)
                done[(r, kind, c, i)] = clock[r]
                at[r] += 1
                moved = True
    assert at == [len(o) for o in order]
    return max(clock)


def _sends(p: int, v: int, schedule: Schedule, overlapped: bool, m: int, send_s: float) -> float:
    call = SimpleNamespace(strategy="pp", phase="forward", call_s=send_s)
    lay = SimpleNamespace(pp=p, vpp=v, schedule=schedule)
    return float(_pp_exposed([call], lay=lay, m=m, ov_pp=overlapped, efficiency=1.0))  # type: ignore[list-item, arg-type]


@pytest.mark.parametrize(("p", "v", "m"), [(2, 21, 2), (4, 1, 8), (4, 23, 8), (4, 2, 16), (8, 12, 32), (16, 7, 64)])
def test_overlapped_interleaved_schedule_against_its_simulation(p: int, v: int, m: int) -> None:
    """Without latency the simulation is the work plus the bubble, (p - 1)(t_f + t_b) / v of a micro-batch.

    With it, the critical path holds 2 (p v - 1) sends: one micro-batch's way through all p v chunks and back,
    the model's fill and drain (it counted 2 (p - 1) v before, 2 (v - 1) fewer: docs/validation_pipeline_notes.md)."""
    t_f, t_b, send_s = 1.0 / v, 2.0 / v, 0.01
    bubble = float(_bubble(Schedule.INTERLEAVED, pp=p, vpp=v, t_f=t_f * v, t_b=t_b * v))
    work = m * v * (t_f + t_b)
    assert simulate_interleaved(p, v, m, t_f=t_f, t_b=t_b, send_s=0.0) == pytest.approx(work + bubble, rel=1e-9)
    simulated = simulate_interleaved(p, v, m, t_f=t_f, t_b=t_b, send_s=send_s)
    assert simulated - work - bubble == pytest.approx(2 * (p * v - 1) * send_s, rel=1e-9)
    modeled = _sends(p, v, Schedule.INTERLEAVED, True, m, send_s)
    assert simulated - work - bubble == pytest.approx(modeled, abs=1e-9)


def simulate_one_f_one_b_blocking(p: int, m: int, *, t_f: float, t_b: float, send_s: float) -> float:
    """Makespan of 1F1B whose every exchange holds both ranks until it ends (2021 Megatron-LM schedules.py)."""
    programs: list[list[tuple[str, object]]] = []
    for r in range(p):
        warm, prog = min(p - r - 1, m), []
        for f in range(warm):
            prog += [("X", ("f", r - 1, f))] if r else []
            prog += [("C", t_f)] + ([("X", ("f", r, f))] if r < p - 1 else [])
        if m > warm and r:
            prog.append(("X", ("f", r - 1, warm)))
        for b in range(m - warm):
            f = warm + b
            prog += [("C", t_f)] + ([("X", ("fb", r, f, b))] if r < p - 1 else []) + [("C", t_b)]
            if r:  # send_backward_recv_forward, the last one a plain send_backward
                prog.append(("X", ("b", r - 1, b) if b == m - warm - 1 else ("fb", r - 1, f + 1, b)))
        for b in range(m - warm, m):
            prog += ([("X", ("b", r, b))] if r < p - 1 else []) + [("C", t_b)]
            prog += [("X", ("b", r - 1, b))] if r else []
        programs.append(prog)
    clock, at = [0.0] * p, [0] * p
    waiting: dict[object, tuple[int, float]] = {}
    moved = True
    while moved:
        moved = False
        for r in range(p):
            while at[r] < len(programs[r]):
                kind, arg = programs[r][at[r]]
                if kind == "C":
                    clock[r] += float(arg)  # type: ignore[arg-type]
                elif arg in waiting:
                    q, t = waiting.pop(arg)
                    clock[r] = clock[q] = max(t, clock[r]) + send_s
                    at[q] += 1
                else:
                    waiting[arg] = (r, clock[r])
                    break
                at[r] += 1
                moved = True
    assert at == [len(o) for o in programs]
    return max(clock)


@pytest.mark.parametrize(("p", "m"), [(4, 16), (12, 32), (35, 70)])
def test_blocking_one_f_one_b_schedule_is_bounded_by_the_model(p: int, m: int) -> None:
    """The blocking formula, 2 (m + p - 1) sends, is the simulation's critical path or a hair above it."""
    t_f, t_b, send_s = 1.0, 2.0, 0.02
    simulated = simulate_one_f_one_b_blocking(p, m, t_f=t_f, t_b=t_b, send_s=send_s)
    bubble = float(_bubble(Schedule.ONE_F_ONE_B, pp=p, vpp=1, t_f=t_f, t_b=t_b))
    predicted = m * (t_f + t_b) + bubble + _sends(p, 1, Schedule.ONE_F_ONE_B, False, m, send_s)
    assert simulated <= predicted <= simulated + 2 * p * send_s
    assert predicted - send_s * 2 * (m + p - 1) == pytest.approx(
        simulate_one_f_one_b_blocking(p, m, t_f=t_f, t_b=t_b, send_s=0.0)
    )
