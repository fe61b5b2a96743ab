"""Grouping layouts alike in all a formula reads: exact groups, and searches that give what ungrouped ones give."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from meshplan import io
from meshplan.core import groups
from meshplan.core.groups import group_rows, spread
from meshplan.core.placement import DEFAULT_ORDER, parse_order
from meshplan.reports.inputs import resolve_cluster
from meshplan.search.rank import search
from meshplan.spec.conditions import Conditions
from meshplan.spec.finetune import Finetune, FinetuneMode
from meshplan.spec.workload import PRECISIONS, Framework, Kernels, Workload


def test_rows_equal_in_every_column_share_a_group_and_no_others_do() -> None:
    rng = np.random.default_rng(7)
    cols = [rng.integers(0, 4, 2000), rng.integers(0, 3, 2000), rng.integers(0, 2, 2000).astype(bool)]
    g = group_rows(cols)
    rows = np.column_stack([c.astype(np.int64) for c in cols])
    assert len(g) == len(np.unique(rows, axis=0))
    assert np.array_equal(rows[g.first][g.inverse], rows)


def test_a_hash_collision_falls_back_to_exact_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a multiplier of 0 every key is the last column: rows that differ elsewhere collide, and are split."""
    monkeypatch.setattr(groups, "_HASH_MULTIPLIER", np.uint64(0))
    a, b = np.array([1, 2, 1, 2]), np.array([5, 5, 5, 5])
    g = group_rows([a, b])
    assert len(g) == 2
    assert np.array_equal(a[g.first][g.inverse], a)


def test_spread_copies_per_group_arrays_and_keeps_scalars() -> None:
    @dataclasses.dataclass(frozen=True)
    class Pair:
        x: object
        y: object

    g = group_rows([np.array([3, 1, 3, 1, 1])])
    out = spread([Pair(x=np.array([10.0, 30.0]), y=2.5)], g)
    assert np.array_equal(out[0].x, [30.0, 10.0, 30.0, 10.0, 10.0])
    assert out[0].y == 2.5


def _torch(seq: int, batch: int) -> Workload:
    return Workload(
        seq_len=seq,
        global_batch=batch,
        framework=Framework.TORCH,
        kernels=Kernels.EAGER,
        precision=PRECISIONS["fsdp2-bf16"],
    )


CASES = {
    "dense, Megatron": ("llama-3.1-8b", "h100-sxm", 32, Workload(seq_len=8192, global_batch=256)),
    "dense, PyTorch FSDP2": ("llama-3.1-8b", "h100-sxm", 32, _torch(8192, 256)),
    "MoE, folded experts": ("mixtral-8x7b", "h200", 32, Workload(seq_len=4096, global_batch=512)),
    "MoE, PyTorch": ("mixtral-8x7b", "h200", 16, _torch(4096, 128)),
    "dense, torchtitan's conditions": (
        "llama-3.1-8b",
        "h100-sxm",
        32,
        dataclasses.replace(_torch(8192, 256), conditions=Conditions(fsdp_copies=True, repeat_kv=True)),
    ),
    "dense, Megatron with FSDP2's copies": (
        "llama-3.1-8b",
        "h100-sxm",
        32,
        Workload(seq_len=8192, global_batch=256, conditions=Conditions(fsdp_copies=True)),
    ),
    "LoRA, no sync": (
        "llama-3.1-70b",
        "a100-80gb",
        16,
        Workload(
            seq_len=4096,
            global_batch=64,
            finetune=Finetune(mode=FinetuneMode.LORA),
            conditions=Conditions(grad_sync=False, reshard_after_forward=False),
        ),
    ),
}


ORDERS = {"MoE, data axes between TP and PP": "tp,dp_shard,pp,cp,ep,dp_replicate"}
"""An axis order under which the pipeline's and the experts' placement depend on how the data ranks split."""


@pytest.mark.parametrize("case", sorted(CASES) + sorted(ORDERS))
def test_a_grouped_search_gives_every_layout_what_an_ungrouped_one_gives(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same layouts, same bills, same step times to the last bit: grouping only skips repeated work."""
    name, gpu, gpus, work = CASES["MoE, folded experts" if case in ORDERS else case]
    order = parse_order(ORDERS[case]) if case in ORDERS else DEFAULT_ORDER
    model, cluster = io.load_model(name), resolve_cluster(gpu=gpu, gpus=gpus)
    grouped = search(model, cluster, work, order=order)
    monkeypatch.setattr(groups, "GROUP_MIN_LAYOUTS", 10**12)
    plain = search(model, cluster, work, order=order)
    assert len(grouped.candidates) > 100
    assert grouped.rejections == plain.rejections
    for a, b in ((grouped.candidates, plain.candidates), (grouped.step, plain.step), (grouped.memory, plain.memory)):
        for f in dataclasses.fields(a):
            assert np.array_equal(np.asarray(getattr(a, f.name)), np.asarray(getattr(b, f.name))), f.name
