"""A MoE layer's expert-side kernels as Megatron-Core runs them, each number derived by hand below: the token
permutation on the tokens a rank dispatches (s/t with sequence parallelism), the all-to-all dispatcher's sort by
local expert (token_dispatcher.py ``sort_chunks_by_idxs``), the experts' shapes under MoE parallel folding
(expert TP below TP) and their weight gradients' depth (the tokens each expert received)."""

from __future__ import annotations

from typing import Any

import pytest
from compute_setups import gpu_setup

from meshplan import io
from meshplan.core.time.compute import layer_time
from meshplan.core.time.flops import mlp_gemms
from meshplan.core.time.gemm import gemm_time

QWEN3 = io.load_model("qwen3-235b-a22b")  # 128 experts of 4096 -> 2 x 1536 -> 4096, top-8, hidden 4096
H, K, FE, E = 4096, 8, 1536, 128
TOKENS = 4096.0  # one micro-batch of one 4K sequence, the TP group's tokens


def _layer(*, tp: int, ep: int, etp: int | None = None, sorted_dispatch: bool = False):  # type: ignore[no-untyped-def]
    setup = gpu_setup(sorted_dispatch=sorted_dispatch)
    return setup, layer_time(
        QWEN3, setup=setup, tokens=TOKENS, seq_len=4096, tp=tp, sp=True, ep=ep, etp=etp, moe_layer=True
    )


def _dense_memory_s(tp: int) -> float:
    """The same layer's memory-bound work without the permutation: hidden-size passes (2 norms of 2, 2 residual
    adds of 3) over s/t, the gated activation (3 passes) over k fe / t, rotary (2 passes of q and k) over t."""
    q, kv = 64 * 128, 4 * 128
    per_token = 2 * ((2 * 2 + 2 * 3) * H / tp + 3 * K * FE / tp + 2 * (q + kv) / tp)
    return TOKENS * per_token


def test_permutation_runs_on_the_tokens_a_rank_dispatches() -> None:
    """With SP each of t ranks permutes its own s/t tokens: 4 k h bytes a token (dispatch and combine copies, read
    and write, 2 bytes each) over s/t, where the all-to-all sends k s h / t (core/comm/ep.py)."""
    for tp in (1, 2, 4):
        setup, lt = _layer(tp=tp, ep=8, etp=1)
        launch = 20 * setup.cal.kernel_overhead_s
        permute = TOKENS / tp * 4 * K * H * 2
        want = (_dense_memory_s(tp) + permute) / setup.hbm + launch
        assert lt.memory_s == pytest.approx(want, rel=1e-12)


def test_all_to_all_dispatch_sorts_by_local_expert() -> None:
    """The all-to-all dispatcher lands rows by source rank and sorts them by local expert where a rank holds more
    than one (and back before the combine): the received rows (k s h / t, times the expert-TP group that gathers
    them) read and written once more each way. One expert a rank, or DeepEP, sorts nothing."""
    tp = 2
    _, plain = _layer(tp=tp, ep=8, etp=1)
    setup, lt = _layer(tp=tp, ep=8, etp=1, sorted_dispatch=True)
    assert lt.memory_s - plain.memory_s == pytest.approx(TOKENS / tp * 4 * K * H * 2 / setup.hbm, rel=1e-9)
    _, gathered = _layer(tp=tp, ep=8, etp=2, sorted_dispatch=True)
    _, gathered_plain = _layer(tp=tp, ep=8, etp=2)
    assert gathered.memory_s - gathered_plain.memory_s == pytest.approx(
        2 * TOKENS / tp * 4 * K * H * 2 / setup.hbm, rel=1e-9
    )
    _, one_each = _layer(tp=tp, ep=E, etp=1, sorted_dispatch=True)
    _, one_each_plain = _layer(tp=tp, ep=E, etp=1)
    assert one_each.memory_s == pytest.approx(one_each_plain.memory_s, rel=1e-12)


def test_folded_experts_take_their_own_rows_at_full_width() -> None:
    """Expert TP 1 under TP 4 with SP: a rank's 16 experts see s k / (t 16) = 512 rows each at the expert's whole
    width (2 fe up, fe down); with expert TP = TP, s k / 16 = 2,048 rows at 1/t of it. Same FLOPs."""
    folded = {g.name: g for g in mlp_gemms(QWEN3, tokens=TOKENS, tp=4, ep=8, moe_layer=True, etp=1, sp=True)}
    split = {g.name: g for g in mlp_gemms(QWEN3, tokens=TOKENS, tp=4, ep=8, moe_layer=True, sp=True)}
    up, down = folded["expert_up"], folded["expert_down"]
    assert (up.m, up.n, up.k, up.count) == (512, 2 * FE, H, 16)
    assert (down.m, down.n, down.k) == (512, H, FE)
    assert (split["expert_up"].m, split["expert_up"].n) == (2048, 2 * FE / 4)
    for name in ("expert_up", "expert_down"):
        assert folded[name].flops == pytest.approx(split[name].flops, rel=1e-12)
    # no SP, or no folding: the rows every TP rank holds, as before
    plain = {g.name: g for g in mlp_gemms(QWEN3, tokens=TOKENS, tp=4, ep=8, moe_layer=True)}
    assert (plain["expert_up"].m, plain["expert_up"].n) == (2048, 2 * FE / 4)


