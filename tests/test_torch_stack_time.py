"""What PyTorch-native stacks pay beyond the kernels, derived by hand for Llama 3.1 8B (32 query heads, 8 K/V
heads of 128): --repeat-kv (torchtitan's Llama repeats K and V to the query heads before SDPA), PyTorch's ring
merging, and the eager fp32-upcast cross-entropy."""

from __future__ import annotations

import pytest
from compute_setups import gpu_setup

from meshplan import io
from meshplan.core.plan import evaluate
from meshplan.core.time.compute import layer_time
from meshplan.reports.inputs import resolve_cluster
from meshplan.spec.conditions import Conditions, LossKind
from meshplan.spec.layout import Layout, Recompute, ZeroStage
from meshplan.spec.workload import Framework, Kernels, Workload
from meshplan.units import DType

LLAMA_8B = io.load_model("llama-3.1-8b")
SEQ, CP = 65536, 2


def _cp_bytes(repeat_kv: bool) -> dict[str, float]:
    work = Workload(seq_len=SEQ, global_batch=4, framework=Framework.TORCH, conditions=Conditions(repeat_kv=repeat_kv))
    layout = Layout(cp=CP, dp_shard=4, zero=ZeroStage.PARAMETERS, recompute=Recompute.FULL)
    plan = evaluate(LLAMA_8B, resolve_cluster(gpu="h100-sxm", gpus=8), layout, work)
    out: dict[str, float] = {}
    for c in plan.collectives:
        if c.strategy == "cp":
            out[c.phase] = out.get(c.phase, 0.0) + float(c.size_bytes * c.count_per_step)
    return out


def test_ring_passes_the_repeated_heads() -> None:
    """The K/V block of one rank is s/cp tokens x 2 x 1,024 wide in bf16, 4x that (32 heads, not 8) repeated."""
    grouped, repeated = _cp_bytes(False), _cp_bytes(True)
    block = SEQ // CP * 2 * 1024 * 2
    # 32 layers, one micro-batch; full recompute exchanges again in the recomputed forward
    assert grouped["forward"] == pytest.approx(2 * 32 * (CP - 1) * block, rel=1e-12)
    assert repeated == pytest.approx({phase: 4 * b for phase, b in grouped.items()}, rel=1e-12)


def test_the_repeat_copies_move_their_bytes() -> None:
    """Per token forward: read K and V (2 x 1,024) and write them repeated (2 x 4,096), 2 bytes each."""
    g = io.load_gpu("h100-sxm")

    def layer(repeat_kv: bool):  # type: ignore[no-untyped-def]
        setup = gpu_setup(kernels=Kernels.FUSED, repeat_kv=repeat_kv)
        return layer_time(LLAMA_8B, setup=setup, tokens=8192, seq_len=8192, tp=1, sp=False, ep=1, moe_layer=False)

    extra = layer(True).memory_s - layer(False).memory_s
    assert extra == pytest.approx(
        8192 * 2 * (2 * 1024 + 2 * 4096) / (g.hbm_bandwidth_bytes_per_s * g.calibration.hbm_efficiency)
    )


def test_ring_merging_at_hbm_speed() -> None:
    """PyTorch's ring over 8 ranks, 32K local tokens of Llama 3.1 8B with K and V repeated (E = 32,768 x 4,096
    elements each of Q and of K or V): forward 7 merges of 32.5 bytes, 12 + 16 once, and 6 more flat K/V
    concatenations of 8, 303.5 E; backward 7 x (11.5 + 2 x 19.5) + 20 + 72 + 6 x 8 = 493.5 E. One rank (cp 1)
    merges nothing."""
    g = io.load_gpu("h100-sxm")
    hbm = g.hbm_bandwidth_bytes_per_s * g.calibration.hbm_efficiency
    tokens = 32768

    def layer(ring_merge: bool, cp: int):  # type: ignore[no-untyped-def]
        setup = gpu_setup(kernels=Kernels.FUSED, repeat_kv=True, ring_merge=ring_merge)
        return layer_time(
            LLAMA_8B,
            setup=setup,
            tokens=tokens,
            seq_len=tokens * cp,
            tp=1,
            sp=False,
            ep=1,
            moe_layer=False,
            kernel_keys=tokens,
            cp=cp,
        )

    e = tokens * 4096
    merged, plain = layer(True, 8), layer(False, 8)
    assert merged.attention_s - plain.attention_s == pytest.approx(303.5 * e / hbm, rel=1e-9)
    assert merged.backward_s - plain.backward_s == pytest.approx(493.5 * e / hbm, rel=1e-9)
    assert layer(True, 1).forward_s == layer(False, 1).forward_s


