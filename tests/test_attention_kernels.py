"""Fused attention from the published kernel tables, and what each recompute policy repeats."""

import dataclasses

import numpy as np
import pytest
from compute_setups import gpu_setup

from meshplan import io
from meshplan.core.time.attention_kernels import SEQ_POINTS, TABLES, attention_shares
from meshplan.core.time.compute import layer_time
from meshplan.core.time.stage_time import layer_kinds, selective_redo_s, stage_times
from meshplan.spec.cluster import AttentionKernel
from meshplan.spec.conditions import Conditions, Selective
from meshplan.spec.layout import Layout, Recompute, ZeroStage
from meshplan.spec.workload import Attention, Kernels, Workload

CATALOG_GPUS = (
    "a100-40gb",
    "a100-80gb",
    "b200",
    "gb200",
    "h100-pcie",
    "h100-sxm",
    "h100-sxm-96gb",
    "h200",
    "h800",
    "l40s",
    "mi300x",
    "mi325x",
)


@pytest.mark.parametrize("table", TABLES, ids=lambda t: f"{t.generation}-{t.kernel.value}-{t.forward_only}")
def test_every_published_point_comes_back(table) -> None:  # type: ignore[no-untyped-def]
    """At the published points the shares give back the published TFLOP/s (forward + backward counted as the
    kernels' benchmark counts it: 3.5 forward FLOPs over the two times)."""
    for (head_dim, causal), tflops in table.tflops.items():
        for seq, published in zip(SEQ_POINTS, tflops, strict=True):
            fwd, bwd = attention_shares(
                seq_len=seq, head_dim=head_dim, causal=causal, kernel=table.kernel, generation=table.generation
            )
            rate = fwd * table.peak_flops if table.forward_only else 3.5 / (1 / fwd + 2.5 / bwd) * table.peak_flops
            assert rate == pytest.approx(published * 1e12, rel=1e-9)


def test_arrays_and_scalars_agree_and_long_sequences_hold_the_plateau() -> None:
    seqs = np.array([300.0, 512, 3000, 16384, 65536, 262144])
    kw = dict(head_dim=128, causal=True, kernel=AttentionKernel.CUDNN, generation="hopper")
    fwd, bwd = attention_shares(seq_len=seqs, **kw)
    for i, s in enumerate(seqs):
        f, b = attention_shares(seq_len=float(s), **kw)
        assert (f, b) == pytest.approx((fwd[i], bwd[i]))
    assert fwd[0] == fwd[1] and fwd[3] == fwd[4] == fwd[5]
    assert np.all(np.diff(fwd) >= 0)  # causal: more work per block, higher share
    assert np.all(bwd < fwd)


def test_head_dims_between_the_tables_lie_between_them() -> None:
    kw = dict(seq_len=4096, causal=True, kernel=AttentionKernel.FA2, generation="ampere")
    lo, mid, hi = (attention_shares(head_dim=d, **kw)[0] for d in (64, 96, 128))
    assert lo < mid < hi


def test_kernel_generations_rank_as_published() -> None:
    """On H100 at 8K, head dim 128, causal: FlashAttention-3 > cuDNN > FlashAttention-2 (Shah et al. 2024)."""
    kw = dict(seq_len=8192, head_dim=128, causal=True, generation="hopper")
    fa1, fa2, fa3, cudnn = (
        attention_shares(kernel=k, **kw)[0]
        for k in (AttentionKernel.FA1, AttentionKernel.FA2, AttentionKernel.FA3, AttentionKernel.CUDNN)
    )
    assert fa3 > cudnn > fa2 > fa1


@pytest.mark.parametrize("generation", ["ampere", "hopper"])
def test_the_triton_kernel_runs_flashattention_2s_forward_and_flashattention_1s_backward(generation: str) -> None:
    """llm-foundry's attn_impl triton (flash-attn's flash_attn_triton.py): no table of its own; its forward is
    FlashAttention-2's loop order, its backward FlashAttention 1's algorithm; fwd + bwd lies between the two."""
    kw = dict(seq_len=np.array([512.0, 4096, 65536]), head_dim=128, causal=True, generation=generation)
    triton = attention_shares(kernel=AttentionKernel.FA_TRITON, **kw)
    fa1, fa2 = (attention_shares(kernel=k, **kw) for k in (AttentionKernel.FA1, AttentionKernel.FA2))
    assert np.array_equal(triton[0], fa2[0]) and np.array_equal(triton[1], fa1[1])

    def both(shares):  # type: ignore[no-untyped-def]
        return 3.5 / (1 / shares[0] + 2.5 / shares[1])

    assert np.all(both(fa1) < both(triton)) and np.all(both(triton) < both(fa2))


