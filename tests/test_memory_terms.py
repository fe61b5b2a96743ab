"""Memory terms of PyTorch-native stacks and fine-tuning, each re-derived here from shapes and the stacks' code:
ZeRO-1/2 under FSDP2 (SHARD_GRAD_OP), GPTQ int4 bases, ``--recompute-keep`` subsets, the edge of HBM."""

from __future__ import annotations

import itertools
import math

import pytest

from meshplan import io
from meshplan.core.memory.bill import stage_bill
from meshplan.core.memory.stage_activations import layer_activations
from meshplan.core.params import count_params
from meshplan.core.plan import evaluate
from meshplan.reports.inputs import resolve_cluster
from meshplan.spec.cluster import GpuCalibration
from meshplan.spec.conditions import RECOMPUTE_KEEP, Conditions, LossKind, Selective
from meshplan.spec.finetune import Finetune, FinetuneMode, QuantBase
from meshplan.spec.layout import Layout, Recompute, ZeroStage
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import PRECISIONS, Framework, Workload

L, H, A, K, D, FF, V = 4, 32, 8, 4, 4, 64, 50
TINY = ModelSpec(name="tiny", num_layers=L, hidden=H, num_heads=A, num_kv_heads=K, head_dim=D, ffn_hidden=FF,
                 vocab_size=V)  # fmt: skip
# (rows, elements per row) of every parameter: embedding, per layer attention_norm, wq, wk, wv, wo, ffn_norm, w1, w2,
# w3, then the final norm and the output projection (torchtitan's Llama order)
LAYER = [(H, 1), (A * D, H), (K * D, H), (K * D, H), (H, A * D), (H, 1), (FF, H), (H, FF), (FF, H)]
ROOT = [(V, H), (H, 1), (V, H)]
TENSORS = ROOT + LAYER * L
P = sum(r * c for r, c in TENSORS)
NONE = GpuCalibration(framework_bytes=0.0, fragmentation=0.0)


def _torch_bill(zero: int, n: int) -> dict[str, float]:
    work = Workload(seq_len=16, global_batch=n, precision=PRECISIONS["fsdp2-bf16"], framework=Framework.TORCH)
    lay = Layout(dp_shard=n, zero=ZeroStage(zero)) if zero else Layout(dp_replicate=n)
    return stage_bill(TINY, count_params(TINY), lay, work, calibration=NONE, stage=0).as_dict()


def _padded(n: int) -> int:
    """Elements of rank 0's FSDP2 storage: every tensor's dim 0 padded to ceil(rows / n) rows."""
    return sum(math.ceil(r / n) * c for r, c in TENSORS)


def test_zero2_under_fsdp2_shards_gradients_and_moments() -> None:
    n = 4
    z2, z0 = _torch_bill(2, n), _torch_bill(0, n)
    # fp32 shards (MixedPrecisionPolicy(param_dtype=bf16) over fp32 parameters): weights, gradients, 2 moments
    assert z2["weights_bytes"] == pytest.approx(4 * _padded(n))
    assert z2["gradients_bytes"] == pytest.approx(4 * _padded(n))
    owned = sum(max(0, min(math.ceil(r / n), r)) * c for r, c in TENSORS)  # rank 0 owns a full chunk of each
    steps = 4 * len(TENSORS)  # torch.optim's 0-dim fp32 step per parameter
    assert z2["optimizer_moments_bytes"] == pytest.approx(8 * owned + steps)
    # DDP (ZeRO-0) holds everything whole
    assert z0["gradients_bytes"] == pytest.approx(4 * P)
    assert z0["optimizer_moments_bytes"] == pytest.approx(8 * P + steps)
    # SHARD_GRAD_OP keeps every unit gathered from forward to backward: the whole stage in bf16 at least
    assert z2["comm_buffers_bytes"] >= 2 * P


def test_zero1_under_torch_shards_the_optimizer_alone() -> None:
    n = 4
    z1, z0 = _torch_bill(1, n), _torch_bill(0, n)
    assert z1["weights_bytes"] == z0["weights_bytes"]
    assert z1["gradients_bytes"] == pytest.approx(4 * P)
    assert z1["optimizer_moments_bytes"] == pytest.approx((8 * P + 4 * len(TENSORS)) / n)


