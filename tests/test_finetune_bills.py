"""Fine-tuning bills: each term re-derived from the model's shapes, what frozen parts save, what fits, and the
commands that carry the flags."""

from __future__ import annotations

import json

import pytest

from meshplan import io
from meshplan.cli import main
from meshplan.core.params import count_params
from meshplan.core.time.flops import model_flops_per_token
from meshplan.reports import fit_report, memory_report
from meshplan.reports.estimate import estimate_report
from meshplan.reports.inputs import FinetuneRequest, LayoutRequest
from meshplan.reports.plan import plan_report
from meshplan.spec.finetune import Finetune, FinetuneMode

N_8B = 8_030_261_248
LORA_8B = 41_943_040  # rank 16 on every linear layer (tests/test_finetune_counts.py derives it)
H, V, L = 4096, 128_256, 32
NF4 = (4 + 8 / 64 + 32 / (64 * 256)) / 8  # QLoRA Sec. 3: 4-bit codes, 8-bit block scales, fp32 per 256 blocks


def bill(model: str = "llama-3.1-8b", *, gpus: int = 1, mode: str = "lora", **kw: object) -> dict:
    layout = LayoutRequest(**{k: kw.pop(k) for k in list(kw) if k in LayoutRequest.__dataclass_fields__})
    finetune = FinetuneRequest(mode=mode, **{k: kw.pop(k) for k in list(kw) if k in ("lora_rank", "freeze")})
    return memory_report(model, gpu=kw.pop("gpu", "h100-sxm"), gpus=gpus, layout=layout, finetune=finetune, **kw)


def test_lora_state_terms_by_hand() -> None:
    """Frozen bf16 base, bf16 adapters; gradients (fp32: megatron-core's main grads), fp32 master copy and two fp32
    moments for the adapters only."""
    per = bill(seq=2048)["per_gpu"]
    assert per["weights_bytes"] == 2 * N_8B
    assert per["adapter_weights_bytes"] == 2 * LORA_8B
    assert per["gradients_bytes"] == 4 * LORA_8B
    assert bill(seq=2048, precision="bf16")["per_gpu"]["gradients_bytes"] == 2 * LORA_8B
    assert per["master_weights_bytes"] == 4 * LORA_8B
    assert per["optimizer_moments_bytes"] == 8 * LORA_8B
    assert per["dequant_workspace_bytes"] == 0


def test_qlora_base_in_nf4_and_its_dequantization_workspace() -> None:
    out = bill(mode="qlora", seq=2048)
    per = out["per_gpu"]
    # NF4 holds the matmul weights; embeddings, output head and norms stay bf16
    norms = (2 * L + 1) * H
    matmul = N_8B - 2 * V * H - norms
    assert per["weights_bytes"] == pytest.approx(matmul * NF4 + (2 * V * H + norms) * 2, rel=1e-12)
    # one bf16 copy of the largest matrix of a layer (the 4096 x 14336 MLP projections)
    assert per["dequant_workspace_bytes"] == 2 * H * 14336
    assert per["adapter_weights_bytes"] == 2 * LORA_8B
    assert out["trainable_params"] == LORA_8B and out["lora_rank"] == 16


def test_fsdp_shards_the_frozen_base_and_the_adapters() -> None:
    one, eight = bill(mode="qlora", seq=2048)["per_gpu"], bill(mode="qlora", gpus=8, zero=3, seq=2048)["per_gpu"]
    for term in ("weights_bytes", "adapter_weights_bytes", "gradients_bytes", "optimizer_moments_bytes"):
        assert eight[term] == pytest.approx(one[term] / 8)
    assert eight["activations_bytes"] == one["activations_bytes"]  # a data-parallel rank keeps its own batch


def test_frozen_base_activations() -> None:
    """Megatron accounting: under full recompute a layer keeps its input either way, so LoRA differs from full
    training only at the frozen output head, whose input (sbh) is no longer kept for a weight gradient."""
    s, b, beta = 4096, 1, 2
    full = bill(mode="full", seq=s, recompute="full")["per_gpu"]["activations_bytes"]
    lora = bill(seq=s, recompute="full")["per_gpu"]["activations_bytes"]
    assert full - lora == pytest.approx(s * b * beta * H)
    # without recompute the frozen projections drop the inputs only their weight gradients needed (none here:
    # every projection has an adapter) and each adapter keeps its r-wide A x: 7 adapters x r per token
    full_none = bill(mode="full", seq=s)["per_gpu"]["activations_bytes"]
    lora_none = bill(seq=s)["per_gpu"]["activations_bytes"]
    adapters = L * s * b * beta * 7 * 16
    first_norm = s * b * beta * H  # behind the frozen embedding, layer 0's first norm keeps nothing
    assert lora_none - full_none == pytest.approx(adapters - s * b * beta * H - first_norm)