def test_the_upcast_loss_moves_its_bytes() -> None:
    """cross_entropy(logits.float()) in eager PyTorch: 22 bytes per logit forward and 26 backward, against the
    fused loss's 8 and 8; 8,192 tokens of a 128,256-entry vocabulary."""
    from meshplan.core.time.compute import LOSS_BYTES, head_time
    from meshplan.spec.conditions import LossKind

    g = io.load_gpu("h100-sxm")
    common = dict(
        tokens=8192,
        tp=1,
        peak_flops=g.peak(DType.BF16),
        hbm_bytes_per_s=g.hbm_bandwidth_bytes_per_s,
        cal=g.calibration,
        act_bytes=2.0,
    )
    fused_f, fused_b = head_time(LLAMA_8B, loss_bytes=LOSS_BYTES[LossKind.FRAMEWORK], **common)  # type: ignore[arg-type]
    eager_f, eager_b = head_time(LLAMA_8B, loss_bytes=LOSS_BYTES[LossKind.UPCAST], **common)  # type: ignore[arg-type]
    logits_s = 8192 * 128256 / (g.hbm_bandwidth_bytes_per_s * g.calibration.hbm_efficiency)
    assert eager_f - fused_f == pytest.approx(14 * logits_s, rel=1e-9)
    assert eager_b - fused_b == pytest.approx(18 * logits_s, rel=1e-9)


def test_fsdp2_copies_on_the_compute_stream() -> None:
    """FSDP2 over 8 ranks (bf16 gathered, fp32 gradients reduced): per layer and micro-batch 4 bytes per weight
    copied out after the forward all-gather, 4 after the backward one, 2 + 4 into the reduce-scatter input;
    32 layers of 218,103,808 weights, one micro-batch (global batch 8 over 8 ranks)."""
    from meshplan.spec.workload import PRECISIONS

    def compute_s(fsdp_copies: bool, zero: ZeroStage = ZeroStage.PARAMETERS) -> float:
        work = Workload(
            seq_len=4096,
            global_batch=8,
            precision=PRECISIONS["fsdp2-bf16"],
            framework=Framework.TORCH,
            conditions=Conditions(fsdp_copies=fsdp_copies),
        )
        layout = Layout(dp_shard=8, zero=zero)
        return float(evaluate(LLAMA_8B, resolve_cluster(gpu="h100-sxm", gpus=8), layout, work).step.compute_s)

    g = io.load_gpu("h100-sxm")
    hbm = g.hbm_bandwidth_bytes_per_s * g.calibration.hbm_efficiency
    expected = 32 * 218103808 * (4 + 4 + 2 + 4) / hbm
    assert compute_s(True) - compute_s(False) == pytest.approx(expected, rel=1e-9)
    # without ZeRO-3 nothing is gathered: no copies
    assert compute_s(True, ZeroStage.OPTIMIZER) == compute_s(False, ZeroStage.OPTIMIZER)


def _head(loss_parallel: bool):  # type: ignore[no-untyped-def]
    """Llama 3.1 8B, TP 4 with SP over one node, one micro-batch of 8,192 tokens, eager upcast loss."""
    cond = Conditions(loss=LossKind.UPCAST, loss_parallel=loss_parallel)
    work = Workload(seq_len=8192, global_batch=1, framework=Framework.TORCH, conditions=cond)
    layout = Layout(tp=4, sp=True, dp_replicate=1)
    return evaluate(LLAMA_8B, resolve_cluster(gpu="h100-sxm", gpus=4), layout, work), work


def test_loss_parallel_gathers_no_logits_and_splits_the_loss() -> None:
    """torchtitan's output head under loss_parallel keeps its vocabulary shards (ColwiseParallel with
    output_layouts=Shard(-1)): no TP all-gather of the 8,192 x 128,256 logits, and the upcast loss's 22 + 26 bytes a
    logit run on the rank's quarter of them; without it the padded logits are gathered and every rank runs the loss
    on all of them."""
    split, _ = _head(True)
    whole, _ = _head(False)
    logits = 8192 * 128256

    def gathered(plan) -> float:  # type: ignore[no-untyped-def]
        sizes = [c.size_bytes * c.count_per_step for c in plan.collectives if c.strategy == "tp"]
        return float(sum(s for s in sizes if s >= logits))  # only the logits are that large

    assert gathered(split) == 0.0
    assert gathered(whole) == pytest.approx(logits * 2, rel=1e-12)  # bf16, 128,256 divides by 4: no padding
    g = io.load_gpu("h100-sxm")
    hbm = g.hbm_bandwidth_bytes_per_s * g.calibration.hbm_efficiency
    extra = whole.step.compute_s - split.step.compute_s
    assert extra == pytest.approx((22 + 26) * logits * (1 - 1 / 4) / hbm, rel=1e-9)


