"""Scale-up domains without a switch: a group inside the domain reaches only the links to its own peers.

NVSwitch boards (8-GPU HGX, NVL72) give any group the GPU's whole NVLink bandwidth; the 4-GPU HGX boards and AMD's
xGMI boards wire each GPU pair with a bundle of its own, so a group of n of the domain's D GPUs gets (n - 1) / (D - 1)
of it. Re-derived here from the link catalog, then held against a published two-GPU measurement.
"""

from __future__ import annotations

import contextlib
import io as stdio
import json

import pytest

from meshplan import io
from meshplan.cli import main
from meshplan.core.comm.call import scale_up_share
from meshplan.core.serving.shape import Hardware
from meshplan.reports.inputs import resolve_cluster
from meshplan.reports.serve_setup import calibration


def test_nvswitch_domain_gives_every_group_the_whole_bandwidth() -> None:
    cluster = resolve_cluster(gpu="h200", gpus=16)
    assert cluster.domain_size == 8 and cluster.scale_up_switched
    for members in (2, 4, 8):
        assert scale_up_share(cluster, members) == 1.0


@pytest.mark.parametrize("gpu", ["h200", "h100-sxm", "a100-80gb"])
def test_four_gpu_nvlink_board_splits_the_links_over_three_peers(gpu: str) -> None:
    cluster = resolve_cluster(gpu=gpu, gpus=16, node_size=4)
    assert not cluster.scale_up_switched
    assert scale_up_share(cluster, 2) == pytest.approx(1 / 3)
    assert scale_up_share(cluster, 3) == pytest.approx(2 / 3)
    assert scale_up_share(cluster, 4) == 1.0


def test_a_larger_nvlink_node_keeps_its_switch() -> None:
    assert resolve_cluster(gpu="gb200", gpus=72, node_size=36).scale_up_switched
    assert resolve_cluster(gpu="h200", gpus=16, node_size=8).scale_up_switched


def _tp_all_gather_s(node_size: int | None, tp: int) -> float:
    args = ["estimate", "llama-3.1-8b", "--gpu", "h200", "--gpus", "4", "--tp", str(tp), "--sp"]
    args += ["--micro-batch", "1", "--seq", "4096", "--global-batch", "4", "--json"]
    if node_size is not None:
        args += ["--node-size", str(node_size)]
    out = json.loads(_run(args))
    calls = [c for c in out["collectives"] if c["strategy"] == "sp" and c["op"] == "all_gather"]
    assert calls and all(c["size_bytes_per_call"] == 4096 * 4096 * 2 for c in calls)
    return calls[0]["time_s_per_step"] / calls[0]["count_per_step"]


def _run(args: list[str]) -> str:
    buf = stdio.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(args) == 0
    return buf.getvalue()


def test_tp2_on_a_four_gpu_board_pays_three_times_the_wire() -> None:
    """TP 2 on an HGX H200 4-GPU board rides one pair's 6 of 18 links; TP 4 uses all three bundles."""
    switched, board = _tp_all_gather_s(None, 2), _tp_all_gather_s(4, 2)
    link = io.load_link("nvlink4")
    size = 4096 * 4096 * 2  # one sequence's hidden states in bf16, gathered over 2 ranks: half of it crosses
    wire_switched = size / 2 / (link.bandwidth_bytes_per_s * link.efficiency)
    assert board - switched == pytest.approx(2 * wire_switched, rel=0.02)
    assert _tp_all_gather_s(4, 4) == pytest.approx(_tp_all_gather_s(None, 4), rel=1e-9)


def test_mi300x_pair_matches_the_published_two_gpu_bus_bandwidth() -> None:
    """stas00/ml-engineering (network/README.md at 744d01e1, peer-to-peer section): two MI300X of one board reach
    47.7 GB/s of bus bandwidth where all eight reach 312.9 GB/s; one xGMI bundle of seven is 448 x 0.70 / 7 = 44.8."""
    gpu = io.load_gpu("mi300x")
    hw = Hardware(
        gpu=gpu,
        scale_up=io.load_link(gpu.scale_up_link),
        scale_out=io.load_link(gpu.scale_out_link),
        cal=calibration("vllm", "mi300x"),
    )
    assert hw.link(8).effective_bytes_per_s == pytest.approx(312.9e9, rel=0.01)
    assert hw.link(2).effective_bytes_per_s == pytest.approx(47.7e9, rel=0.08)
    cluster = resolve_cluster(gpu="mi300x", gpus=8)
    assert not cluster.scale_up_switched
    assert scale_up_share(cluster, 2) * cluster.scale_up.effective_bytes_per_s == pytest.approx(
        hw.link(2).effective_bytes_per_s
    )