def test_a_kernel_without_tables_is_refused() -> None:
    with pytest.raises(ValueError, match="ampere/cudnn"):
        attention_shares(seq_len=4096, head_dim=128, causal=True, kernel=AttentionKernel.CUDNN, generation="ampere")


@pytest.mark.parametrize("gpu", CATALOG_GPUS)
def test_every_catalog_gpu_has_tables_for_its_kernels(gpu: str) -> None:
    cal = io.load_gpu(gpu).calibration
    for kernel in (AttentionKernel(cal.fused_attention_kernel), AttentionKernel.FA2):
        fwd, bwd = attention_shares(
            seq_len=8192, head_dim=128, causal=True, kernel=kernel, generation=cal.attention_generation
        )
        assert 0.2 < fwd * cal.attention_scale < 0.8 and 0 < bwd < fwd


def _layer(attention: Attention, kernels: Kernels, gpu: str = "h100-sxm", seq: int = 8192):  # type: ignore[no-untyped-def]
    setup = gpu_setup(gpu, kernels=kernels, attention=attention)
    model = io.load_model("llama-3.1-8b")
    return layer_time(model, setup=setup, tokens=seq, seq_len=seq, tp=1, sp=False, ep=1, moe_layer=False)


def test_flash_is_the_stacks_kernel() -> None:
    """Eager PyTorch runs SDPA's FlashAttention-2; Transformer Engine the kind's fused kernel (cuDNN on H100)."""
    assert _layer(Attention.FLASH, Kernels.EAGER).attention_s == _layer(Attention.FA2, Kernels.EAGER).attention_s
    assert _layer(Attention.FLASH, Kernels.FUSED).attention_s == _layer(Attention.CUDNN, Kernels.FUSED).attention_s
    assert _layer(Attention.CUDNN, Kernels.FUSED).attention_s < _layer(Attention.FA2, Kernels.FUSED).attention_s


def test_attention_time_follows_the_table_with_sequence() -> None:
    """Per FLOP, a 1K sequence's attention is slower than a 16K one's by the ratio of their published shares."""
    short, long = _layer(Attention.FA2, Kernels.EAGER, seq=1024), _layer(Attention.FA2, Kernels.EAGER, seq=16384)
    per_flop_ratio = (short.attention_s / 1024**2) / (long.attention_s / 16384**2)
    kw = dict(head_dim=128, causal=True, kernel=AttentionKernel.FA2, generation="hopper")
    assert per_flop_ratio == pytest.approx(
        attention_shares(seq_len=16384, **kw)[0] / attention_shares(seq_len=1024, **kw)[0]
    )


def test_each_selective_policy_repeats_what_it_recomputes() -> None:
    lt = _layer(Attention.FA2, Kernels.EAGER)
    assert selective_redo_s(lt, Selective.CORE_ATTENTION, ("core_attn",)) == lt.attention_core_fwd_s
    assert selective_redo_s(lt, Selective.OP, ()) == pytest.approx(lt.op_sac_gemm_s + lt.memory_s)
    # per-op: wk, wo and w3 of Llama 3 8B, 1,024 + 4,096 + 14,336 of the 2 x 4,096 + 2 x 1,024 + 3 x 14,336 columns
    recomputed = (1024 + 4096 + 14336) / (2 * 4096 + 2 * 1024 + 3 * 14336)
    assert lt.op_sac_gemm_s / lt.gemm_s == pytest.approx(recomputed, rel=0.02)
    assert selective_redo_s(lt, Selective.LAYER, ()) == pytest.approx(lt.forward_s / 2)
    core = selective_redo_s(lt, Selective.MODULES, ("core_attn",))
    assert core == lt.attention_core_fwd_s
    # Llama 3 8B: the MLP's three matmuls are 3 x 14,336 of the 2 x 4,096 + 2 x 1,024 + 3 x 14,336 columns
    assert lt.mlp_gemm_s / lt.gemm_s == pytest.approx(3 * 14336 / (2 * 4096 + 2 * 1024 + 3 * 14336), rel=0.02)
    assert selective_redo_s(lt, Selective.MODULES, ("core_attn", "mlp")) == pytest.approx(core + lt.mlp_gemm_s)