def test_the_compiled_loss_reads_the_logits_once_each_way() -> None:
    """torch.compile'd cross_entropy(logits.float()): 2 bytes a logit forward, 4 backward (read, and the bf16
    gradient written), where the eager upcast moves 22 and 26; one GPU, 8,192 tokens of Llama 3.1 8B."""

    def step(loss: LossKind) -> float:
        work = Workload(seq_len=8192, global_batch=1, framework=Framework.TORCH, conditions=Conditions(loss=loss))
        plan = evaluate(LLAMA_8B, resolve_cluster(gpu="h100-sxm", gpus=1), Layout(dp_replicate=1), work)
        return float(plan.step.compute_s)

    g = io.load_gpu("h100-sxm")
    hbm = g.hbm_bandwidth_bytes_per_s * g.calibration.hbm_efficiency
    logits = 8192 * 128256
    assert step(LossKind.UPCAST) - step(LossKind.COMPILED) == pytest.approx((48 - 6) * logits / hbm, rel=1e-9)


def _tp_plan(micro_batch: int, **kw: object):  # type: ignore[no-untyped-def]
    """Llama 3.1 8B under torchtitan's per-op checkpointing, TP 8 with SP on one node, ``micro_batch``
    sequences of 8,192 tokens, bf16 unless ``kw`` says otherwise."""
    from meshplan.spec.conditions import Fp8Recipe, Selective
    from meshplan.spec.workload import PRECISIONS, Overlap

    fp8 = kw.pop("fp8", None)
    cond = Conditions(selective=Selective.OP, fp8_recipe=Fp8Recipe(fp8) if fp8 else None)
    work = Workload(
        seq_len=8192,
        global_batch=micro_batch,
        framework=Framework.TORCH,
        precision=PRECISIONS["fp8" if fp8 else "fsdp2-bf16"],
        conditions=cond,
        overlap=Overlap(tp=bool(kw.pop("async_tp", False))),
    )
    recompute = kw.pop("recompute", Recompute.SELECTIVE)
    layout = Layout(tp=8, sp=True, micro_batch=micro_batch, recompute=recompute)
    cluster = resolve_cluster(gpu="h100-sxm", gpus=8)
    return evaluate(LLAMA_8B, cluster, layout, work), (LLAMA_8B, layout, work, cluster)


def _copy_bytes_per_token(micro_batch: int, **kw: object) -> tuple[float, float]:
    from meshplan.core.time.stage_time import layer_kinds

    _, args = _tp_plan(micro_batch, **kw)
    dense = layer_kinds(*args).dense
    g = io.load_gpu("h100-sxm")
    per_token_s = 8192 * micro_batch / (g.hbm_bandwidth_bytes_per_s * g.calibration.hbm_efficiency)
    return float(dense.tp_copy_fwd_s / per_token_s), float(dense.tp_copy_bwd_s / per_token_s)