def test_expert_weight_gradients_contract_over_the_expert_tokens() -> None:
    """An expert's weight gradient is its input's transpose times the output gradient: (k x m) @ (m x n), the
    depth m the rows it received. The layer's weight-gradient time is the forward GEMMs' with each expert GEMM
    replaced by that shape's time (512 rows: depth 512 instead of 4,096 or 1,536)."""
    setup, lt = _layer(tp=4, ep=8, etp=1)
    experts, kwargs = _expert_gemms(setup)
    shift = 0.0
    for g in experts:
        transposed = _weight_gradient(g)
        assert transposed.k == 512
        shift += gemm_time(transposed, **kwargs) - gemm_time(g, **kwargs)
    assert shift > 0  # the shallower contraction runs further from the plateau
    assert lt.weight_grad_s == pytest.approx(lt.gemm_s + shift, rel=1e-12)


def test_grouped_gemms_launch_one_gemm_per_local_expert_under_megatron() -> None:
    """Transformer Engine's grouped GEMM launches one cuBLAS GEMM per local expert from C++: each past the first
    costs the host 6 us (2 grouped calls forward, 4 backward), for the 16 experts a rank holds at EP 8 of 128:
    2 x 15 x 6 = 180 us forward on top of (20 + 4 + 16) x 30 us. A PyTorch-native stack's grouped matmul is one
    launch; under CUDA graphs the replay is all."""
    import numpy as np

    from meshplan.core.time.host import Launch, host_layer
    from meshplan.spec.workload import Framework, Kernels

    args: dict[str, object] = dict(kernels=Kernels.FUSED, launch=Launch.EAGER, tp=4, sp=True, moe_layer=True)
    one = host_layer(QWEN3, framework=Framework.MEGATRON, local_experts=1, **args)  # type: ignore[arg-type]
    assert one.forward_s == pytest.approx(40 * 30e-6)
    sixteen = host_layer(QWEN3, framework=Framework.MEGATRON, local_experts=16, **args)  # type: ignore[arg-type]
    assert sixteen.forward_s - one.forward_s == pytest.approx(2 * 15 * 6e-6)
    assert sixteen.backward_s - one.backward_s == pytest.approx(4 * 15 * 6e-6)
    torch_native = host_layer(QWEN3, framework=Framework.TORCH, local_experts=16, **args)  # type: ignore[arg-type]
    assert torch_native.forward_s == pytest.approx(one.forward_s)
    many = host_layer(QWEN3, framework=Framework.MEGATRON, local_experts=np.array([1.0, 16.0]), **args)  # type: ignore[arg-type]
    assert np.allclose(many.forward_s, [one.forward_s, sixteen.forward_s])


def test_expert_weight_gradients_fused_into_fp32_main_grads_read_and_write_them() -> None:
    """Megatron's --gradient-accumulation-fusion: the weight-gradient GEMM adds into the fp32 main gradient, so
    its output costs 4 bytes read and 4 written an element. An expert of 512 rows (TP 4 x EP 8, folded) then
    runs at HBM speed: up, 2 (4,096 x 512 + 512 x 3,072) + 8 (4,096 x 3,072) bytes, 16 of them; the zoo's
    stage wires it (stage_time: 2 x the gradient's bytes under Megatron with the fusion on)."""
    fused = gpu_setup(accumulate_bytes=8.0)
    lt = layer_time(QWEN3, setup=fused, tokens=TOKENS, seq_len=4096, tp=4, sp=True, ep=8, etp=1, moe_layer=True)
    plain_setup, plain = _layer(tp=4, ep=8, etp=1)
    experts, kwargs = _expert_gemms(fused)
    want = 0.0
    for g in experts:
        traffic = (2 * (g.k * g.m + g.m * g.n) + 8 * g.k * g.n) * g.count / fused.hbm
        want += max(gemm_time(_weight_gradient(g), **kwargs), traffic) - gemm_time(g, **kwargs)
    up = next(g for g in experts if g.name == "expert_up")
    up_traffic = (2 * (4096 * 512 + 512 * 3072) + 8 * 4096 * 3072) * 16 / fused.hbm
    assert up_traffic > gemm_time(type(up)(name="w", m=4096, n=3072, k=512, count=16), **kwargs)  # type: ignore[arg-type]
    assert lt.weight_grad_s == pytest.approx(lt.gemm_s + want, rel=1e-12)
    assert lt.weight_grad_s > plain.weight_grad_s and plain_setup.accumulate_bytes is None


def test_the_zoo_stage_accumulates_in_fp32_under_megatron() -> None:
    """The stage passes 2 x the gradient's bytes where Megatron fuses the accumulation (fp32 main gradients: 8),
    nothing where the run turns it off (its separate accumulation pass is outside the layer's GPU time)."""
    from meshplan.validation.training import _evaluate, sources

    data = sources()["megatron_moe_zoo"]
    case = {**data["defaults"], **data["case"][4]}  # TP 4 EP 8, no recompute
    assert "TP 4 EP 8 PP 8" in case["id"]
    on = _evaluate(case, case["layout"])
    off = _evaluate({**case, "grad_accum_fusion": "off"}, case["layout"])
    assert on.step.gpu_layer_s > off.step.gpu_layer_s


def _weight_gradient(g: Any) -> Any:
    """An expert GEMM's weight gradient: its input transposed times the output gradient, (k x m) @ (m x n)."""
    return type(g)(name=g.name, m=g.k, n=g.n, k=g.m, count=g.count)


def _expert_gemms(setup: Any) -> tuple[list[Any], dict[str, Any]]:
    """The expert GEMMs of a Qwen3 MoE layer at TP 4 x EP 8 (folded, SP), and ``gemm_time``'s other arguments."""
    gemms = mlp_gemms(QWEN3, tokens=TOKENS, tp=4, ep=8, moe_layer=True, etp=1, sp=True)
    kwargs = dict(peak_flops=setup.peak_flops, hbm_bytes_per_s=setup.hbm_bytes_per_s, cal=setup.cal, act_bytes=2.0)
    return [g for g in gemms if g.name.startswith("expert_")], kwargs