def test_megatron_recompute_modules_repeat_their_own_matmuls() -> None:
    """Megatron-Core's --recompute-modules on DeepSeek-V3 (MLA, MoE with a shared expert): mlp repeats a dense
    layer's MLP only (TransformerLayer sets recompute_mlp where the MLP is not a MoELayer), moe the whole MoE
    block, shared_experts the shared expert's two matmuls, mla_up_proj the query and key/value up-projections."""
    setup = gpu_setup()
    model = io.load_model("deepseek-v3")
    common = dict(setup=setup, tokens=4096, seq_len=4096, tp=2, sp=True, ep=64)
    dense = layer_time(model, moe_layer=False, **common)  # type: ignore[arg-type]
    moe = layer_time(model, moe_layer=True, **common)  # type: ignore[arg-type]
    mods = Selective.MODULES
    assert selective_redo_s(dense, mods, ("mlp",)) == pytest.approx(dense.mlp_gemm_s)
    assert selective_redo_s(moe, mods, ("mlp",), moe_layer=True) == 0.0
    assert selective_redo_s(moe, mods, ("moe",), moe_layer=True) == pytest.approx(moe.mlp_gemm_s)
    assert 0 < moe.shared_gemm_s < moe.mlp_gemm_s
    assert selective_redo_s(moe, mods, ("shared_experts",), moe_layer=True) == pytest.approx(moe.shared_gemm_s)
    # q_up (q_lora_rank 1,536 -> 128 heads x 192 / tp) and kv_up (kv_lora_rank 512 -> 128 x 256 / tp): their FLOPs
    # are 1,536 x 12,288 + 512 x 16,384 per token of the attention's matmuls
    up_flops = 2 * 4096 * (1536 * 128 * 192 + 512 * 128 * 256) / 2
    assert dense.mla_up_gemm_s > up_flops / (setup.peak_flops * setup.cal.matmul_efficiency_max)
    assert dense.mla_up_gemm_s < dense.gemm_s - dense.mlp_gemm_s
    up = selective_redo_s(dense, mods, ("mla_up_proj",))
    assert up == pytest.approx(dense.mla_up_gemm_s)
    assert selective_redo_s(dense, mods, ("mla_up_proj", "mlp")) == pytest.approx(up + dense.mlp_gemm_s)


def _stage(recompute: Recompute, conditions: Conditions):  # type: ignore[no-untyped-def]
    model = io.load_model("llama-2-13b")
    from meshplan.reports.inputs import resolve_cluster

    cluster = resolve_cluster(gpu="a100-80gb", gpus=8)
    lay = Layout(dp_shard=8, zero=ZeroStage.PARAMETERS, micro_batch=2, recompute=recompute)
    work = Workload(seq_len=4096, global_batch=16, conditions=conditions, kernels=Kernels.EAGER)
    return stage_times(model, lay, work, cluster, stages=(0,)), layer_kinds(model, lay, work, cluster)


def test_recompute_policies_order_and_block_method() -> None:
    none, _ = _stage(Recompute.NONE, Conditions())
    core, _ = _stage(Recompute.SELECTIVE, Conditions())
    op, _ = _stage(Recompute.SELECTIVE, Conditions(selective=Selective.OP))
    full, kinds = _stage(Recompute.FULL, Conditions())
    assert none.bwd_compute_s < core.bwd_compute_s < op.bwd_compute_s < full.bwd_compute_s
    assert full.bwd_compute_s - none.bwd_compute_s == pytest.approx(40 * kinds.dense.forward_s)
    ten, _ = _stage(Recompute.FULL, Conditions(recompute_layers=10))
    assert ten.bwd_compute_s - none.bwd_compute_s == pytest.approx(10 * kinds.dense.forward_s)
    every, _ = _stage(Recompute.FULL, dataclasses.replace(Conditions(), recompute_layers=400))
    assert every.bwd_compute_s == pytest.approx(full.bwd_compute_s)


# cuBLAS's m = n = k bf16 sweep on A100 (NVIDIA, "CUDA 11 Features Revealed", Fig. 6), read from the figure:
# TFLOP/s at 512, 768, 1,024, 1,280 and 8,192 (the plateau the shares are taken against)
A100_SQUARE_SWEEP = {512: 28, 768: 65, 1024: 88, 1280: 150, 8192: 290}


