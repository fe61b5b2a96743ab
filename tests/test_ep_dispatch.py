"""The MoE dispatcher: NCCL all-to-all (a row per token and expert) against DeepEP (a token once per node over
RDMA, then on by NVLink), with the share of copies that leave the node re-derived by counting."""

from __future__ import annotations

import itertools
import json
from math import comb

import pytest

from meshplan import io
from meshplan.cli import main
from meshplan.core.comm.ep import deepep_shares, groups_hit


def _counted_groups_hit(experts: int, k: int, groups: int) -> float:
    """Mean number of groups a token's k distinct experts reach, over every choice of k of ``experts``."""
    per = experts // groups
    total = n = 0
    for chosen in itertools.combinations(range(experts), k):
        total += len({e // per for e in chosen})
        n += 1
    return total / n


@pytest.mark.parametrize(("experts", "k", "groups"), [(16, 4, 4), (16, 2, 8), (12, 3, 2), (8, 8, 4)])
def test_groups_hit_counts_every_routing(experts: int, k: int, groups: int) -> None:
    assert groups_hit(experts, k, groups) == pytest.approx(_counted_groups_hit(experts, k, groups), rel=1e-12)


def test_deepep_sends_each_token_once_per_remote_node() -> None:
    model = io.load_model("qwen3-235b-a22b")  # 128 experts, 8 a token
    leaving, staying = deepep_shares(model, n=32, inner=8)  # EP 32 over 4 nodes
    remote_nodes = 3 * (1 - comb(96, 8) / comb(128, 8))  # of the 3 other nodes, those holding one of its experts
    assert leaving == pytest.approx(remote_nodes / (8 * 3 / 4))  # against the all-to-all's k (D - 1)/D copies
    assert 0.44 < leaving < 0.46
    # inside one node: nothing leaves; a token goes once to each GPU holding one of its experts
    leaving, staying = deepep_shares(model, n=8, inner=8)
    assert leaving == 1.0
    assert staying == pytest.approx(8 * (1 - comb(112, 8) / comb(128, 8)) / 8)


def _ep_time(capsys: pytest.CaptureFixture[str], dispatch: str, ep: int) -> float:
    argv = f"estimate qwen3-235b-a22b --gpu h100-sxm --gpus 256 --tp 2 --sp --pp 8 --vpp 4 --ep {ep} --expert-tp 1"
    assert main([*argv.split(), "--stack", "megatron-core", "--ep-dispatch", dispatch, "--json"]) == 0
    calls = json.loads(capsys.readouterr().out)["collectives"]
    return sum(c["time_s_per_step"] for c in calls if c["strategy"] == "ep" and c["size_bytes_per_call"] > 1e6)


def test_deepep_against_alltoall_across_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    across = _ep_time(capsys, "deepep", 32) / _ep_time(capsys, "alltoall", 32)
    # RDMA-bound: the remote copies' ratio, a little above it for the latency both pay alike
    assert 0.45 < across < 0.5
    inside = _ep_time(capsys, "deepep", 8) / _ep_time(capsys, "alltoall", 8)
    # NVLink-bound: the GPUs a token reaches over its k copies, again a little above for the latency
    assert 1 - comb(112, 8) / comb(128, 8) < inside < 0.72


def test_ep_dispatch_is_refused_when_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    argv = "estimate qwen3-30b-a3b --gpu h100-sxm --gpus 8 --ep 8 --ep-dispatch nvshmem"
    assert main(argv.split()) == 2
    assert "--ep-dispatch: 'nvshmem' is not one of alltoall, deepep" in capsys.readouterr().err