def test_sequence_parallel_collectives_copy_along_the_sequence() -> None:
    """PyTorch's functional collectives work on dim 0: a reduce-scatter along the sequence first copies its
    [b, s, h] input into rank order, an all-gather's output is copied back into sequence order unless b = 1.
    Per token of Llama 3.1 8B (h = 4,096) one copy reads and writes 2 x 4,096 x 2 bytes (bf16) = 16,384."""
    copy = 2 * 4096 * 2
    # b = 12: forward 2 gathers + 2 scatters; backward the 4 autograd counterparts and the 2 gathers the per-op
    # policy repeats before the weight gradients of wq/wk/wv and w1/w3
    assert _copy_bytes_per_token(12) == pytest.approx((4 * copy, 6 * copy), rel=1e-12)
    # b = 1: the gathers are views; only the 2 scatters forward and their 2 counterparts backward copy
    assert _copy_bytes_per_token(1) == pytest.approx((2 * copy, 2 * copy), rel=1e-12)
    # full recompute repeats the forward's 4 copies in backward
    assert _copy_bytes_per_token(12, recompute=Recompute.FULL) == pytest.approx((4 * copy, 8 * copy), rel=1e-12)
    # torchao's Float8 tensorwise TP gathers FP8: the forward gathers and their repeats copy 1 byte an element
    fp8_copy = 2 * 4096 * 1
    want = (2 * fp8_copy + 2 * copy, 4 * copy + 2 * fp8_copy)
    assert _copy_bytes_per_token(12, fp8="tensorwise") == pytest.approx(want, rel=1e-12)
    assert _copy_bytes_per_token(12, fp8="rowwise") == pytest.approx((4 * copy, 6 * copy), rel=1e-12)
    # async TP restrides the fused matmul-collectives' operands; the input gradients' reduce-scatters (each a sum
    # of several matmuls') keep their copies
    assert _copy_bytes_per_token(12, async_tp=True) == pytest.approx((0.0, 2 * copy), rel=1e-12)


def test_float8_tensorwise_tp_gathers_fp8_and_the_policy_gathers_again() -> None:
    """The forward all-gathers move b s h elements of 1 byte under Float8 tensorwise TP (2 under rowwise, which
    torchtitan runs as plain TP), and the per-op policy repeats both of them in backward: 32 layers x 2."""
    tokens = 8192 * 2

    def sp_gathers(plan, phase: str) -> list[tuple[float, float]]:  # type: ignore[no-untyped-def]
        return sorted(
            (float(c.size_bytes), float(c.count_per_step))
            for c in plan.collectives
            if c.strategy == "sp" and c.op == "all_gather" and c.phase == phase and c.count_per_step
        )

    tensorwise, _ = _tp_plan(2, fp8="tensorwise")
    rowwise, _ = _tp_plan(2, fp8="rowwise")
    assert sp_gathers(tensorwise, "forward") == [(tokens * 4096 * 1, 64)]
    assert sp_gathers(rowwise, "forward") == [(tokens * 4096 * 2, 64)]
    # backward: the forward reduce-scatters' gradients in bf16 (64), the repeated gathers as the forward's (64)
    assert sp_gathers(tensorwise, "backward") == [(tokens * 4096 * 1, 64), (tokens * 4096 * 2, 64)]
    assert sp_gathers(rowwise, "backward") == [(tokens * 4096 * 2, 64), (tokens * 4096 * 2, 64)]


def test_selective_policies_repeat_the_tp_collectives_they_do_not_keep() -> None:
    """Llama 3.1 8B, 32 layers, one micro-batch: the per-layer policy recomputes every second layer whole, so
    backward repeats half the forward's 2 all-gathers and 2 reduce-scatters a layer (32 of each); the per-op
    policy without SP repeats the attention output's all-reduce (32), with SP the two gathered inputs (64)."""
    from meshplan.spec.conditions import Selective

    def counts(selective: Selective, sp: bool) -> dict[tuple[str, str, str], float]:
        work = Workload(
            seq_len=8192, global_batch=1, framework=Framework.TORCH, conditions=Conditions(selective=selective)
        )
        layout = Layout(tp=8, sp=sp, recompute=Recompute.SELECTIVE)
        plan = evaluate(LLAMA_8B, resolve_cluster(gpu="h100-sxm", gpus=8), layout, work)
        out: dict[tuple[str, str, str], float] = {}
        for c in plan.collectives:
            if c.strategy in ("tp", "sp") and float(c.size_bytes) == 8192 * 4096 * 2:  # the b s h buffer
                key = (c.strategy, str(c.op), c.phase)
                out[key] = out.get(key, 0.0) + float(c.count_per_step)
        return out

    core = counts(Selective.CORE_ATTENTION, True)
    layer = counts(Selective.LAYER, True)
    op_sp = counts(Selective.OP, True)
    op_tp, core_tp = counts(Selective.OP, False), counts(Selective.CORE_ATTENTION, False)
    gather, scatter = ("sp", "all_gather", "backward"), ("sp", "reduce_scatter", "backward")
    assert layer[gather] - core[gather] == 32 and layer[scatter] - core[scatter] == 32
    assert op_sp[gather] - core[gather] == 64 and op_sp[scatter] == core[scatter]
    reduce = ("tp", "all_reduce", "backward")
    assert op_tp[reduce] - core_tp[reduce] == 32
