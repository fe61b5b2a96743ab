"""Framework.TORCH formulas held against numbers re-derived here from the tiny model's shapes, and
Framework.MEGATRON held against values taken before the framework switch existed.

The expectations below are written out from the shapes (L, h, a, k, d, f, V, s, b) and from what PyTorch 2.13
does per layout (docs/check.md); none of them calls meshplan. No torch needed: the predictions are meshplan's.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from meshplan import io
from meshplan.check.cases import Shape
from meshplan.check.predict import Predicted, predict
from meshplan.core.memory import activations as act
from meshplan.core.params import count_params, param_inventory
from meshplan.core.plan import evaluate
from meshplan.core.pytorch import shards
from meshplan.core.stages import stage_row
from meshplan.reports.inputs import resolve_cluster
from meshplan.search.space import LayoutBatch
from meshplan.spec.layout import Layout, Recompute, Schedule, ZeroStage
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import PRECISIONS, Framework, Kernels, OptimizerKind, Workload

L, H, A, K, D, FF, V, S, B = 4, 32, 8, 4, 4, 64, 50, 16, 2
T, F32 = B * S, 4
E, R, FE = 8, 2, 32  # experts, experts per token, expert FFN
DENSE = Shape(num_layers=L, hidden=H, num_heads=A, num_kv_heads=K, head_dim=D, ffn_hidden=FF, vocab_size=V,
              seq_len=S, micro_batch=B)  # fmt: skip
MOE = dataclasses.replace(DENSE, num_experts=E, experts_per_token=R, expert_ffn_hidden=FE)
TINY = ModelSpec(name="tiny", num_layers=L, hidden=H, num_heads=A, num_kv_heads=K, head_dim=D, ffn_hidden=FF,
                 vocab_size=V)  # fmt: skip
# (rows, elements per row) of every parameter: embedding, then per layer attention_norm, wq, wk, wv, wo, ffn_norm,
# w1, w2, w3, then the final norm and the output projection
LAYER = [(H, 1), (A * D, H), (K * D, H), (K * D, H), (H, A * D), (H, 1), (FF, H), (H, FF), (FF, H)]
ROOT = [(V, H), (H, 1), (V, H)]
P = sum(r * c for r, c in ROOT + LAYER * L)
TENSORS = len(ROOT) + L * len(LAYER)


def values(layout: str, n: int, quantity: str, phase: str, *, moe: bool = False) -> dict[int | None, float]:
    """Predicted value per rank, summed over the groups of a 2-D mesh."""
    out: dict[int | None, float] = {}
    p: Predicted
    for p in predict(layout, n, DENSE, MOE if moe else None).values:
        if (p.quantity, p.phase) == (quantity, phase):
            out[p.rank] = out.get(p.rank, 0.0) + p.value
    return out


def one(layout: str, n: int, quantity: str, phase: str, rank: int = 0, **kw: bool) -> float:
    return values(layout, n, quantity, phase, **kw).get(rank, 0.0)


def rows(total: int, parts: int, index: int) -> int:
    chunk = math.ceil(total / parts)
    return max(0, min(chunk, total - index * chunk))


# ---- parameter inventory -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", io.list_models())
def test_inventory_sums_to_the_exact_count(name: str) -> None:
    model = io.load_model(name)
    inventory = param_inventory(model)
    assert sum(t.numel for t in inventory) == count_params(model).total
    assert len({t.name for t in inventory}) == len(inventory)


def test_inventory_of_the_tiny_model() -> None:
    shapes = [(t.shape[0], math.prod(t.shape[1:])) for t in param_inventory(TINY)]
    assert shapes == ROOT[:1] + LAYER * L + ROOT[1:]
    assert sum(r * c for r, c in shapes) == P == 40352


# ---- activations ------------------------------------------------------------------------------------------------


def layer_bytes(*, s: int, tp: int = 1, sp: bool = False, e: int = F32) -> int:
    """RMSNorm keeps x, x*rstd (fp32) and rstd; the QKV and MLP inputs (gathered under SP); SDPA q, k, v, out, lse;
    SwiGLU its four f-wide tensors."""
    t = B * s
    norms = 2 * (2 * t * H + t) * F32 // (tp if sp else 1)
    return norms + 2 * t * H * e + ((2 * t * A * D + 2 * t * K * D) * e + 4 * t * FF * e + B * A * s * F32) // tp


def top_bytes(*, s: int, tp: int = 1, sp: bool = False, e: int = F32) -> int:
    """Final norm, output input, fp32 log-softmax of all V logits, nll_loss's total weight."""
    t = B * s
    return (2 * t * H + t) * F32 // (tp if sp else 1) + t * H * e + t * V * F32 + 4