def test_lora_on_q_and_v_drops_the_mlp_inputs() -> None:
    """No gate, up or down adapter: the MLP input (h) and the down projection's input (f) go per layer."""
    s, beta = 2048, 2
    every = bill(seq=s)["per_gpu"]["activations_bytes"]
    qv = memory_report(
        "llama-3.1-8b",
        gpu="h100-sxm",
        gpus=1,
        layout=LayoutRequest(),
        seq=s,
        finetune=FinetuneRequest(mode="lora", lora_targets="q,v"),
    )["per_gpu"]["activations_bytes"]
    dropped = L * s * beta * (H + 14336 + 5 * 16)  # MLP input, down input, five fewer r-wide adapter inputs
    assert every - qv == pytest.approx(dropped)


def test_frozen_prefix_keeps_nothing_and_trains_nothing() -> None:
    s, beta = 4096, 2
    full = bill(mode="full", seq=s)
    frozen = bill(mode="full", seq=s, freeze="embeddings,layers=8")
    layer = 218_112_000  # llama-3.1-8b layer parameters
    trainable = N_8B - V * H - 8 * layer
    assert frozen["trainable_params"] == trainable and frozen["frozen"] == {"embeddings": True, "layers": 8}
    assert frozen["per_gpu"]["gradients_bytes"] == 4 * trainable  # fp32 main grads
    assert frozen["per_gpu"]["weights_bytes"] == full["per_gpu"]["weights_bytes"]
    # 8 of 32 layers keep nothing; the output head (tied to nothing, frozen with the embeddings) drops its input
    head = 2 * s * beta * H  # Korthikanti's 2sbh: final norm input and head input
    layers = full["per_gpu"]["activations_bytes"] - head
    assert frozen["per_gpu"]["activations_bytes"] == pytest.approx(layers * 24 / 32 + head / 2)


def test_qlora_paper_65b_on_one_48gb_gpu() -> None:
    """QLoRA (arXiv:2305.14314): a 65B model fine-tunes on a single 48 GB GPU (rank 64 on every linear layer,
    gradient checkpointing); in bf16 the frozen base alone is 130 GB. PEFT's adapters and their gradients are bf16
    (--precision bf16): fp32 gradients, megatron-core's, would take 1.6 GB more and not fit."""
    kw = dict(gpu="l40s", seq=512, recompute="full", lora_rank=64, precision="bf16")
    q = bill("llama-65b", mode="qlora", **kw)
    lora = bill("llama-65b", mode="lora", **kw)
    assert q["hbm_bytes_per_gpu"] == 46_068 * 2**20  # the driver total of a 48 GB L40S
    assert q["fits"] and not lora["fits"]
    floor = 65_285_660_672 * NF4  # the 4-bit base alone
    assert floor < q["per_gpu"]["total_bytes"] < 48e9
    assert lora["per_gpu"]["weights_bytes"] == pytest.approx(2 * 65_285_660_672)


def test_fit_answers_are_the_largest_that_fit() -> None:
    out = fit_report("llama-3.1-8b", gpu="h100-sxm", gpus=2, finetune=FinetuneRequest(mode="lora"), seq=4096)
    assert out["trainable_params"] == LORA_8B and out["layout"] == {"dp_shard": 2, "zero": 3}
    assert out["max_micro_batch_with_recompute"] >= out["max_micro_batch"] >= 1
    assert out["max_seq_len_with_recompute"] > out["max_seq_len"] > 4096

    def fits(mb: int, seq: int, recompute: str) -> bool:
        """Within 90% of HBM: fit keeps the planner's 10% headroom by default."""
        b = bill(gpus=2, zero=3, micro_batch=mb, seq=seq, recompute=recompute, global_batch=2 * mb)
        return bool(b["per_gpu"]["total_bytes"] <= 0.9 * b["hbm_bytes_per_gpu"])

    for suffix, recompute in (("", "none"), ("_with_recompute", "full")):
        mb, s = out[f"max_micro_batch{suffix}"], out[f"max_seq_len{suffix}"]
        assert fits(mb, 4096, recompute) and not fits(mb + 1, 4096, recompute)
        assert fits(1, s, recompute) and not fits(1, s + 1, recompute)


