"""meshplan check end to end: real gloo runs at world sizes 2 and 4 (one launch each), every measured quantity
held against meshplan's prediction with its target, and the report's JSON contract."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch", reason="meshplan check needs the torch extra (pip install 'meshplan[torch]')")

from meshplan.check.render import render_check
from meshplan.reports.check import assemble_report, check_report, parse_layouts, plan_layouts

pytestmark = pytest.mark.slow  # torch.distributed processes start in the fixtures

EXTRAS = ("fsdp_bf16", "fsdp_reshard_root", "fsdp_no_reshard", "fsdp_no_sync", "fsdp_sac_op")
LAYOUTS = {
    2: ("ddp", "fsdp", "tp", "sp", "pp", "ep", "cp", *EXTRAS),
    4: ("ddp", "fsdp", "tp", "sp", "fsdp_tp", "pp", "ep", "cp", *EXTRAS),
}
HARNESS = {"pp": ("pp_gpipe", "pp_1f1b")}  # every other layout runs under the name the report gives it


@pytest.fixture(scope="module")
def reports(harness_runs: dict[int, list[Any]]) -> dict[int, dict[str, Any]]:
    """The report check_report gives for LAYOUTS, assembled from the session's runs (conftest.harness_runs)."""
    from meshplan.check.runner import DENSE, MOE

    out = {}
    for n in (2, 4):
        run, skipped = plan_layouts(parse_layouts(",".join(LAYOUTS[n])), n, DENSE, MOE)
        out[n] = assemble_report(n, run, skipped, harness_runs[n], DENSE, MOE)
    return out


@pytest.mark.parametrize("n", [2, 4])
def test_every_quantity_within_target(reports: dict[int, dict[str, Any]], n: int) -> None:
    report = reports[n]
    failed = [r for r in report["results"] if not r["ok"]]
    assert not failed, "\n".join(str(r) for r in failed[:20])
    assert report["all_ok"] is True


@pytest.mark.parametrize("n", [2, 4])
def test_every_layout_and_rank_is_compared(reports: dict[int, dict[str, Any]], n: int) -> None:
    report = reports[n]
    expected = [h for name in LAYOUTS[n] for h in HARNESS.get(name, (name,))]
    assert report["layouts"] == expected and report["skipped"] == []
    for layout in expected:
        records = [r for r in report["results"] if r["layout"] == layout]
        for quantity in ("params_bytes", "grads_bytes", "optimizer_bytes"):
            assert sorted(r["rank"] for r in records if r["quantity"] == quantity) == list(range(n)), (layout, quantity)
        assert any(r["quantity"] == "activations_bytes" for r in records), layout
        assert any(r["quantity"].endswith("_count") for r in records), layout


def test_contract(reports: dict[int, dict[str, Any]]) -> None:
    keys = {"layout", "quantity", "rank", "predicted", "measured", "ratio", "ok"}
    for report in reports.values():
        assert set(report) >= {"results", "all_ok"}
        assert all(keys <= set(r) for r in report["results"])
    # routing decides what each expert rank receives: those quantities are compared as the mean over ranks
    ep = [r for r in reports[4]["results"] if r["layout"] == "ep" and r["quantity"] == "all_to_all_bytes"]
    assert ep and all(r["rank"] is None for r in ep)
    unmeasured = {(u["layout"], u["quantity"]) for u in reports[2]["unmeasured"]}
    assert {("pp_1f1b", "pipeline_stage_outputs_bytes"), ("fsdp", "fsdp_transient_bytes")} <= unmeasured
    text = render_check(reports[4])
    assert "fsdp_tp" in text and text.endswith("within target")


def test_bad_input_is_refused_before_any_launch() -> None:
    with pytest.raises(ValueError, match="unknown layout"):
        check_report(world_size=2, layouts="ddp,zero9")
    with pytest.raises(ValueError, match="does not fit"):
        check_report(world_size=2, layouts="fsdp_tp")
    with pytest.raises(ValueError, match="at least 2"):
        check_report(world_size=1)
    with pytest.raises(ValueError, match="must divide"):
        check_report(world_size=2, hidden=30, heads=8)