@pytest.mark.parametrize(("tp", "sp", "cp", "e"), [(1, False, 1, 4), (2, False, 1, 4), (4, False, 1, 4),
                                                   (2, True, 1, 4), (4, True, 1, 4), (1, False, 2, 4),
                                                   (1, False, 4, 4), (1, False, 1, 2), (2, True, 1, 2)])  # fmt: skip
def test_torch_activations(tp: int, sp: bool, cp: int, e: int) -> None:
    common = dict(seq_len=S, micro_batch=B, tp=tp, sp=sp, cp=cp, recompute=Recompute.NONE)
    got = act.layer_bytes(TINY, moe_layer=False, kernels=Kernels.EAGER, framework=Framework.TORCH, act_bytes=e,
                          attention=Workload(seq_len=S, global_batch=1).attention, **common)  # fmt: skip
    tokens = S // cp * B
    head = act.head_bytes(TINY, tokens=tokens, tp=tp, sp=sp, act_bytes=e, framework=Framework.TORCH)
    loss = act.loss_bytes(TINY, tokens=tokens, tp=tp, framework=Framework.TORCH)
    assert got == layer_bytes(s=S // cp, tp=tp, sp=sp, e=e)
    assert head + loss == top_bytes(s=S // cp, tp=tp, sp=sp, e=e)


def test_torch_moe_layer_activations() -> None:
    """Router softmax (fp32), per routed pair: expert input, returned and weighted rows, four expert SwiGLU tensors,
    six int64 indices and the gate weight."""
    spec = predict("ep", 2, DENSE, MOE)
    per_layer = 2 * (2 * T * H + T) * F32 + 2 * T * H * F32 + (2 * T * A * D + 2 * T * K * D) * F32 + B * A * S * F32
    routed = T * R * (3 * H * F32 + 4 * FE * F32 + 6 * 8 + F32)
    expected = L * (per_layer + T * E * F32 + routed) + top_bytes(s=S)
    got = [p.value for p in spec.values if p.quantity == "activations_bytes"]
    assert got == [expected, expected]


# ---- training state ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_fsdp2_shards_padded_dim0(n: int) -> None:
    for rank in range(n):
        owned = sum(rows(r, n, rank) * c for r, c in ROOT + LAYER * L)
        padded = sum(math.ceil(r / n) * c for r, c in ROOT + LAYER * L)
        at = shards.RankCoords(fsdp=n, fsdp_rank=rank)
        p = shards.rank_params(TINY, at, stage_row(TINY, pp=1, stage=0))
        assert (p.numel, p.padded_numel, p.tensors) == (owned, padded, TENSORS)


@pytest.mark.parametrize("n", [2, 4])
def test_state_bytes_per_layout(n: int) -> None:
    for rank in range(n):
        assert one("ddp", n, "params_bytes", "state", rank) == P * F32
        assert one("ddp", n, "ddp_bucket_bytes", "state", rank) == P * F32  # a second copy of the gradients
        assert one("ddp", n, "optimizer_bytes", "state", rank) == 2 * P * F32 + TENSORS * F32  # + a step per tensor
        owned = sum(rows(r, n, rank) * c for r, c in ROOT + LAYER * L)
        padded = sum(math.ceil(r / n) * c for r, c in ROOT + LAYER * L)
        assert one("fsdp", n, "params_bytes", "state", rank) == owned * F32
        assert one("fsdp", n, "params_storage_bytes", "state", rank) == padded * F32
        assert one("fsdp_bf16", n, "params_bytes", "state", rank) == owned * F32  # fp32 shards under bf16
        assert one("fsdp", n, "optimizer_bytes", "state", rank) == 2 * owned * F32 + TENSORS * F32
        vocab = rows(V, n, rank)
        tp_local = L * (2 * H + (sum(r * c for r, c in LAYER) - 2 * H) // n) + 2 * vocab * H + H
        assert one("tp", n, "params_bytes", "state", rank) == tp_local * F32
        short = math.ceil(V / n) - vocab  # rows a short last TP shard lacks: its storage is a whole chunk
        assert one("tp", n, "params_storage_bytes", "state", rank) == (tp_local + 2 * short * H) * F32
        assert one("tp", n, "grads_bytes", "state", rank) == (tp_local - vocab * H + V * H) * F32  # whole table grad
    root = sum(math.ceil(r / n) * c for r, c in ROOT)
    assert one("fsdp", n, "gathered_params_after_forward_bytes", "forward") == n * root * F32
    assert one("fsdp_reshard_root", n, "gathered_params_after_forward_bytes", "forward") == 0


def test_ddp_buckets_close_at_their_caps() -> None:
    """hidden 512: gradients ready output first; the first bucket closes past 1 MiB, the next past 25 MiB."""
    h, f, v = 512, 1024, 50
    model = ModelSpec(name="wide", num_layers=4, hidden=h, num_heads=8, num_kv_heads=4, head_dim=64, ffn_hidden=f,
                      vocab_size=v)  # fmt: skip
    layer = [h, 512 * h, 256 * h, 256 * h, h * 512, h, f * h, h * f, f * h]
    ready = [v * h, h] + list(reversed(layer)) * 4 + [v * h]
    buckets, filled, cap = 0, 0, 2**20
    for numel in ready:
        filled += 4 * numel
        if filled >= cap:
            buckets, filled, cap = buckets + 1, 0, 25 * 2**20
    buckets += filled > 0
    got = shards.ddp_buckets(model, shards.RankCoords(), stage_row(model, pp=1, stage=0), grad_bytes=4)
    assert got == buckets == 3


# ---- collectives ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 4])
def test_torch_collective_counts(n: int) -> None:
    hidden = T * H * F32
    assert one("ddp", n, "all_reduce_count", "backward") == 1 and one("ddp", n, "all_reduce_bytes", "backward") == P * 4
    assert one("ddp", n, "broadcast_bytes", "forward") == 2 * S * D * F32  # rotary cos and sin, every forward
    padded = sum(math.ceil(r / n) * c for r, c in ROOT + LAYER * L)
    root = sum(math.ceil(r / n) * c for r, c in ROOT)
    assert one("fsdp", n, "all_gather_count", "forward") == L + 1
    assert one("fsdp", n, "all_gather_bytes", "forward") == n * padded * F32
    assert one("fsdp", n, "all_gather_count", "backward") == L  # the root stays gathered
    assert one("fsdp", n, "all_gather_bytes", "backward") == n * (padded - root) * F32
    assert one("fsdp_reshard_root", n, "all_gather_count", "backward") == L + 1
    assert one("fsdp", n, "reduce_scatter_count", "backward") == L + 1
    assert one("fsdp_bf16", n, "all_gather_bytes", "forward") == n * padded * 2
    assert one("tp", n, "all_reduce_count", "forward") == 2 * L + 1  # wo, w2; the vocab-sharded embedding
    assert one("tp", n, "all_reduce_count", "backward") == 5 * L + 1  # one per colwise module; the head's input
    assert one("tp", n, "all_reduce_bytes", "backward") == (5 * L + 1) * hidden
    assert one("tp", n, "all_gather_bytes", "forward") == T * math.ceil(V / n) * n * F32  # padded logits
    assert one("sp", n, "all_gather_count", "forward") == 2 * L + 2
    assert one("sp", n, "reduce_scatter_count", "forward") == 2 * L + 1
    assert one("sp", n, "all_gather_count", "backward") == 2 * L + 1  # no second gather of the inputs
    assert one("sp", n, "reduce_scatter_count", "backward") == 2 * L + 1
    assert one("sp", n, "all_reduce_count", "optimizer") == 3 * (2 * L + 1)  # Partial norm grads, 3 AdamW reads
    assert one("sp", n, "all_reduce_bytes", "optimizer") == 3 * (2 * L + 1) * H * F32
    m = 2 * n
    for stage in range(n):
        assert one("pp_1f1b", n, "send_count", "forward", stage) == (m if stage < n - 1 else 0)
        assert one("pp_1f1b", n, "recv_count", "forward", stage) == (m if stage > 0 else 0)
        assert one("pp_gpipe", n, "send_bytes", "backward", stage) == (m * hidden if stage > 0 else 0)
    message = 2 * B * K * (S // n) * D * F32
    assert one("cp", n, "send_count", "forward") == L * (n - 1)
    assert one("cp", n, "send_count", "backward") == L * (2 * n - 1)  # K/V n-1 times, fp32 dK/dV n times
    assert one("cp", n, "recv_bytes", "backward") == L * (2 * n - 1) * message
    assert one("ep", n, "all_to_all_count", "forward", moe=True) == 3 * L  # counts, dispatch, combine
    assert one("ep", n, "all_to_all_count", "backward", moe=True) == 2 * L
    assert one("ep", n, "all_to_all_bytes", "forward", moe=True) == L * (8 * E + 2 * T * R * H * F32)


def test_fsdp_over_tp_shards_the_tp_local_tensors() -> None:
    tp_local = [(r // 2 if i in (1, 2, 3, 6, 8) else r, c // 2 if i in (4, 7) else c) for i, (r, c) in enumerate(LAYER)]
    root = [(math.ceil(V / 2), H), (H, 1), (math.ceil(V / 2), H)]
    padded = sum(math.ceil(r / 2) * c for r, c in root + tp_local * L)
    layers = sum(math.ceil(r / 2) * c for r, c in tp_local * L)
    by_axis: dict[str, float] = {}
    for p in predict("fsdp_tp", 4, DENSE).values:
        if p.rank == 0 and p.phase == "forward" and p.quantity == "all_gather_bytes":
            by_axis[p.axis] = p.value
    assert by_axis == {"dp_shard": 2 * padded * F32, "tp": (2 * L + 1) * T * H * F32 + T * math.ceil(V / 2) * 2 * 4}
    assert one("fsdp_tp", 4, "all_gather_bytes", "backward") == 2 * layers * F32 + (2 * L + 1) * T * H * F32
    assert one("fsdp_tp", 4, "all_reduce_count", "backward") == 2 * L + 1  # Partial norm grads, under FSDP2
    assert one("fsdp_tp", 4, "all_reduce_count", "optimizer") == 0


# ---- Megatron unchanged, vectorized agrees ----------------------------------------------------------------------

# Taken with the code before Framework existed (h100-sxm); change them only with a deliberate change of the model.
# Step times retaken when H100's sustained matmul share went from 0.61 to 0.64 (fitted over Llama 3 and the
# Megatron-Core weak-scaling runs) and ZeRO-3 gathered per layer, and again when attention moved to the published
# kernel tables (cuDNN on H100 for fused stacks, FlashAttention-2 for eager ones) and eager norms and rotary were
# itemized (mixtral), and again when collectives took NCCL's protocols and ring hops (-0.5% to +0.9%), and again
# when full recompute repeated the forward's CP exchange (gpt3-175b, CP 2 across nodes: +2.4%), and again when the
# tied embeddings' gradients were all-reduced between the first and last pipeline stage (gpt3-175b: +3.3 ms, the
# all-reduce of 50,257 / 8 x 12,288 bf16 gradients across two nodes); memory unchanged. Moved again by the GEMM
# shape law with H100's plateau refitted (0.64 -> 0.66): 8B +0.3%, 70B at TP 8 +0.9%, Mixtral +0.6%, GPT-3 +0.1%.
# Moved again by Transformer Engine's ring bookkeeping under CP (core/time/te_ring.py): GPT-3 at CP 2 +0.43%.
MEGATRON_PINS = {
    "llama-3.1-8b": (8, dict(zero=ZeroStage.PARAMETERS, dp_shard=8), 8192, 16, Kernels.FUSED,
                     [61856199219.2], 1.7417880529581573),
    "llama-3.1-70b": (64, dict(tp=8, sp=True, pp=4, dp_replicate=2, zero=ZeroStage.OPTIMIZER,
                               recompute=Recompute.SELECTIVE), 4096, 64, Kernels.FUSED,
                      [49645891328.0, 44591099648.0, 41637654272.0, 41079104051.2], 4.9940628082226555),
    "mixtral-8x7b": (32, dict(tp=2, ep=8, dp_replicate=16), 4096, 64, Kernels.EAGER, [86028817766.4],
                     2.065212824301391),  # the experts' weight gradients at their own depth since 2026-12-07
    "gpt3-175b": (128, dict(tp=8, pp=8, cp=2, schedule=Schedule.GPIPE, recompute=Recompute.FULL), 2048, 32,
                  Kernels.FUSED, [57381987686.4, *[55321432627.2] * 6, 58275103411.2], 2.714783088462206),
}  # fmt: skip
MEGATRON_BYTES_PER_STEP = {
    "llama-3.1-70b": {"sp/all_gather/backward": 171798691840.0, "sp/reduce_scatter/forward": 85899345920.0,
                      "pp/send_recv/forward": 268435456.0, "dp/all_reduce/backward": 4541530112.0},
    "gpt3-175b": {"cp/send_recv/backward": 4831838208.0, "tp/all_reduce/forward": 38654705664.0,
                  "pp/send_recv/backward": 100663296.0},
    "mixtral-8x7b": {"dp-experts/all_reduce/backward": 5637144576.0, "ep/all_to_all/forward": 17179869184.0},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(MEGATRON_PINS))
def test_megatron_unchanged(name: str) -> None:
    gpus, lay, seq, batch, kernels, stage_totals, step_s = MEGATRON_PINS[name]
    work = Workload(seq_len=seq, global_batch=batch, kernels=kernels)
    assert work.framework is Framework.MEGATRON
    plan = evaluate(io.load_model(name), resolve_cluster(gpu="h100-sxm", gpus=gpus), Layout(**lay), work)
    assert [s.total_bytes for s in plan.memory.stages] == pytest.approx(stage_totals, rel=1e-9)
    assert plan.step.step_time_s == pytest.approx(step_s, rel=1e-9)
    per_step: dict[str, float] = {}
    for c in plan.collectives:
        key = f"{c.strategy}/{c.op.value}/{c.phase}"
        per_step[key] = per_step.get(key, 0.0) + float(c.bytes_per_step)
    for key, value in MEGATRON_BYTES_PER_STEP.get(name, {}).items():
        assert per_step[key] == pytest.approx(value, rel=1e-9), key


def test_vectorized_torch_state_matches_one_layout_at_a_time() -> None:
    model = io.load_model("mixtral-8x7b")
    layouts = [Layout(tp=2, dp_shard=4, zero=ZeroStage.PARAMETERS), Layout(tp=4, sp=True, dp_replicate=2),
               Layout(pp=2, tp=2, dp_replicate=2), Layout(dp_replicate=8, ep=8)]  # fmt: skip
    batch = LayoutBatch.of(layouts)
    precision = PRECISIONS["fsdp2-bf16"]

    def state(lay: object) -> shards.TorchState:
        fsdp = np.where(lay.zero == ZeroStage.PARAMETERS, lay.dp_shard * lay.cp, 1)  # type: ignore[attr-defined]
        at = shards.RankCoords(tp=lay.tp, ep=lay.ep, fsdp=fsdp)  # type: ignore[attr-defined]
        units = stage_row(model, pp=lay.pp, stage=0)  # type: ignore[attr-defined]
        return shards.torch_state(model, at, units, zero=lay.zero, ddp_ranks=lay.dp_replicate,  # type: ignore[attr-defined]
                                  precision=precision, optimizer=OptimizerKind.ADAMW, moment_bytes=8.0)  # fmt: skip

    together = state(batch)
    for i, lay in enumerate(layouts):
        alone = state(lay)
        for name in shards.TorchState.__dataclass_fields__:
            assert np.asarray(getattr(together, name))[i] == pytest.approx(float(getattr(alone, name))), name


# ---- the check command's input handling (no torch needed) --------------------------------------------------------


def test_check_without_torch_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from meshplan.reports import check

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    with pytest.raises(ValueError) as err:
        check.check_report(world_size=2)
    assert str(err.value) == "meshplan check needs the torch extra: pip install 'meshplan[torch]'"


def test_layout_names() -> None:
    from meshplan.reports.check import LAYOUT_NAMES, parse_layouts

    assert parse_layouts("ddp, fsdp_tp,pp,ddp") == ("ddp", "fsdp_tp", "pp")
    assert LAYOUT_NAMES["pp"] == ("pp_gpipe", "pp_1f1b") and LAYOUT_NAMES["fsdp_tp"] == ("fsdp_tp",)
    from meshplan.check.runner import LAYOUTS

    assert set(LAYOUTS) == {name for names in LAYOUT_NAMES.values() for name in names}  # input names = output names
    assert parse_layouts(None) is None
    with pytest.raises(ValueError, match="unknown layout 'zero3'"):
        parse_layouts("ddp,zero3")