def test_small_gemms_leave_sms_idle_as_cublas_measures() -> None:
    """Under 2,048 a square GEMM has fewer 256 x 128 output tiles than A100's 108 SMs: its share of the plateau
    falls as the tiles do (within 0.06 of the sweep); training-sized GEMMs fill the GPU."""
    from meshplan.core.time.flops import Gemm
    from meshplan.core.time.gemm import fill_share

    plateau = A100_SQUARE_SWEEP[8192]
    for d, tflops in A100_SQUARE_SWEEP.items():
        share = fill_share(Gemm(name="square", m=d, n=d, k=d), sm_count=108)
        assert share == pytest.approx(tflops / plateau, abs=0.06), d
    # Korthikanti's 175B at TP 8, one 2,048-token micro-batch: QKV and the MLP's first GEMM
    assert fill_share(Gemm(name="qkv", m=2048, n=4608, k=12288), sm_count=108) == 1.0
    assert fill_share(Gemm(name="fc1", m=2048, n=6144, k=12288), sm_count=108) == 1.0
    # a thin GEMM with a deep K splits K to fill the SMs
    assert fill_share(Gemm(name="thin", m=1024, n=768, k=8192), sm_count=132) > 3 * 24 / 132 - 1e-9


def test_sliding_window_layers_reach_window_keys() -> None:
    """A causal sliding-window layer's query reaches min(i + 1, W) keys: averaged over s positions, W - W^2 / 2s
    against s / 2 for a full layer. At s = 65,536 and W = 16,384 both kernels walk blocks past the tables' last
    point, so the time of a model whose layers all slide is 0.4375 of the same model's with full layers; with
    half of them sliding, the mean of the two."""
    from meshplan.core.time.compute import _flash_time

    base = io.load_model("llama-3.1-8b")
    cal = io.load_gpu("h100-sxm").calibration
    s, w = 65_536, 16_384
    share = (w - w**2 / (2 * s)) / (s / 2)
    assert share == 0.4375

    def time(model):  # type: ignore[no-untyped-def]
        return _flash_time(
            model, tokens=s, seq_len=s, kernel_keys=s, tp=1, kernel=AttentionKernel.FA2, peak=989.4e12, cal=cal
        )

    full = time(base)
    every = time(dataclasses.replace(base, sliding_window=w, num_sliding_layers=base.num_layers))
    half = time(dataclasses.replace(base, sliding_window=w, num_sliding_layers=base.num_layers // 2))
    assert every == pytest.approx((share * full[0], share * full[1]), rel=1e-12)
    assert half == pytest.approx(((1 + share) / 2 * full[0], (1 + share) / 2 * full[1]), rel=1e-12)
    # a window as long as the sequence changes nothing
    assert time(dataclasses.replace(base, sliding_window=s, num_sliding_layers=32)) == pytest.approx(full, rel=1e-12)


def _plan(seq: int, micro_batch: int, doc_tokens: int | None = None):  # type: ignore[no-untyped-def]
    from meshplan.core.plan import evaluate
    from meshplan.reports.inputs import resolve_cluster

    work = Workload(
        seq_len=seq,
        global_batch=8 * 4 * micro_batch,
        conditions=Conditions(doc_tokens=doc_tokens),
    )
    layout = Layout(zero=ZeroStage.OPTIMIZER, dp_shard=8, micro_batch=micro_batch)
    return evaluate(io.load_model("llama-3.1-8b"), resolve_cluster(gpu="h100-sxm", gpus=8), layout, work)


def test_packed_documents_attend_as_sequences_of_their_length() -> None:
    """A 16,384-token sequence packed from 2,048-token documents whose attention stays inside each document does
    the attention of eight 2,048-token sequences: the same step, MFU and tokens a second as micro-batches of 8
    sequences of 2,048 (every matmul has the same tokens; attention the same keys a query)."""
    packed, short = _plan(16_384, 1, doc_tokens=2048), _plan(2048, 8)
    assert packed.step.compute_s == pytest.approx(short.step.compute_s, rel=1e-12)
    assert packed.step.mfu == pytest.approx(short.step.mfu, rel=1e-12)
    assert packed.step.tokens_per_s_per_gpu == pytest.approx(short.step.tokens_per_s_per_gpu, rel=1e-9)
    full = _plan(16_384, 1)
    assert packed.step.compute_s < 0.8 * full.step.compute_s  # attention was most of a 16K step's work
    # documents as long as the sequence change nothing
    assert _plan(16_384, 1, doc_tokens=65_536).step.compute_s == full.step.compute_s


def test_doc_tokens_is_checked() -> None:
    with pytest.raises(ValueError, match="doc_tokens must be >= 1"):
        Conditions(doc_tokens=0)
