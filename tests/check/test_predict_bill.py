"""meshplan check predicts through the stage bill users get: its numbers are the bill's terms, and a change to
the bill changes them (no torch needed: the prediction imports none)."""

from __future__ import annotations

import dataclasses

import pytest

from meshplan.check import predict as check_predict
from meshplan.check.cases import Shape
from meshplan.core.memory.bill import MemoryBill

TINY = Shape(
    num_layers=4, hidden=32, num_heads=8, num_kv_heads=4, head_dim=4, ffn_hidden=64, vocab_size=50, seq_len=16,
    micro_batch=2,
)  # fmt: skip
MOE = dataclasses.replace(TINY, num_experts=8)


def values(layout: str, n: int = 4) -> dict[tuple[int, str], float]:
    p = check_predict.predict(layout, n, TINY, MOE)
    return {(v.rank, v.quantity): v.value for v in p.values if v.phase in ("state", "forward")}


@pytest.mark.parametrize("layout", ["ddp", "fsdp", "fsdp_no_sync", "fsdp_no_reshard", "fsdp_sac_op", "pp_1f1b"])
def test_a_change_to_the_bill_shows_in_the_check(monkeypatch: pytest.MonkeyPatch, layout: str) -> None:
    before = values(layout)
    real = check_predict.stage_bill

    def heavier(*args: object, **kwargs: object) -> MemoryBill:
        bill = real(*args, **kwargs)  # type: ignore[arg-type]
        return dataclasses.replace(
            bill,
            weights_bytes=bill.weights_bytes + 1,
            gradients_bytes=bill.gradients_bytes + 2,
            optimizer_moments_bytes=bill.optimizer_moments_bytes + 3,
            activations_bytes=bill.activations_bytes + 4,
        )

    monkeypatch.setattr(check_predict, "stage_bill", heavier)
    after = values(layout)
    for rank in range(4):
        assert after[(rank, "params_storage_bytes")] == before[(rank, "params_storage_bytes")] + 1
        assert after[(rank, "grads_peak_bytes")] == before[(rank, "grads_peak_bytes")] + 2
        assert after[(rank, "optimizer_bytes")] == before[(rank, "optimizer_bytes")] + 3
        assert after[(rank, "activations_peak_bytes")] == before[(rank, "activations_peak_bytes")] + 4


def test_no_sync_gradient_is_the_bills_unsharded_fp32_gradient() -> None:
    """The bill's gradient term under grad_sync = false is 4 bytes per parameter on every rank (the whole model,
    unpadded), four times its sharded gradient at n = 4 give or take FSDP2's padding."""
    params = 4 * (2 * 32 + 32 * 32 + 2 * 16 * 32 + 32 * 32 + 3 * 64 * 32) + 2 * 50 * 32 + 32
    got = values("fsdp_no_sync")
    assert all(got[(r, "grads_peak_bytes")] == 4 * params for r in range(4))
    assert values("fsdp")[(0, "grads_peak_bytes")] == pytest.approx(4 * params / 4, rel=0.01)
