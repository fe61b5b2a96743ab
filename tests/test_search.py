"""The planner's search: complete space, exact agreement with evaluate(), reachable rejection reasons."""

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan import io
from meshplan.core.plan import evaluate
from meshplan.reports.inputs import resolve_cluster
from meshplan.search.order import lex_order, pareto_front
from meshplan.search.rank import ALL_GATHER_WINDOW, OOM, TP_CROSSES, search
from meshplan.search.space import LayoutBatch, SearchSpace, enumerate_layouts
from meshplan.spec.conditions import Conditions, StageSplit
from meshplan.spec.finetune import Finetune, FinetuneMode
from meshplan.spec.workload import Workload


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def brute_force(n: int, *, layers: int, experts: int, batch: int, space: SearchSpace, max_tp: int) -> set[tuple]:
    """Every layout by plain nested loops, written independently of the vectorized enumeration."""
    out = set()
    for tp, cp, pp in itertools.product(divisors(n), repeat=3):
        if n % (tp * cp * pp) or tp > max_tp or cp > space.max_cp:
            continue
        dp = n // (tp * cp * pp)
        experts_mesh = [(1, tp)]
        if experts > 1:  # EP out of dp x cp with expert TP = tp, or folded over tp x dp x cp with expert TP 1
            experts_mesh = [(ep, tp) for ep in divisors(dp * cp)]
            experts_mesh += [(ep, 1) for ep in divisors(tp * dp * cp)] if tp > 1 else []
        for (ep, etp), shard in itertools.product(experts_mesh, divisors(dp)):
            for zero in space.zero_choices:
                if (zero == 0 and shard != 1) or (zero > 0 and shard * cp == 1):
                    continue
                for vpp in space.vpp_choices:
                    if vpp > 1 and pp == 1:
                        continue
                    mbs = [b for b in space.micro_batch_choices if batch % (b * dp) == 0] or [1]
                    for mb, rc, sp in itertools.product(mbs, space.recompute_choices, (False, True)):
                        if (sp and tp == 1) or (etp != tp and not sp):
                            continue
                        row = (tp, cp, pp, ep, etp, shard, dp // shard, vpp, mb, zero, rc, sp)
                        out.add((*row, 2 if vpp > 1 else 1))
                        # DualPipe: an even pipeline, no virtual stages, an even count of >= 2 pp micro-batches
                        m, rest = divmod(batch, mb * dp)
                        if space.dualpipe and vpp == 1 and pp % 2 == 0 and not rest and m % 2 == 0 and m >= 2 * pp:
                            out.add((*row, 4))
    return out


def as_set(batch: LayoutBatch) -> set[tuple]:
    cols = [
        batch.tp,
        batch.cp,
        batch.pp,
        batch.ep,
        batch.etp,
        batch.dp_shard,
        batch.dp_replicate,
        batch.vpp,
        batch.micro_batch,
        batch.zero,
        batch.recompute,
        batch.sp,
        batch.schedule,
    ]
    return {tuple(int(c[i]) for c in cols) for i in range(len(batch))}


@pytest.mark.parametrize(
    ("name", "gpus", "batch"), [("llama-3.2-1b", 8, 16), ("mixtral-8x7b", 16, 32), ("qwen2.5-7b", 12, 24)]
)
def test_enumeration_is_complete_on_small_fleets(name: str, gpus: int, batch: int) -> None:
    model = io.load_model(name)
    space = SearchSpace()
    got = enumerate_layouts(model, num_gpus=gpus, global_batch=batch, space=space, domain=8, allow_cross_node_tp=True)
    want = brute_force(
        gpus,
        layers=model.num_layers,
        experts=model.moe.num_experts if model.moe else 1,
        batch=batch,
        space=space,
        max_tp=gpus,
    )
    assert len(got) == len(as_set(got)), "no duplicates"
    assert as_set(got) == want


def test_vectorized_and_scalar_evaluation_agree() -> None:
    model = io.load_model("mixtral-8x7b")
    cluster = resolve_cluster(gpu="h100-sxm", gpus=64)
    work = Workload(seq_len=4096, global_batch=256)
    result = search(model, cluster, work, headroom=0.0)
    assert result.feasible > 100
    rng = np.random.default_rng(0)
    for i in rng.choice(result.feasible, size=25, replace=False):
        plan = evaluate(model, cluster, result.candidates.layout(int(i)), work)
        assert float(plan.step.step_time_s) == pytest.approx(float(result.step.step_time_s[i]), rel=1e-12)
        assert float(plan.step.mfu) == pytest.approx(float(result.step.mfu[i]), rel=1e-12)
        assert float(plan.memory.per_gpu.total_bytes) == pytest.approx(float(result.memory.total_bytes[i]), rel=1e-12)


def test_deepspeed_03_zero3_evaluates_the_same_scalar_and_vectorized() -> None:
    """DeepSpeed 0.3's list collectives and per-step regather of the persistent parameters, priced per layout over
    arrays of shard groups, equal the scalar evaluation of each ZeRO-3 layout."""
    from meshplan.reports.conditions import conditions_of

    model = io.load_model("gpt3-175b")
    cluster = resolve_cluster(gpu="a100-80gb", gpus=64)
    conditions = conditions_of({"zero3_unit": "parameter", "zero3_grad_reduce": "all-reduce"})
    work = Workload(seq_len=2048, global_batch=128, conditions=conditions)
    result = search(model, cluster, work, headroom=0.0)
    zero3 = np.flatnonzero(np.asarray(result.candidates.zero)[: result.feasible] == 3)
    assert len(zero3) > 100
    for i in np.random.default_rng(0).choice(zero3, size=10, replace=False):
        plan = evaluate(model, cluster, result.candidates.layout(int(i)), work)
        assert float(plan.step.step_time_s) == pytest.approx(float(result.step.step_time_s[i]), rel=1e-12)


def test_ranked_fastest_first_and_all_fit() -> None:
    model = io.load_model("llama-3.1-70b")
    cluster = resolve_cluster(gpu="h200", gpus=64)
    work = Workload(seq_len=8192, global_batch=256)
    result = search(model, cluster, work, headroom=0.1)
    times = np.asarray(result.step.step_time_s)
    assert np.all(np.diff(times) >= -1e-9)
    assert np.all(np.asarray(result.memory.total_bytes) <= 0.9 * cluster.gpu.hbm_bytes)
    assert result.evaluated == result.feasible + sum(result.rejections.values())


def test_every_rejection_reason_is_reachable() -> None:
    import dataclasses

    odd_ffn = dataclasses.replace(io.load_model("gpt3-175b"), name="odd", ffn_hidden=49154)  # 2 x 24577
    seen: set[str] = set()
    cases = [
        (io.load_model("llama-3.1-8b"), "h100-sxm", 96, 4096, 96),  # tp=16 over 8 KV heads
        (io.load_model("gpt3-175b"), "h100-sxm", 64, 2048, 64),  # tp=16, 32 divide 96 heads but leave the node
        (io.load_model("llama-3.2-1b"), "h100-sxm", 64, 4096, 8),  # batch 8 over 64-way DP; 64 stages > 16 layers
        (io.load_model("mixtral-8x7b"), "a100-40gb", 32, 32768, 32),  # OOM; ep 16, 32 over 8 experts
        (io.load_model("mistral-7b"), "h100-sxm", 48, 4104, 48),  # cp that does not split 4104 into 2cp chunks
        (odd_ffn, "h100-sxm", 16, 2048, 16),  # tp=4 divides the 96 heads but not ffn 49154
    ]
    for model, gpu, gpus, seq, batch in cases:
        result = search(model, resolve_cluster(gpu=gpu, gpus=gpus), Workload(seq_len=seq, global_batch=batch))
        seen |= set(result.rejections)
    qlora = Workload(seq_len=2048, global_batch=8, finetune=Finetune(mode=FinetuneMode.QLORA))
    seen |= set(search(io.load_model("llama-3.1-8b"), resolve_cluster(gpu="h100-sxm", gpus=8), qlora).rejections)
    stated = Workload(seq_len=2048, global_batch=8, conditions=Conditions(stage_split=StageSplit(first=30)))
    seen |= set(search(io.load_model("llama-3.1-8b"), resolve_cluster(gpu="h100-sxm", gpus=8), stated).rejections)
    offload = Workload(seq_len=2048, global_batch=8, conditions=Conditions(offload_layers=4))
    seen |= set(search(io.load_model("llama-3.1-8b"), resolve_cluster(gpu="h100-sxm", gpus=8), offload).rejections)
    from meshplan.core.constraints import RULES

    expected = {rule.reason for rule in RULES if rule.reason != "mesh does not multiply to the GPU count"} | {
        OOM,
        TP_CROSSES,
    }
    assert expected <= seen, expected - seen


def test_pareto_front_is_minimal() -> None:
    times = np.array([3.0, 1.0, 2.0, 1.0, 4.0])
    memory = np.array([1.0, 5.0, 2.0, 6.0, 0.5])
    front = pareto_front(times, memory)
    assert front.tolist() == [1, 2, 0, 4]
    for i in front:
        assert not np.any((times < times[i]) & (memory < memory[i]))


@pytest.mark.parametrize(
    ("name", "gpus", "seq", "batch"),
    [("llama-3.1-70b", 64, 8192, 64), ("deepseek-v3", 128, 4096, 512), ("megatron-22b", 64, 2048, 256)],
)
def test_dropping_a_layout_at_its_first_stage_over_budget_keeps_every_verdict_and_bill(
    name: str, gpus: int, seq: int, batch: int
) -> None:
    """The search bills stage by stage and drops a layout at its first stage over budget (fitting_bill): the
    layouts that fit, and their heaviest-stage bills, are those of billing every candidate stage (peak_bill)."""
    from meshplan.core.params import count_params
    from meshplan.core.training import peak_bill
    from meshplan.search.rank import fitting_bill

    model, cluster = io.load_model(name), resolve_cluster(gpu="h100-sxm", gpus=gpus)
    work = Workload(seq_len=seq, global_batch=batch)
    from meshplan.core.constraints import RULES

    every = enumerate_layouts(
        model, num_gpus=gpus, global_batch=batch, space=SearchSpace(), domain=8, allow_cross_node_tp=False
    )
    valid = np.ones(len(every), dtype=np.bool_)
    for rule in RULES:
        valid &= np.asarray(rule.holds(model, every, work, gpus), dtype=np.bool_)
    layouts = every.take(valid)
    params, cal = count_params(model), cluster.gpu.calibration
    full = peak_bill(model, params, layouts, work, calibration=cal)
    totals = np.asarray(full.total_bytes) * np.ones(len(layouts))
    budget = float(np.median(totals))  # about half fit: both verdicts are exercised
    fits, bill = fitting_bill(model, params, layouts, work, calibration=cal, budget=budget)
    assert 0 < fits.sum() < len(layouts)
    assert np.array_equal(fits, totals <= budget)
    assert np.allclose(np.asarray(bill.total_bytes) * np.ones(int(fits.sum())), totals[fits], rtol=1e-12)


@given(st.lists(st.tuples(st.sampled_from([0.5, 1.0, 2.0, 7.25]), st.floats(0, 1e12, allow_nan=False)), max_size=300))
def test_lex_order_is_lexsort(rows: list[tuple[float, float]]) -> None:
    """The ranking's sort equals numpy's lexsort on the same keys, ties (frequent: equal step times) included."""
    times = np.array([r[0] for r in rows], dtype=np.float64)
    memory = np.array([r[1] for r in rows], dtype=np.float64)
    assert np.array_equal(lex_order(times, memory), np.lexsort((memory, times)))


def test_ring_cp_layouts_that_fit_are_tried_with_all_gathered_kv_too() -> None:
    """Ring-CP layouts that fit are evaluated again with their K/V all-gathered (Llama 3's kind) when they are
    near the fastest: each gathered layout has its ring twin among those that fit, agrees with the scalar
    evaluation, none is slower than (1 + ALL_GATHER_WINDOW)^2 x the best (the window of the best gathered, its
    twin within the window of the best), and a pinned CP kind keeps the other out of the search."""
    import dataclasses
    from dataclasses import fields

    from meshplan.spec.layout import ContextParallel

    model = io.load_model("llama-3.1-8b")
    cluster = resolve_cluster(gpu="h100-sxm", gpus=32)
    work = Workload(seq_len=65536, global_batch=32)
    result = search(model, cluster, work)
    lay = result.candidates
    kind, cp = np.asarray(lay.cp_kind), np.asarray(lay.cp)
    gathered = np.flatnonzero(kind == int(ContextParallel.ALL_GATHER))
    assert len(gathered) > 10 and np.all(cp[gathered] > 1)
    names = [f.name for f in fields(lay) if f.name != "cp_kind"]
    rows = np.column_stack([np.asarray(getattr(lay, n), dtype=np.int64) for n in names])
    ring = {tuple(r) for r in rows[kind == int(ContextParallel.RING)]}
    assert all(tuple(rows[i]) in ring for i in gathered)
    # complete within the window of the final best: every ring-CP layout that close was tried, and its gathered
    # twin is here unless it does not fit
    times = np.asarray(result.step.step_time_s) * np.ones(len(lay))
    have = {tuple(rows[i]) for i in gathered}
    near = np.flatnonzero(
        (kind == int(ContextParallel.RING)) & (cp > 1) & (times <= (1 + ALL_GATHER_WINDOW) * times[0])
    )
    assert len(near) > 10
    for i in near:
        if tuple(rows[i]) not in have:
            twin = dataclasses.replace(lay.layout(int(i)), cp_kind=ContextParallel.ALL_GATHER)
            assert evaluate(model, cluster, twin, work).memory.per_gpu.total_bytes > 0.9 * cluster.gpu.hbm_bytes
    assert result.evaluated == result.feasible + sum(result.rejections.values())
    for i in np.random.default_rng(0).choice(gathered, size=10, replace=False):
        plan = evaluate(model, cluster, lay.layout(int(i)), work)
        assert float(plan.step.step_time_s) == pytest.approx(float(result.step.step_time_s[i]), rel=1e-12)
        assert float(plan.memory.per_gpu.total_bytes) == pytest.approx(float(result.memory.total_bytes[i]), rel=1e-12)
    pinned = search(model, cluster, work, pins={"cp_kind": int(ContextParallel.RING)})
    assert np.all(np.asarray(pinned.candidates.cp_kind) == int(ContextParallel.RING))
    assert pinned.feasible == len(ring)
