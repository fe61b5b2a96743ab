"""The PyTorch-native run conditions a CPU can show, on 2 gloo ranks: gradient accumulation without gradient
sync, FSDP2 with reshard-after-forward off, and torchtitan's per-op selective activation checkpointing.

Each measured number is first re-derived here from the tiny model's shapes (independently of meshplan), then
the whole run is held against meshplan's prediction, which comes from the stage bill under the schema's
conditions (grad_sync, reshard_after_forward, selective = op, the last also under TP with and without SP)."""

from __future__ import annotations

import dataclasses
import math

import pytest

pytest.importorskip("torch", reason="meshplan check needs torch (pip install torch==2.13.0)")

from meshplan.check.compare import compare
from meshplan.check.predict import predict
from meshplan.check.runner import DENSE, MOE, Measurement, run_check

pytestmark = pytest.mark.slow  # torch.distributed processes start in the fixtures

N, F32 = 2, 4
C = DENSE
L, H, A, K, D, FF, V, S, B = (C.num_layers, C.hidden, C.num_heads, C.num_kv_heads, C.head_dim, C.ffn_hidden,
                              C.vocab_size, C.seq_len, C.micro_batch)  # fmt: skip
LAYER_SHAPES = [(H, 1), (A * D, H), (K * D, H), (K * D, H), (H, A * D), (H, 1), (FF, H), (H, FF), (FF, H)]
ROOT_SHAPES = [(V, H), (H, 1), (V, H)]  # embedding, final norm, output
PARAMS = sum(r * c for r, c in ROOT_SHAPES + LAYER_SHAPES * L)
LAYOUTS = ["fsdp", "fsdp_no_sync", "fsdp_no_reshard", "fsdp_sac_op", "tp_sac_op", "sp_sac_op"]


@pytest.fixture(scope="module")
def recs() -> list[Measurement]:
    return run_check(N, LAYOUTS)


def get(recs: list[Measurement], layout: str, quantity: str, phase: str, rank: int = 0) -> int:
    return sum(r.measured for r in recs if (r.layout, r.quantity, r.phase, r.rank) == (layout, quantity, phase, rank))


def test_accumulation_without_sync_holds_the_unsharded_fp32_gradient(recs: list[Measurement]) -> None:
    # every rank keeps every parameter's whole gradient (unpadded, fp32) until the last micro-batch
    assert get(recs, "fsdp_no_sync", "grads_peak_bytes", "state") == PARAMS * F32
    assert get(recs, "fsdp", "grads_peak_bytes", "state") < PARAMS * F32 / N + 1024  # sharded: about 1/N
    # two micro-batches: both gather every unit (FSDP2 still reshards after backward), only the last reduces
    assert get(recs, "fsdp_no_sync", "all_gather_count", "forward") == 2 * (L + 1)
    assert get(recs, "fsdp_no_sync", "all_gather_count", "backward") == 2 * L
    assert get(recs, "fsdp_no_sync", "reduce_scatter_count", "backward") == L + 1
    assert get(recs, "fsdp_no_sync", "activations_bytes", "forward") == 2 * get(
        recs, "fsdp", "activations_bytes", "forward"
    )
    assert get(recs, "fsdp_no_sync", "activations_peak_bytes", "forward") == get(
        recs, "fsdp", "activations_peak_bytes", "forward"
    )


def test_reshard_after_forward_off_keeps_every_unit_gathered(recs: list[Measurement]) -> None:
    padded = sum(math.ceil(r / N) * c for r, c in ROOT_SHAPES + LAYER_SHAPES * L) * N
    assert get(recs, "fsdp_no_reshard", "gathered_params_after_forward_bytes", "forward") == padded * F32
    assert get(recs, "fsdp_no_reshard", "all_gather_count", "backward") == 0
    assert get(recs, "fsdp_no_reshard", "all_gather_count", "forward") == L + 1
    largest_unit = max(
        sum(math.ceil(r / N) * c for r, c in LAYER_SHAPES), sum(math.ceil(r / N) * c for r, c in ROOT_SHAPES)
    )
    assert get(recs, "fsdp_no_reshard", "comm_buffers_bytes", "state") == (padded + N * largest_unit) * F32


def sac_layer_bytes(ffn: int) -> int:
    """One block under torchtitan's per-op policy: its input, the odd-numbered matmul outputs of its forward (wq,
    wv, w1, w2 of wq wk wv wo w1 w3 w2), the attention output and its fp32 log-sum-exp."""
    tokens = B * S
    return tokens * (H + (A * D + K * D + ffn + H) + A * D) * F32 + B * A * S * F32


def test_per_op_checkpointing_keeps_what_its_policy_saves(recs: list[Measurement]) -> None:
    full_layer = (  # as test_measure.layer_activation_bytes: norms, block inputs, attention, SwiGLU
        2 * (2 * B * S * H + B * S) * F32
        + 2 * B * S * H * F32
        + (2 * B * S * A * D + 2 * B * S * K * D) * F32
        + B * A * S * F32
        + 4 * B * S * FF * F32
    )
    outside_layers = get(recs, "fsdp", "activations_bytes", "forward") - L * full_layer
    want = L * sac_layer_bytes(FF) + outside_layers
    assert get(recs, "fsdp_sac_op", "activations_bytes", "forward") == want
    assert get(recs, "fsdp_sac_op", "activations_peak_bytes", "forward") == want


@pytest.mark.parametrize("layout", LAYOUTS)
def test_predicted_from_the_bill_within_target(recs: list[Measurement], layout: str) -> None:
    records = compare(predict(layout, N, DENSE, MOE), recs, world_size=N)
    assert records and all(r["ok"] for r in records), [r for r in records if not r["ok"]]
    quantities = {r["quantity"] for r in records}
    assert {"grads_peak_bytes", "optimizer_bytes", "activations_peak_bytes"} <= quantities


def test_per_op_checkpointing_with_a_wider_mlp() -> None:
    cfg = dataclasses.replace(DENSE, ffn_hidden=3 * H)
    records = compare(predict("fsdp_sac_op", N, cfg, MOE), run_check(N, ["fsdp_sac_op"], dense=cfg), world_size=N)
    acts = [r for r in records if r["quantity"] == "activations_bytes"]
    assert acts and all(r["ok"] for r in acts), acts


def test_per_op_checkpointing_gathers_the_tp_inputs_again(recs: list[Measurement]) -> None:
    """Backward under SP: an all-gather for each forward reduce-scatter's gradient (2 per layer, and the
    embedding's), and again the two all-gathered inputs of wq/wk/wv and w1/w3, which the policy does not save.
    Without SP: an all-reduce per column-parallel input (wq, wk, wv, w1, w3, and the head's), and again the
    attention output's all-reduce, whose sum the MLP norm's recomputed input needs (the MLP's is the block's
    output, not needed)."""
    assert get(recs, "sp_sac_op", "all_gather_count", "backward") == 2 * L + 1 + 2 * L
    assert get(recs, "sp_sac_op", "reduce_scatter_count", "backward") == 2 * L + 1
    assert get(recs, "tp_sac_op", "all_reduce_count", "backward") == 5 * L + 1 + L