def test_estimate_says_when_a_group_rides_part_of_a_board() -> None:
    args = "estimate llama-3.1-8b --gpu mi300x --gpus 8 --tp 4 --dp-shard 2 --zero 3 --micro-batch 1 --global-batch 8"
    warnings = json.loads(_run([*args.split(), "--json"]))["warnings"]
    (board,) = [w for w in warnings if "direct links" in w]
    assert "tp 4 (3 of 7 peers' links, 43%)" in board and "dp_shard 2 (1 of 7 peers' links, 14%)" in board
    whole = "estimate llama-3.1-8b --gpu mi300x --gpus 8 --tp 8 --micro-batch 1 --global-batch 8 --json"
    assert not [w for w in json.loads(_run(whole.split()))["warnings"] if "direct links" in w]


def _tpot_s(extra: str) -> float:
    args = "serve llama-3.1-70b --gpu h100-sxm --gpus 4 --input-len 1000 --output-len 200 --concurrency 8 --json"
    return float(json.loads(_run([*args.split(), *extra.split()]))["tpot_s"])


def test_serve_states_its_node() -> None:
    """`serve --node-size 4` on H100: TP 2 rides one pair's links of the 4-GPU board (slower than under NVSwitch),
    TP 4 all of them (the same), and a node of 2 gives its one peer every link."""
    assert _tpot_s("--tp 2 --node-size 4") > _tpot_s("--tp 2")
    assert _tpot_s("--tp 4 --node-size 4") == pytest.approx(_tpot_s("--tp 4"), rel=1e-12)
    assert _tpot_s("--tp 2 --node-size 2") == pytest.approx(_tpot_s("--tp 2"), rel=1e-12)


def test_serve_plan_searches_the_fleets_own_node(tmp_path: object) -> None:
    """`serve-plan --node-size 4` on H100: no layout wider than the 4-GPU board in TP, each timed on the board's own
    links; its saved plan records the node and exports after the same recomputation; the API takes it too."""
    from pathlib import Path

    from meshplan.reports.serve_plan import serve_plan_report

    kw = dict(gpu="h100-sxm", gpus=8, input_len=1024, output_len=256, engine="trtllm", top=50)
    board = serve_plan_report("llama-3.1-8b", node_size=4, **kw)
    switched = serve_plan_report("llama-3.1-8b", **kw)
    assert board["node_size"] == 4 and switched["node_size"] is None
    tps = {p["layout"]["tp"] for p in board["top"]}
    assert max(tps) <= 4 and max(p["layout"]["tp"] for p in switched["top"]) == 8
    by_layout = {(p["layout"]["tp"], p["layout"]["pp"], p["layout"]["weights_dtype"]): p for p in switched["top"]}
    pairs = [p for p in board["top"] if p["layout"]["tp"] == 2 and p["layout"]["pp"] == 1]
    assert pairs  # TP 2 rides one pair's 6 of 18 links: no faster than under NVSwitch
    for p in pairs:
        other = by_layout.get((2, 1, p["layout"]["weights_dtype"]))
        assert other is None or p["tpot_s"] >= other["tpot_s"]
    d = Path(str(tmp_path))  # Llama 3.1 70B on 2 GPUs: TP 2 wins, on one pair of the board
    argv = ["serve-plan", "llama-3.1-70b", "--gpu", "h100-sxm", "--gpus", "2", "--input-len", "1024", "--output-len"]
    argv += ["256", "--engine", "vllm", "--node-size", "4", "--top", "1", "--save", str(d / "plan.json")]
    with contextlib.redirect_stdout(stdio.StringIO()), contextlib.redirect_stderr(stdio.StringIO()) as err:
        assert main(argv) == 0
        saved = json.loads((d / "plan.json").read_text())
        assert saved["node_size"] == 4 and saved["best"]["layout"]["tp"] == 2
        assert main(["export", "vllm", "--from-plan", str(d / "plan.json"), "--json"]) == 0
        edited = saved | {"node_size": None}  # the same winner timed under NVSwitch is another plan
        (d / "edited.json").write_text(json.dumps(edited))
        assert main(["export", "vllm", "--from-plan", str(d / "edited.json")]) == 2
    assert "serve-plan computes" in err.getvalue()
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from meshplan.server.app import create_app

    query = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 8, "input_len": 1024, "output_len": 256}
    with TestClient(create_app(), base_url="http://127.0.0.1") as client:
        r = client.get("/api/serve-plan", params=query | {"node_size": 4, "engine": "trtllm"})
        assert r.status_code == 200 and r.json()["node_size"] == 4
        bad = client.get("/api/serve-plan", params=query | {"node_size": 0})
        assert bad.status_code in (400, 422) and "node" in bad.text
