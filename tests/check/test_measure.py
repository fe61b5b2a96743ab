"""Real gloo runs of every layout at world sizes 2 and 4, held against closed forms derived here from the shapes.

Each expectation below is re-derived from the tiny model's shapes (L, h, a, k, d, f, V, s, b), independently of
the harness: parameter counts, FSDP2's dim-0 padding, collective counts per layer, message sizes, and the
saved-activation bytes per tensor.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest

pytest.importorskip("torch", reason="meshplan check needs torch (pip install torch==2.13.0)")

from meshplan.check.runner import DENSE, MOE, Measurement

pytestmark = pytest.mark.slow  # torch.distributed processes start in the fixtures

F32 = 4
C = DENSE
L, H, A, K, D, FF, V, S, B = (C.num_layers, C.hidden, C.num_heads, C.num_kv_heads, C.head_dim, C.ffn_hidden,
                              C.vocab_size, C.seq_len, C.micro_batch)  # fmt: skip
# (dim 0, other elements) of every parameter, in module order
LAYER_SHAPES = [(H, 1), (A * D, H), (K * D, H), (K * D, H), (H, A * D), (H, 1), (FF, H), (H, FF), (FF, H)]
ROOT_SHAPES = [(V, H), (H, 1), (V, H)]  # embedding, final norm, output
ALL_SHAPES = ROOT_SHAPES + LAYER_SHAPES * L
NUM_TENSORS = len(ALL_SHAPES)
PARAMS = sum(r * c for r, c in ALL_SHAPES)
LAYER_PARAMS = sum(r * c for r, c in LAYER_SHAPES)


@pytest.fixture(scope="module")
def runs(harness_runs: dict[int, list[Measurement]]) -> dict[int, list[Measurement]]:
    return harness_runs


def get(
    recs: list[Measurement], layout: str, quantity: str, phase: str, rank: int = 0, group: str | None = None
) -> int:
    found = [r.measured for r in recs if (r.layout, r.quantity, r.phase, r.rank) == (layout, quantity, phase, rank)
             and (group is None or r.group_ranks == group)]  # fmt: skip
    return sum(found)


def per_rank(recs: list[Measurement], layout: str, quantity: str, phase: str) -> dict[int, int]:
    out: dict[int, int] = defaultdict(int)
    for r in recs:
        if (r.layout, r.quantity, r.phase) == (layout, quantity, phase):
            out[r.rank] += r.measured
    return out


def layer_activation_bytes(*, s: int, tp: int = 1, sp: bool = False, elem: int = F32) -> int:
    """One block: RMSNorm saves x, x*rstd (fp32) and rstd; q/k/v and w1/w3 inputs; SDPA q, k, v, out, lse; SwiGLU."""
    norms = 2 * (2 * B * s * H + B * s) * F32 // (tp if sp else 1)
    block_inputs = 2 * B * s * H * elem  # gathered under SP: not divided by tp
    attention = (2 * B * s * A * D + 2 * B * s * K * D) * elem // tp + B * A * s * F32 // tp
    mlp = 4 * B * s * FF * elem // tp  # w1 out (silu input), silu out, w3 out, product (w2 input)
    return norms + block_inputs + attention + mlp


def top_activation_bytes(*, s: int, tp: int = 1, sp: bool = False) -> int:
    """Final norm (x, x*rstd, rstd), output input, fp32 log-softmax of the (gathered) logits, loss total weight."""
    return (2 * B * s * H + B * s) * F32 // (tp if sp else 1) + B * s * H * F32 + B * s * V * F32 + 4


def fsdp_rows(rows: int, n: int, rank: int) -> tuple[int, int]:
    """(unpadded, padded) dim-0 rows of one FSDP2 shard."""
    chunk = math.ceil(rows / n)
    return max(0, min(chunk, rows - rank * chunk)), chunk


@pytest.mark.parametrize("n", [2, 4])
def test_ddp(runs: dict[int, list[Measurement]], n: int) -> None:
    recs = runs[n]
    for rank in range(n):
        assert get(recs, "ddp", "params_bytes", "state", rank) == PARAMS * F32
        assert get(recs, "ddp", "grads_bytes", "state", rank) == PARAMS * F32
        assert get(recs, "ddp", "ddp_bucket_bytes", "state", rank) == PARAMS * F32
        assert get(recs, "ddp", "optimizer_bytes", "state", rank) == 2 * PARAMS * F32 + NUM_TENSORS * F32
    assert get(recs, "ddp", "all_reduce_count", "backward") == 1  # one bucket: the model is under 1 MiB
    assert get(recs, "ddp", "all_reduce_bytes", "backward") == PARAMS * F32
    assert get(recs, "ddp", "broadcast_bytes", "forward") == 2 * S * D * F32  # rotary buffers, every forward
    assert get(recs, "ddp", "activations_bytes", "forward") == L * layer_activation_bytes(s=S) + top_activation_bytes(
        s=S
    )
    assert get(recs, "ddp", "saved_inputs_bytes", "forward") == 2 * B * S * 8  # token ids and targets, int64


@pytest.mark.parametrize("n", [2, 4])
def test_fsdp(runs: dict[int, list[Measurement]], n: int) -> None:
    recs = runs[n]
    padded = sum(fsdp_rows(r, n, 0)[1] * c for r, c in ALL_SHAPES)
    root_padded = sum(fsdp_rows(r, n, 0)[1] * c for r, c in ROOT_SHAPES)
    for rank in range(n):
        local = sum(fsdp_rows(r, n, rank)[0] * c for r, c in ALL_SHAPES)
        for layout in ("fsdp", "fsdp_bf16", "fsdp_no_reshard"):
            assert get(recs, layout, "params_bytes", "state", rank) == local * F32  # fp32 shard even under bf16
            assert get(recs, layout, "params_storage_bytes", "state", rank) == padded * F32
            assert get(recs, layout, "grads_storage_bytes", "state", rank) == padded * F32
            assert get(recs, layout, "optimizer_bytes", "state", rank) == 2 * local * F32 + NUM_TENSORS * F32
    full = n * padded * F32
    layers = n * padded * F32 - n * root_padded * F32
    assert get(recs, "fsdp", "all_gather_count", "forward") == L + 1
    assert get(recs, "fsdp", "all_gather_bytes", "forward") == full
    assert get(recs, "fsdp", "all_gather_count", "backward") == L  # the root stays gathered
    assert get(recs, "fsdp", "all_gather_bytes", "backward") == layers
    assert get(recs, "fsdp", "gathered_params_after_forward_bytes", "forward") == n * root_padded * F32
    assert get(recs, "fsdp", "reduce_scatter_count", "backward") == L + 1
    assert get(recs, "fsdp", "reduce_scatter_bytes", "backward") == full
    assert get(recs, "fsdp_reshard_root", "all_gather_count", "backward") == L + 1
    assert get(recs, "fsdp_no_reshard", "all_gather_count", "backward") == 0
    assert get(recs, "fsdp_no_reshard", "gathered_params_after_forward_bytes", "forward") == full
    assert get(recs, "fsdp_bf16", "all_gather_bytes", "forward") == full // 2
    assert get(recs, "fsdp_bf16", "reduce_scatter_bytes", "backward") == full  # reduce_dtype fp32
    assert get(recs, "fsdp_bf16_reduce_bf16", "reduce_scatter_bytes", "backward") == full // 2
    for layout in ("fsdp", "fsdp_bf16", "ddp"):
        assert get(recs, layout, "all_reduce_count", "optimizer") == 0
    # bf16 compute: RMSNorm still saves fp32 x, x*rstd, rstd; SDPA's logsumexp and the loss stay fp32; FSDP2 casts
    # the rotary tables passed to every block to bf16 (two (s, d) copies per block)
    bf16 = L * (layer_activation_bytes(s=S, elem=2) + 2 * S * D * 2) + top_activation_bytes(s=S) - B * S * H * 2
    assert get(recs, "fsdp_bf16", "activations_bytes", "forward") == bf16


@pytest.mark.parametrize("n", [2, 4])
def test_tensor_parallel(runs: dict[int, list[Measurement]], n: int) -> None:
    recs = runs[n]
    hidden_bytes = B * S * H * F32
    logits_gathered = B * S * math.ceil(V / n) * n * F32  # uneven vocab shards are padded for the all-gather
    assert get(recs, "tp", "all_reduce_count", "forward") == 2 * L + 1  # wo, w2 per block; embedding
    assert get(recs, "tp", "all_reduce_bytes", "forward") == (2 * L + 1) * hidden_bytes
    assert get(recs, "tp", "all_reduce_count", "backward") == 5 * L + 1  # one per colwise linear; output input
    assert get(recs, "tp", "all_gather_bytes", "forward") == logits_gathered
    assert get(recs, "sp", "all_gather_count", "forward") == 2 * L + 2
    assert get(recs, "sp", "reduce_scatter_count", "forward") == 2 * L + 1
    assert get(recs, "sp", "all_gather_count", "backward") == 2 * L + 1
    assert get(recs, "sp", "reduce_scatter_count", "backward") == 2 * L + 1
    assert get(recs, "sp", "reduce_scatter_bytes", "backward") == (2 * L + 1) * hidden_bytes
    # the 2L+1 norm weights keep Partial gradients; AdamW all-reduces each at its 3 uses
    assert get(recs, "sp", "all_reduce_count", "optimizer") == 3 * (2 * L + 1)
    assert get(recs, "sp", "all_reduce_bytes", "optimizer") == 3 * (2 * L + 1) * H * F32
    rows = math.ceil(V / n)
    sharded = L * (LAYER_PARAMS - 2 * H) // n + L * 2 * H + 2 * rows * H + H
    assert get(recs, "tp", "params_bytes", "state") == sharded * F32
    assert get(recs, "tp", "grads_bytes", "state") == (sharded - rows * H + V * H) * F32  # full embedding grad
    assert get(recs, "tp", "activations_bytes", "forward") == L * layer_activation_bytes(
        s=S, tp=n
    ) + top_activation_bytes(s=S)
    assert get(recs, "sp", "activations_bytes", "forward") == L * layer_activation_bytes(
        s=S, tp=n, sp=True
    ) + top_activation_bytes(s=S, tp=n, sp=True)


def test_fsdp_tp(runs: dict[int, list[Measurement]]) -> None:
    recs = runs[4]
    tp_group, dp_group = "0,1", "0,2"
    assert get(recs, "fsdp_tp", "all_gather_count", "forward", group=tp_group) == 2 * L + 2
    assert get(recs, "fsdp_tp", "reduce_scatter_count", "backward", group=tp_group) == 2 * L + 1
    assert get(recs, "fsdp_tp", "all_reduce_count", "backward", group=tp_group) == 2 * L + 1  # Partial norm grads
    assert get(recs, "fsdp_tp", "all_reduce_count", "optimizer") == 0
    assert get(recs, "fsdp_tp", "all_gather_count", "forward", group=dp_group) == L + 1
    assert get(recs, "fsdp_tp", "all_gather_count", "backward", group=dp_group) == L
    assert get(recs, "fsdp_tp", "reduce_scatter_count", "backward", group=dp_group) == L + 1


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline(runs: dict[int, list[Measurement]], n: int, schedule: str) -> None:
    recs, layout, m = runs[n], f"pp_{schedule}", 2 * n
    per_stage = L // n
    middle = per_stage * layer_activation_bytes(s=S)
    last = middle + top_activation_bytes(s=S)
    peaks = per_rank(recs, layout, "activations_peak_bytes", "forward")
    for stage in range(n):
        if stage < n - 1:
            assert get(recs, layout, "send_count", "forward", stage) == m
            assert get(recs, layout, "send_bytes", "forward", stage) == m * B * S * H * F32
            assert get(recs, layout, "recv_count", "backward", stage) == m
        if stage > 0:
            assert get(recs, layout, "send_count", "backward", stage) == m
            assert get(recs, layout, "recv_count", "forward", stage) == m
        act = last if stage == n - 1 else middle
        assert get(recs, layout, "activations_bytes", "forward", stage) == m * act
        in_flight = m if schedule == "gpipe" else min(m, n - stage)
        assert peaks[stage] == in_flight * act


@pytest.mark.parametrize("n", [2, 4])
def test_expert_parallel(runs: dict[int, list[Measurement]], n: int) -> None:
    recs, cfg = runs[n], MOE
    tokens = cfg.micro_batch * cfg.seq_len
    dense = 2 * cfg.vocab_size * cfg.hidden + cfg.hidden + cfg.num_layers * (
        2 * cfg.hidden + 2 * cfg.hidden * cfg.num_heads * cfg.head_dim
        + 2 * cfg.hidden * cfg.num_kv_heads * cfg.head_dim + cfg.hidden * cfg.num_experts
    )  # fmt: skip
    experts = cfg.num_layers * cfg.num_experts // n * 3 * cfg.hidden * cfg.expert_ffn_hidden
    for rank in range(n):
        assert get(recs, "ep", "params_bytes", "state", rank) == (dense + experts) * F32
        assert get(recs, "ep", "all_to_all_count", "forward", rank) == 3 * cfg.num_layers
        assert get(recs, "ep", "all_to_all_count", "backward", rank) == 2 * cfg.num_layers
        # forward = counts (E int64) + dispatch (T t h) + combine (R h); backward = grads of combine (T t h) and
        # dispatch (R h): their difference is the count exchange alone, whatever the routing
        fwd = get(recs, "ep", "all_to_all_bytes", "forward", rank)
        bwd = get(recs, "ep", "all_to_all_bytes", "backward", rank)
        assert fwd - bwd == cfg.num_layers * cfg.num_experts * 8
        assert fwd >= cfg.num_layers * tokens * cfg.experts_per_token * cfg.hidden * F32
        assert get(recs, "ep", "all_reduce_bytes", "backward", rank) == dense * F32  # DDP skips the experts


@pytest.mark.parametrize("n", [2, 4])
def test_context_parallel(runs: dict[int, list[Measurement]], n: int) -> None:
    recs = runs[n]
    kv_message = 2 * B * K * (S // n) * D * F32
    assert get(recs, "cp", "send_count", "forward") == L * (n - 1)
    assert get(recs, "cp", "recv_count", "forward") == L * (n - 1)
    assert get(recs, "cp", "send_count", "backward") == L * (2 * n - 1)  # K/V n-1 times, dK/dV n times
    assert get(recs, "cp", "send_bytes", "backward") == L * (2 * n - 1) * kv_message
    assert get(recs, "cp", "all_reduce_bytes", "backward") == PARAMS * F32
    assert get(recs, "cp", "activations_bytes", "forward") == L * layer_activation_bytes(
        s=S // n
    ) + top_activation_bytes(s=S // n)


def test_no_collective_bypasses_dispatch(runs: dict[int, list[Measurement]]) -> None:
    for recs in runs.values():
        assert all(r.measured == 0 for r in recs if r.quantity == "python_calls_bypassing_dispatch")
        assert get(recs, "fsdp", "python_collective_calls", "step") == (L + 1) + L + (
            L + 1
        )  # FSDP2 calls the c10d Python API
