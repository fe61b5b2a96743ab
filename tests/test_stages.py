"""The stage table: the layer split and its inverse, the candidate stages that hold every maximum, and the
agreement of the scalar and vectorized paths over uneven pipelines, dense-first MoE and frozen prefixes."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshplan import io
from meshplan.core import pipeline
from meshplan.core.constraints import RULES
from meshplan.core.memory.bill import TERMS, candidates, stage_bill
from meshplan.core.params import count_params
from meshplan.core.placement import place
from meshplan.core.plan import evaluate, mesh_sizes
from meshplan.core.stages import candidate_stages, layer_stage, stage_row, stage_table
from meshplan.core.time.stage_time import stage_times
from meshplan.core.time.step_time import step_time
from meshplan.core.training import peak_bill
from meshplan.reports.inputs import resolve_cluster
from meshplan.search.space import LayoutBatch, SearchSpace, enumerate_layouts
from meshplan.spec.conditions import Conditions, StageSplit
from meshplan.spec.finetune import Finetune, FinetuneMode
from meshplan.spec.layout import Layout, Schedule
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload


def _split(num_layers: int, pp: int) -> list[int]:
    """Layers per stage written out by hand: ceil(L/p) each, one fewer on the last, then first, stages."""
    base = -(-num_layers // pp)
    counts = [base] * pp
    short = base * pp - num_layers
    for k in range(short):  # alternate last, first, ... (the last gets the odd one)
        counts[pp - 1 - k // 2 if k % 2 == 0 else k // 2] -= 1
    return counts


@given(num_layers=st.integers(1, 160), data=st.data())
def test_layer_split_and_its_inverse(num_layers: int, data: st.DataObject) -> None:
    pp = data.draw(st.integers(1, num_layers))
    counts = _split(num_layers, pp)
    rows = stage_table(_model_with_layers(num_layers), pp=pp)
    assert [r.layers for r in rows] == counts
    assert sum(r.layers for r in rows) == num_layers
    for layer in range(num_layers):
        owner = next(i for i in range(pp) if sum(counts[:i]) <= layer < sum(counts[: i + 1]))
        assert layer_stage(num_layers, pp=pp, layer=layer) == owner


def _stated_split(num_layers: int, pp: int, first: int | None, last: int | None) -> list[int]:
    """Stated ends written out: the stated counts at the ends, the hand split of the rest between them."""
    middle = pp - (first is not None) - (last is not None)
    rest = num_layers - (first or 0) - (last or 0)
    inner = _split(rest, middle) if middle else []
    return ([first] if first is not None else []) + inner + ([last] if last is not None else [])


@given(num_layers=st.integers(2, 96), data=st.data())
def test_stated_first_and_last_stage_layers(num_layers: int, data: st.DataObject) -> None:
    """--first-stage-layers / --last-stage-layers: the rows, their sum, and the inverse (layer -> stage)."""
    pp = data.draw(st.integers(2, num_layers))
    first = data.draw(st.none() | st.integers(0, num_layers - (pp - 1)))
    room = num_layers - (first or 0) - (pp - 1 - (first is not None))
    last = data.draw(st.none() | st.integers(0, max(room, 0))) if room >= 0 else None
    split = StageSplit(first=first, last=last)
    model = _model_with_layers(num_layers)
    work = Workload(seq_len=128, global_batch=pp, conditions=Conditions(stage_split=split))
    rule = next(r for r in RULES if r.reason.startswith("stated first/last"))
    counts = _stated_split(num_layers, pp, first, last)
    if not bool(rule.holds(model, Layout(pp=pp), work, pp)):
        middle = counts[1 if first is not None else 0 : pp - (last is not None)]
        assert min(middle or [1]) < 1 or sum(counts) != num_layers
        return
    rows = stage_table(model, pp=pp, split=split)
    assert [int(r.layers) for r in rows] == counts
    assert sum(counts) == num_layers
    for layer in range(num_layers):
        owner = next(i for i in range(pp) if sum(counts[:i]) <= layer < sum(counts[: i + 1]))
        assert int(layer_stage(num_layers, pp=pp, layer=layer, split=split)) == owner
        got = layer_stage(num_layers, pp=np.array([pp, pp]), layer=layer, split=split)
        assert np.broadcast_to(got, (2,)).tolist() == [owner, owner]


def test_stated_ends_that_hold_every_layer() -> None:
    """Two stages whose stated layers are all the model's (no evenly split part): each layer's stage is found
    without dividing by the empty part's layers per stage (a ZeroDivisionError before)."""
    split = StageSplit(first=1, last=1)
    assert [int(layer_stage(2, pp=2, layer=layer, split=split)) for layer in (0, 1)] == [0, 1]
    split = StageSplit(first=40, last=40)
    assert [int(layer_stage(80, pp=2, layer=layer, split=split)) for layer in (0, 39, 40, 79)] == [0, 0, 1, 1]