def test_lora_step_does_less_work() -> None:
    """A frozen matmul computes its forward and its input gradient (4 flops per parameter per token), an
    adapter all three (6); the step is faster on the same layout."""
    m = io.load_model("llama-3.1-8b")
    full = model_flops_per_token(m, seq_len=4096)
    lora = model_flops_per_token(m, seq_len=4096, finetune=Finetune(mode=FinetuneMode.LORA))
    attention = 6 * L * 32 * 2 * 128 * 4096 / 2  # causal: a query reaches half the keys on average
    matmul = count_params(m).total - V * H - (2 * L + 1) * H  # the input embedding is a lookup, not a matmul
    assert full == pytest.approx(6 * matmul + attention)
    assert lora == pytest.approx(4 * matmul + attention + 6 * LORA_8B)
    kw = dict(gpu="h100-sxm", gpus=8, layout=LayoutRequest(zero=3), seq=4096)
    t_full = estimate_report("llama-3.1-8b", **kw)
    every = estimate_report("llama-3.1-8b", finetune=FinetuneRequest(mode="lora"), **kw)
    qv = estimate_report("llama-3.1-8b", finetune=FinetuneRequest(mode="lora", lora_targets="q,v"), **kw)
    assert qv["step_time_s"] < every["step_time_s"] < t_full["step_time_s"]  # unfused adapters move activations
    assert every["trainable_params"] == LORA_8B
    # full recompute repeats the forward: 1/3 more than full training's work, about 1/2 more than LoRA's
    redo = estimate_report("llama-3.1-8b", finetune=FinetuneRequest(mode="lora"), **(kw | {"layout": LayoutRequest(
        zero=3, recompute="full")}))  # fmt: skip
    assert redo["hfu"] / redo["mfu"] == pytest.approx(1 + full / 3 / lora)


def test_lora_paper_speedup_on_gpt3() -> None:
    """LoRA (arXiv:2106.09685) Sec. 4.2: rank 4 on W_q and W_v trains GPT-3 175B about 25% faster than full
    fine-tuning, since most weight gradients are never computed. Held at 5 points on the compute time of a
    Megatron layout on A100s (the paper does not state its layout)."""
    kw = dict(gpu="a100-80gb", gpus=128, layout=LayoutRequest(tp=8, pp=8, sp=True), seq=2048, global_batch=64)
    full = estimate_report("gpt3-175b", **kw)
    lora = estimate_report("gpt3-175b", finetune=FinetuneRequest(mode="lora", lora_rank=4, lora_targets="q,v"), **kw)
    saved = 1 - lora["breakdown"]["compute_s"] / full["breakdown"]["compute_s"]
    assert saved == pytest.approx(0.25, abs=0.05)


def test_planner_searches_fine_tuning_layouts() -> None:
    out = plan_report(
        "llama-3.1-70b",
        gpu="h100-sxm",
        gpus=8,
        seq=4096,
        global_batch_tokens=32 * 4096,
        finetune=FinetuneRequest(mode="qlora"),
    )
    assert out["finetune"] == "qlora" and out["plans"]
    assert all(p["layout"]["tp"] == 1 for p in out["plans"])  # the 4-bit base is never split by TP
    assert "QLoRA's 4-bit base cannot be split by TP" in out["rejections"]
    full = plan_report("llama-3.1-70b", gpu="h100-sxm", gpus=8, seq=4096, global_batch_tokens=32 * 4096)
    assert not full["plans"] or out["plans"][0]["step_time_s"] < full["plans"][0]["step_time_s"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict | str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if "--json" in argv and code == 0 else err)


def test_cli_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "params", "llama-3.1-8b", "--finetune", "lora", "--lora-rank", "16", "--json")
    assert code == 0 and isinstance(out, dict) and out["trainable_params"] == LORA_8B
    code, out = run(capsys, "memory", "llama-3.1-8b", "--gpu", "a100-40gb", "--gpus", "1", "--finetune", "qlora",
                    "--json")  # fmt: skip
    assert code == 0 and isinstance(out, dict)
    assert {"adapter_weights_bytes", "dequant_workspace_bytes"} <= set(out["per_gpu"])
    code, out = run(capsys, "fit", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "1", "--finetune", "lora",
                    "--seq", "8192", "--json")  # fmt: skip
    assert code == 0 and isinstance(out, dict) and {"max_micro_batch", "max_seq_len"} <= set(out)


