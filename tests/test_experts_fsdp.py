"""Routed experts under FSDP2 with expert parallelism: sharded over the shard group's ranks outside the EP group
(torchtitan's dp_shard_mod_ep), on dim 1 where a rank holds fewer experts than that group, and gathered there."""

from __future__ import annotations

import json
import math

import pytest

from meshplan import io
from meshplan.cli import main
from meshplan.core.comm.cost import Collective
from meshplan.core.params import ParamTensor, layer_tensors
from meshplan.core.pytorch.shards import RankCoords, expert_fsdp_group, fsdp_numel, fsdp_units
from meshplan.core.stages import StageRow


def _expert_tensor(model_name: str) -> object:
    model = io.load_model(model_name)
    return next(t for t in layer_tensors(model, moe_layer=True) if t.expert and len(t.shape) == 3)


def test_expert_group_is_the_shard_group_over_ep() -> None:
    # EP borrowed from the shard group (etp = tp): dp_shard cp / ep; from the TP ranks too (etp = 1)
    assert expert_fsdp_group(RankCoords(fsdp=64, ep=8)) == 8
    assert expert_fsdp_group(RankCoords(fsdp=32, ep=8, tp=2, etp=1)) == 8
    assert expert_fsdp_group(RankCoords(fsdp=32, ep=8, tp=2, etp=2)) == 4
    # no EP: the experts stay in their layer's unit, on the whole group; no FSDP: no group
    assert expert_fsdp_group(RankCoords(fsdp=16, ep=1)) == 16
    assert expert_fsdp_group(RankCoords(fsdp=1, ep=8)) == 1


def test_experts_are_not_padded_to_the_whole_group() -> None:
    w = _expert_tensor("qwen3-30b-a3b")  # 128 experts (E, in, out)
    e, d_in, d_out = w.shape
    owned, stored = fsdp_numel(w, RankCoords(fsdp=64, ep=8))
    # 16 experts on each EP rank, sharded over 64 / 8 = 8 ranks: 2 each, nothing padded
    assert owned == stored == (e // 8 // 8) * d_in * d_out
    # 16 experts over a group of 32 (fsdp 256, ep 8): dim 1 is sharded instead (torchtitan's Shard(1))
    owned, stored = fsdp_numel(w, RankCoords(fsdp=256, ep=8))
    assert stored == (e // 8) * math.ceil(d_in / 32) * d_out
    assert owned == stored  # d_in divides evenly


def test_the_experts_unit_gathers_over_its_own_group() -> None:
    model = io.load_model("qwen3-30b-a3b")
    units = StageRow(stage=0, first_layer=0, layers=4, dense_layers=0, moe_layers=4, embedding=0, head=0)
    at = RankCoords(fsdp=64, ep=8)
    by_name = {u[0]: u for u in fsdp_units(model, at, units)}
    _, experts, count, group = by_name["experts"]
    assert (count, group) == (4, 8)
    expert_numel = sum(t.numel for t in layer_tensors(model, moe_layer=True) if t.expert)
    assert experts * group == expert_numel / 8  # the gathered unit: this EP rank's experts, whole
    # without EP the experts ride in the layer's unit
    by_name = {u[0]: u for u in fsdp_units(model, RankCoords(fsdp=64, ep=1), units)}
    assert by_name["experts"][2] == 0
    assert by_name["moe-layer"][1] * 64 >= expert_numel


def test_estimate_gathers_experts_over_dp_over_ep(capsys: pytest.CaptureFixture[str]) -> None:
    argv = "estimate qwen3-30b-a3b --gpu h100-sxm --gpus 64 --dp-shard 64 --ep 8 --zero 3 --stack torchtitan"
    assert main([*argv.split(), "--global-batch", "256", "--json"]) == 0
    calls = json.loads(capsys.readouterr().out)["collectives"]
    gathers = [c for c in calls if c["strategy"] == "dp" and c["op"] == Collective.ALL_GATHER]
    per_layer = [c for c in gathers if c["count_per_step"] > 4]  # once per layer and micro-batch
    assert {c["group_size"] for c in per_layer} == {64, 8}
    experts = max(per_layer, key=lambda c: c["size_bytes_per_call"])
    assert experts["group_size"] == 8
    # this EP rank's 16 experts, bf16, gathered whole: its slice of the 3 (E, h, f) matrices
    model = io.load_model("qwen3-30b-a3b")
    assert experts["size_bytes_per_call"] == 2 * 3 * 16 * model.hidden * model.moe.expert_ffn_hidden


@pytest.mark.parametrize(
    ("world", "ep", "experts", "measured"),
    [(8, 2, 4, (2, 4, 24)), (8, 2, 8, (1, 16, 24))],
)
def test_expert_shards_as_fsdp2_stores_them(world: int, ep: int, experts: int, measured: tuple[int, ...]) -> None:
    """The local shard of one (E, 16, 24) expert tensor as FSDP2 stored it, measured on CPU (torch 2.13, gloo, 8
    ranks on a (world / ep, ep) mesh, ``fully_shard(experts, mesh=mesh["efsdp"])`` with torchtitan's Shard(1)
    placement where world / ep x ep > E): E / ep = 2 experts over 4 ranks went to dim 1, 4 experts stayed on dim 0."""
    tensor = ParamTensor(name="experts.w1", shape=(experts, 16, 24), expert=True)
    owned, stored = fsdp_numel(tensor, RankCoords(fsdp=world, ep=ep))
    assert owned == stored == math.prod(measured)