def test_stated_stage_layers_golden_bill_and_time() -> None:
    """Llama 3.1 8B on pp 4 with 6 layers stated first and 10 last: 6, 8, 8, 10. Stage 3's bf16 weights by hand:
    a layer is 4096 (4096 + 2 x 1024) + 4096^2 (attention) + 3 x 4096 x 14336 (SwiGLU) + 2 x 4096 (norms)
    = 218,112,000 parameters; the head 128,256 x 4096 and the final norm 4096 join the last stage."""
    model = io.load_model("llama-3.1-8b")
    split = StageSplit(first=6, last=10)
    work = Workload(seq_len=4096, global_batch=8, conditions=Conditions(stage_split=split))
    layout = Layout(pp=4, dp_replicate=2)
    assert [int(r.layers) for r in stage_table(model, pp=4, split=split)] == [6, 8, 8, 10]
    layer = 4096 * (4096 + 2 * 1024) + 4096**2 + 3 * 4096 * 14336 + 2 * 4096
    assert layer == 218_112_000
    cal = resolve_cluster(gpu="h100-sxm", gpus=8).gpu.calibration
    bill = stage_bill(model, count_params(model), layout, work, calibration=cal, stage=3)
    assert float(bill.weights_bytes) == pytest.approx(2 * (10 * layer + 128_256 * 4096 + 4096), rel=1e-12)
    plan = evaluate(model, resolve_cluster(gpu="h100-sxm", gpus=8), layout, work)
    assert plan.memory.heaviest_stage == 3
    even = evaluate(model, resolve_cluster(gpu="h100-sxm", gpus=8), layout, Workload(seq_len=4096, global_batch=8))
    # the slowest stage runs 10 layers instead of 8 (the last stage's head comes on top in both)
    assert stage_times(model, layout, work, resolve_cluster(gpu="h100-sxm", gpus=8), stages=(3,)).dense_layers == 10
    assert float(plan.step.step_time_s) > float(even.step.step_time_s)


