"""Groups that do not tile a node: ranks fill each node in turn, so a group no wider than a node that does not
divide it lands across two nodes somewhere in the fleet, and a collective waits for that group.

The placement is re-derived here by listing every group of a fleet rank by rank, and held against the training
placement (core/placement.py), the estimate's report, the serving checks and the GB200 rows typed with the NVLink
segments their launcher asks for.
"""

from __future__ import annotations

import contextlib
import io as stdio
import json
import math

import numpy as np
import pytest

from meshplan import io
from meshplan.cli import main
from meshplan.core.placement import place_axis
from meshplan.reports.serve import serve_report

ORDER = ("tp", "cp", "ep", "dp_shard", "dp_replicate", "pp")


def _groups(domain: int, stride: int, size: int) -> list[list[int]]:
    """Every group of ``size`` ranks ``stride`` apart over a fleet of whole blocks that also fills whole nodes."""
    block = stride * size
    fleet = block * domain // math.gcd(block, domain) * 2
    return [[base + k * stride for k in range(size)] for base in range(fleet) if (base // stride) % size == 0]


def _brute(domain: int, stride: int, size: int) -> tuple[bool, int, int]:
    """(some group spans two nodes, the fewest members any group keeps in its fullest node, the most nodes any
    group touches)."""
    crossing, kept, most = False, size, 1
    for g in _groups(domain, stride, size):
        nodes = [r // domain for r in g]
        crossing |= len(set(nodes)) > 1
        kept = min(kept, max(nodes.count(n) for n in set(nodes)))
        most = max(most, len(set(nodes)))
    return crossing, kept, most


def _placed(domain: int, stride: int, size: int) -> tuple[int, int]:
    sizes = {"tp": stride, "cp": 1, "ep": 1, "dp_shard": size, "dp_replicate": 1, "pp": 1}
    p = place_axis("dp_shard", sizes=sizes, order=ORDER, domain=domain)
    return int(p.inner), int(p.outer)


CASES = [(d, s, n) for d in (2, 3, 4, 6, 8, 12, 64, 72) for s in (1, 2, 3, 4, 8) for n in (1, 2, 3, 4, 8, 16, 64)]


@pytest.mark.parametrize(("domain", "stride", "size"), CASES)
def test_a_group_crosses_the_fabric_exactly_where_one_of_the_fleet_straddles_two_nodes(
    domain: int, stride: int, size: int
) -> None:
    crossing, kept, most = _brute(domain, stride, size)
    inner, outer = _placed(domain, stride, size)
    # the least contained group's nodes, counted rank by rank, as the fewest whole shares of the group
    assert outer == min(k for k in range(most, size + 1) if size % k == 0)
    assert (outer > 1) == crossing
    assert inner * outer == size
    assert inner <= kept  # never more members on one node than the least contained group keeps


def _power_of_two(*xs: int) -> bool:
    return all(x & (x - 1) == 0 for x in xs)


@pytest.mark.parametrize(("domain", "stride", "size"), [c for c in CASES if _power_of_two(*c)])
def test_power_of_two_nodes_keep_the_rule_they_had(domain: int, stride: int, size: int) -> None:
    inner, _ = _placed(domain, stride, size)
    assert inner == (1 if stride >= domain else min(size, max(1, domain // stride)))


def test_arrays_of_layouts_place_as_each_layout_alone() -> None:
    tps, dps = np.array([1, 2, 4, 3, 2]), np.array([8, 4, 6, 4, 36])
    for domain in (3, 8, 72):
        sizes = {"tp": tps, "cp": 1, "ep": 1, "dp_shard": dps, "dp_replicate": 1, "pp": 1}
        p = place_axis("dp_shard", sizes=sizes, order=ORDER, domain=domain)
        for i in range(len(tps)):
            assert (int(p.inner[i]), int(p.outer[i])) == _placed(domain, int(tps[i]), int(dps[i]))


def _estimate(args: list[str]) -> dict:
    buf = stdio.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["estimate", "llama-3.1-8b", "--gpu", "h100-sxm", "--json", *args]) == 0
    return json.loads(buf.getvalue())


def test_tp_on_three_gpu_nodes_is_priced_over_the_fabric() -> None:
    tp = _estimate(["--gpus", "12", "--tp", "4", "--node-size", "3"])["placement"]["tp"]
    assert tp["crosses_fabric"] and tp["inside_domain"] == 2 and tp["domains"] == 2  # 3 + 1 or 2 + 2 a node
    tp2 = _estimate(["--gpus", "6", "--tp", "2", "--node-size", "3"])["placement"]["tp"]
    assert tp2["crosses_fabric"]  # GPUs 2 and 3 sit on two nodes
    tp3 = _estimate(["--gpus", "6", "--tp", "2", "--node-size", "6"])["placement"]["tp"]
    assert not tp3["crosses_fabric"]


def test_expert_groups_of_64_on_72_gpu_racks_straddle_unless_the_job_takes_64_a_rack() -> None:
    sizes = {"tp": 1, "cp": 1, "ep": 64, "dp_shard": 256, "dp_replicate": 1, "pp": 1}
    assert place_axis("ep", sizes=sizes, order=ORDER, domain=72).outer > 1
    assert place_axis("ep", sizes=sizes, order=ORDER, domain=64).outer == 1


def test_megatron_bridge_gb200_rows_are_typed_with_the_launchers_64_gpu_segments() -> None:
    gb200 = [c for c in io.run_sources()["megatron_bridge"]["case"] if "GB200" in c["id"]]
    assert len(gb200) == 2
    # scripts/performance/utils/executors.py (v0.2.0): past 18 four-GPU nodes, the largest segment <= 18 nodes
    # dividing the job's 64 nodes is 16 nodes, 64 GPUs
    segment = max(k for k in range(1, 19) if 64 % k == 0)
    assert all(c["node_size"] == segment * 4 == 64 for c in gb200)


def test_serve_refuses_tp_groups_that_straddle_nodes_and_the_planner_skips_them() -> None:
    with pytest.raises(ValueError, match="does not tile a node of 3 GPUs"):
        serve_report("llama-2-70b", gpu="h100-sxm", gpus=8, tp=2, input_len=200, output_len=100, rate=1, node_size=3)
    one_node = serve_report(
        "llama-2-7b", gpu="h100-sxm", gpus=2, tp=2, input_len=200, output_len=100, rate=1, node_size=3
    )
    assert one_node["layout"]["tp"] == 2  # inside one node nothing straddles
    buf = stdio.StringIO()
    args = ["serve-plan", "llama-2-70b", "--gpu", "h100-sxm", "--gpus", "6", "--input-len", "222"]
    args += ["--output-len", "290", "--ttft-p99", "2", "--tpot-p99", "0.2", "--node-size", "3", "--json"]
    with contextlib.redirect_stdout(buf):
        assert main(args) == 0
    plans = json.loads(buf.getvalue())["top"]
    assert plans and all(p["layout"]["tp"] in (1, 3) for p in plans)


def test_estimate_names_an_expert_group_split_over_two_racks_and_the_node_size_that_keeps_it_whole() -> None:
    args = ["deepseek-v3", "--gpu", "gb200", "--gpus", "256", "--pp", "4", "--ep", "64", "--expert-tp", "1"]
    warned = [w for w in _estimate_of(args)["warnings"] if w.startswith("EP=64")]
    assert len(warned) == 1 and "--node-size 64" in warned[0]
    assert not [w for w in _estimate_of([*args, "--node-size", "64"])["warnings"] if w.startswith("EP=")]


def _estimate_of(args: list[str]) -> dict:
    buf = stdio.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["estimate", *args, "--json"]) == 0
    return json.loads(buf.getvalue())


def test_serve_plan_names_the_tp_degrees_it_left_out_for_straddling_and_the_node_size_that_keeps_them() -> None:
    def warned(*extra: str) -> list[str]:
        buf = stdio.StringIO()
        args = ["serve-plan", "llama-2-70b", "--gpu", "gb200", "--gpus", "144", "--input-len", "222"]
        args += ["--output-len", "290", "--ttft-p99", "2", "--tpot-p99", "0.2", "--json", *extra]
        with contextlib.redirect_stdout(buf):
            assert main(args) == 0
        return [w for w in json.loads(buf.getvalue())["warnings"] if "not searched" in w]

    note = warned()
    assert len(note) == 1 and note[0].startswith("TP 16, 32, 64 not searched") and "--node-size 64" in note[0]
    assert warned("--node-size", "64") == []
