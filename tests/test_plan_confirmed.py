"""Every plan the search returns is confirmed by ``estimate`` on the same layout: same verdict, same step time,
same memory per GPU (the heaviest stage, found by billing every stage)."""

from __future__ import annotations

import pytest

from meshplan.reports.estimate import estimate_report
from meshplan.reports.inputs import LayoutRequest
from meshplan.reports.plan import plan_report

CASES = [
    ("deepseek-v3", "h200", 256, 4096, 4 * 2**20),  # the dense-first MoE whose stage 2 was missed
    ("qwen3-235b-a22b", "h100-sxm", 128, 4096, 4 * 2**20),
    ("megatron-22b", "a100-80gb", 64, 2048, 2**20),  # 48 layers: uneven splits at pp 32
    ("mixtral-8x22b", "h100-sxm", 64, 4096, 2**21),
    ("llama-3.1-405b", "h100-sxm", 1024, 8192, 16 * 2**20),
]


@pytest.mark.parametrize(("model", "gpu", "gpus", "seq", "tokens"), CASES, ids=[c[0] for c in CASES])
def test_plans_are_confirmed_by_estimate(model: str, gpu: str, gpus: int, seq: int, tokens: int) -> None:
    out = plan_report(model, gpu=gpu, gpus=gpus, seq=seq, global_batch_tokens=tokens, top=5, headroom=0.0)
    assert out["plans"], "something fits"
    for plan in out["plans"]:
        layout = LayoutRequest.parse(plan["layout"])  # the plan's JSON layout reads back as typed
        est = estimate_report(model, gpu=gpu, gpus=gpus, layout=layout, seq=seq, global_batch=tokens // seq)
        assert est["fits"] is True
        assert est["step_time_s"] == pytest.approx(plan["step_time_s"], rel=1e-9)
        assert est["per_gpu"]["total_bytes"] == pytest.approx(plan["per_gpu"]["total_bytes"], rel=1e-9)
