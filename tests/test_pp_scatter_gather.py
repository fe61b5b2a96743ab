"""Pipeline sends with and without Megatron's scatter/gather over the TP group (``--pp-scatter-gather``)."""

from __future__ import annotations

import pytest

from meshplan import io
from meshplan.core.plan import evaluate
from meshplan.reports.inputs import resolve_cluster
from meshplan.spec.conditions import Conditions
from meshplan.spec.layout import Layout
from meshplan.spec.workload import Framework, Workload

MODEL = io.load_model("megatron-22b")
CLUSTER = resolve_cluster(gpu="a100-80gb", gpus=32)


def _send_bytes(*, scatter: bool | None, sp: bool = False, framework: Framework = Framework.MEGATRON) -> float:
    work = Workload(
        seq_len=2048, global_batch=32, framework=framework, conditions=Conditions(pp_scatter_gather=scatter)
    )
    plan = evaluate(MODEL, CLUSTER, Layout(tp=4, pp=4, sp=sp, dp_replicate=2, micro_batch=2), work)
    (size,) = {float(c.size_bytes) for c in plan.collectives if c.strategy == "pp" and c.op.name == "SEND_RECV"}
    return size


def test_each_tp_rank_sends_a_quarter_with_scatter_gather_and_the_whole_activation_without() -> None:
    whole = 2 * 2048 * MODEL.hidden * 2  # micro-batch x sequence x hidden, 2 bytes
    assert _send_bytes(scatter=None) == pytest.approx(whole / 4)  # Megatron's default
    assert _send_bytes(scatter=True) == pytest.approx(whole / 4)
    assert _send_bytes(scatter=False) == pytest.approx(whole)
    assert _send_bytes(scatter=False, sp=True) == pytest.approx(whole / 4)  # sequence-parallel output is sharded
    assert _send_bytes(scatter=None, framework=Framework.TORCH) == pytest.approx(whole)