def test_stated_stage_layers_refused_where_they_do_not_fit() -> None:
    model = io.load_model("llama-3.1-8b")
    cluster = resolve_cluster(gpu="h100-sxm", gpus=8)
    for pp, split in ((1, StageSplit(first=6)), (4, StageSplit(first=30)), (2, StageSplit(first=6, last=6))):
        work = Workload(seq_len=4096, global_batch=8, conditions=Conditions(stage_split=split))
        with pytest.raises(ValueError, match="at least one layer on every other stage"):
            evaluate(model, cluster, Layout(pp=pp, dp_replicate=8 // pp), work)


def test_layer_split_vectorized_matches_scalar() -> None:
    pp = np.array([1, 2, 3, 5, 7, 16, 32])
    for layer in (0, 3, 17, 47):
        got = layer_stage(48, pp=pp, layer=layer)
        assert got.tolist() == [layer_stage(48, pp=int(p), layer=layer) for p in pp]


def test_llama3_405b_stage_rows() -> None:
    """126 layers on 16 stages: 7 on the first and the last (the embedding and the head), 8 elsewhere."""
    rows = stage_table(io.load_model("llama-3.1-405b"), pp=16)
    assert [r.layers for r in rows] == [7] + [8] * 14 + [7]
    assert (rows[0].embedding, rows[0].head, rows[-1].embedding, rows[-1].head) == (1, 0, 0, 1)


def test_deepseek_v3_dense_layers_sit_on_the_first_stages() -> None:
    """61 layers, 3 dense first, on 32 stages: stage 0 holds 1 layer, stage 1 two dense, stage 2 two MoE."""
    rows = stage_table(io.load_model("deepseek-v3"), pp=32)
    assert [(r.dense_layers, r.moe_layers) for r in rows[:4]] == [(1, 0), (2, 0), (0, 2), (0, 2)]
    assert sum(r.dense_layers for r in rows) == 3
    assert 2 in candidate_stages(io.load_model("deepseek-v3"), pp=32)


def _model_with_layers(num_layers: int) -> ModelSpec:
    return dataclasses.replace(io.load_model("llama-3.2-1b"), num_layers=num_layers)


# --- random layouts over the models where the heaviest stage is not where one would guess -------------------

MODELS = {
    "deepseek-v3": (dataclasses.replace(io.load_model("deepseek-v3"), mtp_layers=0), 64, 4096),
    "deepseek-v3-mtp": (io.load_model("deepseek-v3"), 64, 4096),
    "qwen3-235b-a22b": (io.load_model("qwen3-235b-a22b"), 64, 4096),
    "megatron-22b": (io.load_model("megatron-22b"), 64, 2048),
    "mixtral-8x22b": (io.load_model("mixtral-8x22b"), 32, 4096),
    "llama-3.1-8b": (io.load_model("llama-3.1-8b"), 24, 4096),
}
SPACE = SearchSpace(vpp_choices=(1, 2, 3), micro_batch_choices=(1, 2))
SCHEDULES = (Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.ZERO_BUBBLE, Schedule.DUALPIPE)
_BATCHES: dict[str, LayoutBatch] = {}


def _batch(name: str) -> LayoutBatch:
    if name not in _BATCHES:
        model, gpus, seq = MODELS[name]
        batch = enumerate_layouts(
            model, num_gpus=gpus, global_batch=gpus * 2, space=SPACE, domain=8, allow_cross_node_tp=True
        )
        work = Workload(seq_len=seq, global_batch=gpus * 2)
        ok = np.ones(len(batch), dtype=bool)
        for rule in RULES:
            ok &= np.asarray(rule.holds(model, batch, work, gpus), dtype=bool)
        _BATCHES[name] = batch.take(ok)
    return _BATCHES[name]


@st.composite
def layouts(draw: Any) -> tuple[ModelSpec, Any, Workload, str]:
    name = draw(st.sampled_from(sorted(MODELS)))
    model, gpus, seq = MODELS[name]
    batch = _batch(name)
    layout = batch.layout(draw(st.integers(0, len(batch) - 1)))
    if layout.vpp == 1 and layout.pp > 1:
        layout = dataclasses.replace(layout, schedule=draw(st.sampled_from(SCHEDULES)))
    mode = draw(st.sampled_from(("full", "frozen", "lora")))
    if mode == "frozen":
        finetune = Finetune(
            freeze_embeddings=draw(st.booleans()), freeze_layers=draw(st.integers(1, model.num_layers - 1))
        )
    elif mode == "lora":
        finetune = Finetune(mode=FinetuneMode.LORA)
    else:
        finetune = Finetune()
    split = StageSplit()
    if layout.pp > 1 and draw(st.booleans()):  # stated first/last stage layers, leaving a layer a stage
        free = model.num_layers - layout.pp
        first = draw(st.none() | st.integers(0, free // 2 + 1))
        last = draw(st.none() | st.integers(0, max(free - (first or 0), 0) // 2 + 1))
        split = StageSplit(first=first, last=last)
        rest, middle = model.num_layers - split.stated_layers, layout.pp - split.stated
        if rest < middle or (middle == 0 and rest != 0):
            split = StageSplit()
    conditions = Conditions(stage_split=split)
    return model, layout, Workload(seq_len=seq, global_batch=gpus * 2, finetune=finetune, conditions=conditions), name


@settings(max_examples=settings.default.max_examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_candidate_stages_hold_every_maximum(case: tuple[ModelSpec, Any, Workload, str]) -> None:
    """Every term of the bill and of the stage compute time: its maximum over all stages is on a candidate."""
    model, layout, work, _ = case
    params = count_params(model)
    cluster = resolve_cluster(gpu="h100-sxm", gpus=layout.num_gpus)
    cal = cluster.gpu.calibration
    every = range(layout.pp)
    cands = sorted({int(s) for s in candidates(model, layout, work)})
    bills = {s: stage_bill(model, params, layout, work, calibration=cal, stage=s) for s in every}
    for term in (*TERMS, "total_bytes"):
        values = [float(getattr(bills[s], term)) for s in every]
        assert max(values[s] for s in cands) == pytest.approx(max(values), rel=1e-12), term
    everywhere = stage_times(model, layout, work, cluster, stages=tuple(every))
    on_candidates = stage_times(model, layout, work, cluster, stages=tuple(cands))
    assert dataclasses.asdict(on_candidates) == pytest.approx(dataclasses.asdict(everywhere), rel=1e-12)


@settings(max_examples=settings.default.max_examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_scalar_and_vectorized_paths_agree(case: tuple[ModelSpec, Any, Workload, str]) -> None:
    """evaluate() bills every stage; the search's array path bills the candidates: same peak, verdict, time."""
    model, layout, work, _ = case
    cluster = resolve_cluster(gpu="h100-sxm", gpus=layout.num_gpus)
    plan = evaluate(model, cluster, layout, work)
    batch = LayoutBatch.of([layout, layout])
    params = count_params(model)
    bill = peak_bill(model, params, batch, work, calibration=cluster.gpu.calibration)
    for term in TERMS:
        assert float(np.asarray(getattr(bill, term))[0]) == pytest.approx(
            float(getattr(plan.memory.per_gpu, term)), rel=1e-9, abs=1e-6
        ), term
    fits = bool(np.asarray(bill.total_bytes)[0] <= cluster.gpu.hbm_bytes)
    assert fits == plan.memory.fits
    placement = place(mesh_sizes(batch), order=plan.order, domain=cluster.domain_size)
    step, _ = step_time(model, params, batch, work, cluster, placement)
    assert float(np.asarray(step.step_time_s)[0]) == pytest.approx(float(plan.step.step_time_s), rel=1e-9)


def test_every_stage_is_billed_on_the_scalar_path() -> None:
    """megatron-22b on 32 stages: 48 layers leave 8 short stages at each end, so stages 0, 1 and 31 hold one
    layer and stage 8 holds two; the step time must be set by a two-layer stage."""
    model = io.load_model("megatron-22b")
    rows = stage_table(model, pp=32)
    assert [r.layers for r in rows] == [1] * 8 + [2] * 16 + [1] * 8
    layout = _batch("megatron-22b").layout(0)
    layout = dataclasses.replace(layout, pp=32, tp=1, cp=1, dp_shard=1, dp_replicate=2, ep=1, zero=0)
    work = Workload(seq_len=2048, global_batch=128)
    cluster = resolve_cluster(gpu="a100-80gb", gpus=64)
    times = stage_times(model, layout, work, cluster, stages=tuple(range(32)))
    assert times.dense_layers == 2
    two_layer = stage_times(model, layout, work, cluster, stages=(8,))
    one_layer = stage_times(model, layout, work, cluster, stages=(1,))
    assert times.fwd_compute_s == pytest.approx(two_layer.fwd_compute_s)
    assert two_layer.fwd_compute_s > 1.9 * one_layer.fwd_compute_s
    assert int(stage_row(model, pp=32, stage=8).layers) == pipeline.stage_layers(48, pp=32, stage=8) == 2
