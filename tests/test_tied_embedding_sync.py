"""Megatron's tied embeddings under pipeline parallelism: one all-reduce of the word embeddings' gradients between
the first and the last stage after the last backward, blocking (finalize_model_grads' embedding group)."""

from __future__ import annotations

import dataclasses

import pytest

from meshplan import io
from meshplan.core.plan import evaluate
from meshplan.reports.inputs import resolve_cluster
from meshplan.spec.layout import Layout, Recompute, ZeroStage
from meshplan.spec.workload import PRECISIONS, Framework, Workload

TIED = io.load_model("bloom-176b")  # 250,880 x 14,336 tied embeddings
CLUSTER = resolve_cluster(gpu="a100-80gb", gpus=384, scale_out="opa-100", nics_per_node=4)
LAYOUT = Layout(tp=4, pp=12, dp_shard=8, zero=ZeroStage.OPTIMIZER, micro_batch=2, recompute=Recompute.FULL)


def _plan(model: object, *, framework: Framework = Framework.MEGATRON) -> object:
    work = Workload(seq_len=2048, global_batch=2048, precision=PRECISIONS["bf16-fp32-grads"], framework=framework)
    return evaluate(model, CLUSTER, LAYOUT, work)  # type: ignore[arg-type]


def _syncs(plan: object) -> list:
    return [c for c in plan.collectives if c.strategy == "pp" and c.op.name == "ALL_REDUCE"]  # type: ignore[attr-defined]


def test_one_blocking_all_reduce_of_the_vocabulary_shard_between_two_stages_on_the_fabric() -> None:
    plan = _plan(TIED)
    (sync,) = _syncs(plan)
    shard_bytes = 250_880 / 4 * 14_336 * 4  # V / t rows of h fp32 main gradients
    assert (sync.group_size, sync.phase, sync.count_per_step) == (2, "step", 1)
    assert float(sync.size_bytes) == pytest.approx(shard_bytes)
    # two ranks on different nodes: the whole buffer crosses each one's share of the node's four 100 Gb/s ports
    link = io.load_link("opa-100")
    per_gpu = link.bandwidth_bytes_per_s * link.efficiency * 4 / 8
    assert float(sync.call_s) == pytest.approx(shard_bytes / per_gpu, rel=0.01)
    untied = _plan(dataclasses.replace(TIED, tied_embeddings=False))
    assert plan.step.exposed_pp_s - untied.step.exposed_pp_s == pytest.approx(float(sync.call_s), rel=1e-9)  # type: ignore[attr-defined]


def test_no_sync_without_a_pipeline_or_under_pytorch_native_stacks() -> None:
    one_stage = evaluate(
        TIED,
        resolve_cluster(gpu="a100-80gb", gpus=384),
        dataclasses.replace(LAYOUT, pp=1, dp_shard=96, micro_batch=1),
        Workload(seq_len=2048, global_batch=1536, framework=Framework.MEGATRON),
    )
    assert not _syncs(one_stage)
    assert not _syncs(_plan(TIED, framework=Framework.TORCH))