def test_cli_text_says_what_trains(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "1", "--finetune", "lora"]) == 0
    assert "fine-tuning: lora rank 16 on q,k,v,o,gate,up,down; 41,943,040 trainable" in capsys.readouterr().out
    assert main(["fit", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "1", "--finetune", "lora"]) == 0
    assert "longest sequence at micro-batch 1" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--finetune", "qlora", "--tp", "2"], "tensor parallelism cannot split"),
        (["--finetune", "lora", "--lora-rank", "0"], "--lora-rank: 0 is outside [1, 65536]"),
        (["--finetune", "lora", "--lora-rank", "4096"], "not below the q projection's smaller side"),
        (["--finetune", "lora", "--freeze", "layers=2"], "already freezes the whole base"),
        (["--finetune", "lora", "--lora-targets", "q,wq"], "unknown LoRA target 'wq'"),
        (["--finetune", "full", "--freeze", "layers=99"], "freeze_layers=99 exceeds"),
        (["--finetune", "full", "--freeze", "heads"], "unknown frozen part 'heads'"),
        (["--finetune", "dora"], "'dora' is not one of full, lora, qlora"),
        (["--lora-rank", "8"], "apply to the lora and qlora modes only"),
        (["--finetune", "full", "--lora-targets", "q,v"], "apply to the lora and qlora modes only"),
    ],
)
def test_bad_combinations_one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str) -> None:
    code, err = run(capsys, "memory", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "2", *argv)
    assert code == 2 and isinstance(err, str)
    assert fragment in err and err.count("\n") == 1 and "Traceback" not in err


def test_fit_verdict_follows_the_mode_and_says_what_would_fit() -> None:
    """QLoRA keeps the base in NF4: 70B's weights fit one 80 GB GPU (39.5 GB), where bf16 (141 GB) does not; a
    full fine-tune of 70B at 8K fits no single GPU, and the answer says how many would (a layout of the planner's
    fits there) and which variant does."""
    from meshplan.reports.bills import fit_report

    qlora = fit_report("llama-3.1-70b", gpu="h100-sxm", gpus=1, finetune=FinetuneRequest(mode="qlora"), seq=2048)
    assert qlora["dtype"] == "nf4" and qlora["fits"] is True
    nf4 = 4.127 / 8  # QLoRA Sec. 3: 4-bit weights, 8-bit scales per 64, fp32 scales per 256 x 64
    edges = 2 * 128256 * 8192  # the embedding and the output head stay bf16
    assert qlora["weights_bytes_total"] == pytest.approx((70.55e9 - edges) * nf4 + edges * 2, rel=0.01)
    full = fit_report("llama-3.1-70b", gpu="h100-sxm", gpus=1, finetune=FinetuneRequest(mode="full"), seq=8192)
    assert full["max_micro_batch_with_recompute"] == 0
    fewest = full["nothing_fits"]["fewest_gpus_that_fit"]
    assert fewest is not None and fewest > 1
    assert fewest == full["min_gpus_for_training"]  # one answer: the planner's, whatever the layout
    again = fit_report("llama-3.1-70b", gpu="h100-sxm", gpus=fewest, finetune=FinetuneRequest(mode="full"), seq=8192)
    assert again["training_fits"] is True and again["min_gpus_for_training"] == fewest
    assert "--finetune qlora" in full["nothing_fits"]["variants"]


def test_fit_bills_the_kernels_it_is_told(capsys: pytest.CaptureFixture[str]) -> None:
    """`fit --kernels eager` bills eager PyTorch's unfused activations: the longest LoRA sequence that fits on one
    H100 is shorter than under fused kernels, and equals the memory bill's own verdict at that length."""
    args = ["fit", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "1", "--finetune", "lora", "--seq", "8192", "--json"]
    got = {}
    for kernels in ("fused", "eager"):
        assert main([*args, "--kernels", kernels]) in (0, None)
        got[kernels] = json.loads(capsys.readouterr().out)
    assert got["eager"]["max_seq_len"] < got["fused"]["max_seq_len"]
    longest = got["eager"]["max_seq_len"]
    ft = FinetuneRequest(mode="lora")
    for seq, fits in ((longest, True), (longest + 1, False)):
        bill = memory_report(
            "llama-3.1-8b",
            gpu="h100-sxm",
            gpus=1,
            layout=LayoutRequest(),
            seq=seq,
            global_batch=1,
            kernels="eager",
            finetune=ft,
        )
        assert (bill["per_gpu"]["total_bytes"] <= 0.9 * bill["hbm_bytes_per_gpu"]) is fits