# ---- GPTQ int4 under Q-LoRA --------------------------------------------------------------------------------------


def test_gptq_int4_bytes_per_parameter() -> None:
    from meshplan.core.finetune import base_bytes_per_param, gptq_bytes_per_param

    # AutoGPTQ's QuantLinear: qweight int32 [in/8, out], scales fp16 [in/g, out], qzeros int32 [in/g, out/8]
    d_in, d_out, g = 4096, 11008, 128
    stored = (d_in // 8 * d_out) * 4 + (d_in // g * d_out) * 2 + (d_in // g * d_out // 8) * 4
    assert gptq_bytes_per_param(group_size=g) == pytest.approx(stored / (d_in * d_out))
    assert gptq_bytes_per_param(group_size=g) == pytest.approx(0.51953125)
    assert gptq_bytes_per_param(group_size=32) > gptq_bytes_per_param(group_size=128)
    nf4 = Finetune(mode=FinetuneMode.QLORA)
    gptq = Finetune(mode=FinetuneMode.QLORA, base_quant=QuantBase.GPTQ_INT4, quant_group_size=64)
    assert base_bytes_per_param(nf4) == pytest.approx((4 + 8 / 64 + 32 / (64 * 256)) / 8)
    assert base_bytes_per_param(gptq) == pytest.approx((4 + 20 / 64) / 8)


def test_gptq_base_bills_its_matmul_weights_at_its_bytes() -> None:
    def weights(ft: Finetune) -> float:
        work = Workload(seq_len=16, global_batch=1, finetune=ft)
        return float(stage_bill(TINY, count_params(TINY), Layout(), work, calibration=NONE, stage=0).weights_bytes)

    matmuls = L * (A * D * H + 2 * K * D * H + H * A * D + 3 * FF * H)  # every layer's projections, quantized
    nf4 = Finetune(mode=FinetuneMode.QLORA)
    gptq = Finetune(mode=FinetuneMode.QLORA, base_quant=QuantBase.GPTQ_INT4)
    b_nf4 = (4 + 8 / 64 + 32 / (64 * 256)) / 8
    assert weights(gptq) - weights(nf4) == pytest.approx(matmuls * ((4 + 20 / 128) / 8 - b_nf4))


def test_gptq_is_refused_outside_qlora() -> None:
    with pytest.raises(ValueError, match="qlora only"):
        Finetune(mode=FinetuneMode.LORA, base_quant=QuantBase.GPTQ_INT4)


# ---- --recompute-keep ------------------------------------------------------------------------------------------

CHAIN = ((), ("q",), ("q", "k", "v"), ("q", "k", "v", "attn"), ("q", "k", "v", "attn", "act"), RECOMPUTE_KEEP)


def _keep_work(keep: tuple[str, ...], seq: int = 16) -> Workload:
    cond = Conditions(selective=Selective.KEEP, recompute_keep=keep) if keep else Conditions()
    return Workload(seq_len=seq, global_batch=1, conditions=cond)


def test_recompute_keep_bills_the_layer_input_and_the_named_tensors() -> None:
    seq, beta = 16, 2  # bf16
    lay = Layout(recompute=Recompute.SELECTIVE)
    la = layer_activations(TINY, lay, _keep_work(("q", "k", "v"), seq))
    # the layer input h, Q (a d), K and V (k d each)
    assert float(la.dense) == pytest.approx(seq * beta * (H + A * D + 2 * K * D))
    la = layer_activations(TINY, lay, _keep_work(("attn", "act"), seq))
    # the attention output (a d) and its fp32 log-sum-exp per head, and the down projection's input (f)
    assert float(la.dense) == pytest.approx(seq * (beta * (H + A * D + FF) + 4 * A))


def test_recompute_keep_subsets_are_monotone() -> None:
    model = io.load_model("llama-3.1-8b")
    cluster = resolve_cluster(gpu="h100-sxm", gpus=8)
    lay = Layout(tp=8, sp=True, recompute=Recompute.SELECTIVE)
    acts, steps = [], []
    for keep in CHAIN[1:]:
        plan = evaluate(model, cluster, lay, _keep_work(keep, 8192))
        acts.append(plan.memory.per_gpu.activations_bytes)
        steps.append(plan.step.step_time_s)
    assert all(a < b for a, b in itertools.pairwise(acts))  # keeping more keeps more
    assert all(a >= b for a, b in itertools.pairwise(steps))  # and recomputes less
    none = evaluate(model, cluster, Layout(tp=8, sp=True), _keep_work((), 8192))
    assert acts[-1] <= none.memory.per_gpu.activations_bytes  # never more than keeping everything


# ---- the edge of HBM ---------------------------------------------------------------------------------------------


def test_pressure_is_the_share_of_hbm_and_widens_the_band_past_ninety_percent() -> None:
    from meshplan.core.memory.pressure import PRESSURE_BAND_P90, PRESSURE_SHARE
    from meshplan.reports.estimate import estimate_report, uncertainty
    from meshplan.reports.inputs import LayoutRequest

    assert (PRESSURE_SHARE, PRESSURE_BAND_P90) == (0.90, 1.25)
    kw = dict(gpu="h100-sxm", gpus=8, seq=8192, global_batch=8)
    tight = estimate_report("llama-3.1-8b", layout=LayoutRequest(cp=2, dp_shard=4, zero=1), **kw)
    roomy = estimate_report("llama-3.1-8b", layout=LayoutRequest(cp=2, dp_shard=4, zero=3), **kw)
    for out in (tight, roomy):
        assert out["hbm_pressure"] == pytest.approx(out["per_gpu"]["total_bytes"] / out["hbm_bytes_per_gpu"])
    assert 0.90 < tight["hbm_pressure"] <= 1 and roomy["hbm_pressure"] < 0.9
    plain = uncertainty(tight["step_time_s"], None, cp=2, gpu="h100-sxm")
    assert tight["step_time_s_p90"] == pytest.approx(1.25 * plain["step_time_s_p90"])
    assert tight["step_time_s_p10"] == pytest.approx(plain["step_time_s_p10"])  # only the slow side moves
    assert [w for w in tight["warnings"] if "cudaMalloc retries" in w]
    plain = uncertainty(roomy["step_time_s"], None, cp=2, gpu="h100-sxm")
    assert roomy["step_time_s_p90"] == pytest.approx(plain["step_time_s_p90"])
    assert not [w for w in roomy["warnings"] if "cudaMalloc retries" in w]


def test_the_planner_never_ranks_a_layout_near_capacity_first_without_saying_so() -> None:
    from meshplan.reports.plan import plan_report

    kw = dict(gpu="h100-sxm", gpus=8, seq=8192, global_batch_tokens=1 << 20, top=3)
    tight = plan_report("llama-3.1-8b", headroom=0.0, **kw)
    for p in tight["plans"]:
        assert p["near_capacity"] == (0.90 < p["hbm_pressure"] <= 1)
    assert tight["plans"][0]["near_capacity"]
    assert [w for w in tight["warnings"] if w.startswith("plan 1:") and "cudaMalloc retries" in w]
    default = plan_report("llama-3.1-8b", **kw)  # the default headroom keeps 10% free: none is flagged
    assert not any(p["near_capacity"] for p in default["plans"])
    assert not [w for w in default["warnings"] if "cudaMalloc" in w]


def test_a_bf16_cross_entropy_keeps_eight_bytes_a_logit() -> None:
    """F.cross_entropy on bf16 logits: the logits the caller holds, the saved log-probabilities and, in backward,
    nll_loss's gradient of them and log_softmax's gradient of the logits, 2 bytes each (no fp32 copy)."""
    from meshplan.core.memory.stage_activations import loss_peak_bytes

    model = io.load_model("llama-3.1-8b")
    tokens = 4 * 4096

    def peak(loss: LossKind) -> float:
        work = Workload(seq_len=4096, global_batch=4, framework=Framework.TORCH, conditions=Conditions(loss=loss))
        return float(loss_peak_bytes(model, tokens=tokens, tp=1, workload=work))

    assert peak(LossKind.BF16) == pytest.approx((2 + 2 + 2 + 2) * tokens * 128256)
    assert peak(LossKind.COMPILED) < peak(LossKind.BF16) < peak(LossKind.UPCAST)