def test_an_adapters_passes_move_what_they_read_and_write() -> None:
    """One rank-R adapter on q (4,096 -> 4,096) of Llama 3.1 8B, 8,192 tokens, bf16, by hand: forward reads x,
    writes and reads A x, writes B A x and adds it to the output (d_in + 3 d_out + 2R elements a token); backward
    computes dB and dA (d_out + R, then R + d_in) and the input gradient (dy B: d_out + R; d(A x) A: R + d_in; its
    sum with the base's dx: 3 d_in), at the kind's HBM speed. A frozen layer without adapters is the baseline."""
    from compute_setups import gpu_setup

    from meshplan.core.time.compute import layer_time

    m = io.load_model("llama-3.1-8b")
    setup = gpu_setup("h100-sxm")
    tokens, rank, d = 8192, 16, m.hidden
    common = dict(setup=setup, tokens=tokens, seq_len=tokens, tp=1, sp=False, ep=1, moe_layer=False)
    frozen = layer_time(m, frozen=True, **common)  # type: ignore[arg-type]
    lora = layer_time(m, finetune=Finetune(mode=FinetuneMode.LORA, lora_rank=rank, lora_targets=("q",)), **common)  # type: ignore[arg-type]
    per_byte = tokens * 2.0 / setup.hbm
    assert lora.forward_s - frozen.forward_s == pytest.approx((d + 3 * d + 2 * rank) * per_byte, rel=1e-9)
    assert lora.weight_grad_s == pytest.approx((d + d + 2 * rank) * per_byte, rel=1e-9)
    backward = (d + rank) + (rank + d) + (d + rank) + (rank + d) + 3 * d
    assert lora.backward_s - frozen.backward_s == pytest.approx(backward * per_byte, rel=1e-9)


def test_nemo_2407_70b_sft_fits_as_its_launcher_ran_it(capsys: pytest.CaptureFixture[str]) -> None:
    """NeMo 24.07 fine-tuned Llama 2 70B on 16 H100s at TP 4 PP 4 with no data parallelism (its performance
    summary), so nothing shards the optimizer: it fits 80 GB only with the launcher's bf16 Adam state, moments and
    master copy (NeMo-Framework-Launcher 24.07, conf/peft/llama/sft.yaml optim.dtype bf16;
    examples/peft/llama/h100/70b_2node.sh: 20 virtual stages, FP8 parameters). Stage 0 holds 20 layers and the
    embedding, a quarter of each matmul weight a GPU."""
    argv = ["memory", "llama-2-70b", "--json", "--gpu", "h100-sxm", "--gpus", "16", "--tp", "4", "--pp", "4"]
    argv += ["--vpp", "20", "--sp", "--stack", "nemo", "--precision", "fp8", "--seq", "4096", "--global-batch", "32"]
    argv += ["--micro-batch", "1", "--zero", "1", "--fp8-all-gather", "on"]
    h, kv, ffn, vocab = 8192, 1024, 28672, 32000
    matmuls = 2 * h * h + 2 * h * kv + 3 * h * ffn
    params = 20 * (matmuls // 4 + 2 * h) + vocab * h // 4  # norms whole on every TP rank
    bills = {}
    for dtype in ("fp32", "bf16"):
        assert main([*argv, "--moment-dtype", dtype, "--master-dtype", dtype]) == 0
        bills[dtype] = json.loads(capsys.readouterr().out)
    launcher, fp32_adam = bills["bf16"], bills["fp32"]
    assert launcher["per_gpu"]["weights_bytes"] == 2 * params
    assert launcher["per_gpu"]["master_weights_bytes"] == 2 * params
    assert launcher["per_gpu"]["optimizer_moments_bytes"] == 4 * params
    assert fp32_adam["per_gpu"]["master_weights_bytes"] == 4 * params
    assert fp32_adam["per_gpu"]["optimizer_moments_bytes"] == 8 * params
    assert launcher["fits"] and launcher["per_gpu"]["total_bytes"] < 80e9
    assert not fp32_adam["fits"]


def test_fit_weights_left_out_are_the_published_dtype_but_bf16_under_fine_tuning() -> None:
    """`fit deepseek-v3` without --weights-dtype splits the FP8 release (671B parameters in about 673 GB with its
    16-bit embeddings and norms), which fits 8 H200; with --finetune lora the base is bf16, trained beside its
    adapters; a typed dtype is kept."""
    served = fit_report("deepseek-v3", gpu="h200", gpus=8)
    assert served["dtype"] == "fp8" and served["weights_bytes_total"] == pytest.approx(673e9, rel=0.01)
    lora = fit_report("deepseek-v3", gpu="h200", gpus=64, finetune=FinetuneRequest(mode="lora"))
    assert lora["dtype"] == "bf16"
    assert fit_report("deepseek-v3", gpu="h200", gpus=16, dtype="bf16")["dtype"] == "bf16"
