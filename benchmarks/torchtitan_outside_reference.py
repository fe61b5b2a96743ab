"""PyTorch-native runs outside the reference set: torchtitan's and torchao's own 2025 benchmarks, typed as a user would.

    python benchmarks/torchtitan_outside_reference.py

Sources (each row prints its own):
- torchao torchao/float8/README.md, "Training benchmarks" (pytorch/ao 8c81863, 2025-03-12, and 853f87d, 2025-08-11):
  Llama 3.1 8B on one node of 8 GPUs, FSDP2, batch 1, sequence 8,192, torch.compile, per-op SAC; H100 with
  torchtitan 0.0.2 (its loss not yet compiled), MI300X with torchtitan 2c8b594 (loss compiled with the model).
  The H100 part is not named; torchao's own roofline (torchao/testing/training/roofline_utils.py) describes its
  team's H100 as "2.4 TB per second, custom to Meta's H100 variant": typed as h100-sxm-96gb, that variant.
- torchtitan benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md: Llama 3.1 8B on 4 and 8 nodes of H200,
  local batch 2, compile, Float8 tensorwise with FP8 FSDP all-gathers, llama3_8b.toml's per-op SAC and 8,192.
- torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md: Llama 3.1 70B (FSDP 32 x TP 8, full AC, local
  batch 16) and 8B (FSDP 8 x TP 8, per-op SAC, local batch 12) on Grand Teton H100s (96 GB, 500 W), compile, vanilla
  and async TP, bf16 and Float8 tensorwise / rowwise.

Memory is torchtitan's logged peak, torch.cuda max_memory_reserved in GiB, against the bill's reserved bytes.
Conditions no flag states are left at the stack's: torchao's force_recompute_fp8_weight_in_bwd, its
rowwise_with_gw_hp recipe (row left out), FSDP2's float8 scale precompute.
"""

from __future__ import annotations

from typed_estimate import estimate_json

TORCHTITAN = ["--stack", "torchtitan", "--kernels", "fused", "--seq", "8192", "--zero", "3"]
TENSORWISE = ["--precision", "fp8", "--fp8-recipe", "tensorwise", "--fp8-all-gather", "on"]
ROWWISE = ["--precision", "fp8", "--fp8-recipe", "rowwise"]
ONE_NODE = ["llama-3.1-8b", "--gpus", "8", "--dp-shard", "8", "--micro-batch", "1", "--global-batch", "8",
            "--recompute", "selective", "--selective", "op"]  # fmt: skip
H100 = [*ONE_NODE, "--gpu", "h100-sxm-96gb", "--loss", "upcast"]  # torchtitan 0.0.2: its loss not yet compiled
MI300X = [*ONE_NODE, "--gpu", "mi300x", "--loss", "compiled"]
ROWS = (  # name, published tokens/s per GPU, published GiB (None: not given), arguments
    ("torchao H100 8B bf16", 6150, 47.65, H100),
    ("torchao H100 8B fp8 tensorwise", 7689.5, 47.77, [*H100, *TENSORWISE]),
    ("torchao H100 8B fp8 rowwise", 6768, 47.79, [*H100, *ROWWISE]),
    ("torchao MI300X 8B bf16", 5376.5, 39.09, MI300X),
    ("torchao MI300X 8B fp8 tensorwise", 6166, 39.07, [*MI300X, *TENSORWISE]),
    ("torchao MI300X 8B fp8 rowwise", 5891, 39.32, [*MI300X, *ROWWISE]),
    *(
        (f"Trainy H200 8B fp8, {n} GPUs", tps, gib,
         ["llama-3.1-8b", "--gpu", "h200", "--gpus", str(n), "--dp-shard", str(n), "--micro-batch", "2",
          "--global-batch", str(2 * n), "--recompute", "selective", "--selective", "op", "--loss", "compiled",
          *TENSORWISE])
        for n, tps, gib in ((32, 10938, 47.96), (64, 10753, 46.97))
    ),
    *(
        (f"asyncTP {size} {label}, {'async' if tp_overlap == 'on' else 'vanilla'} TP", tps, None,
         [f"llama-3.1-{size.lower()}", "--gpu", "h100-sxm-96gb", "--scale-out", "roce-400g", "--gpus", str(gpus),
          "--dp-shard", str(fsdp), "--tp", "8", "--sp", "--micro-batch", str(batch), "--global-batch",
          str(batch * fsdp), "--recompute", recompute, "--loss", "compiled", "--overlap-tp", tp_overlap, *precision])
        for size, gpus, fsdp, batch, recompute in (("70B", 256, 32, 16, "full"), ("8B", 64, 8, 12, "selective"))
        for label, precision, (vanilla, asynchronous) in (
            ("bf16", [], {"70B": (597.3, 652.4), "8B": (4378, 4809.4)}[size]),
            ("fp8 tensorwise", ["--precision", "fp8", "--fp8-recipe", "tensorwise"],
             {"70B": (809.8, 942.4), "8B": (5078.1, 5570.1)}[size]),
            ("fp8 rowwise", ROWWISE, {"70B": (599.6, 624.8), "8B": (3708.5, 3914.9)}[size]),
        )
        for tp_overlap, tps in (("off", vanilla), ("on", asynchronous))
    ),
)  # fmt: skip


def main_() -> None:
    print(f"{'run':42}  {'published':>9}  {'predicted':>9}  {'error':>7}  {'GiB published':>13}  {'reserved':>8}")
    errors: list[float] = []
    for name, published, gib, args in ROWS:
        plan = estimate_json([*args, *TORCHTITAN])
        predicted = plan["tokens_per_s_per_gpu"]
        errors.append(abs(predicted / published - 1))
        stage = plan["stages"][plan["heaviest_stage"]]
        memory = f"{gib:>13.2f}  {stage['reserved_bytes'] / 2**30:>8.2f}" if gib else f"{'':>13}  {'':>8}"
        print(f"{name:42}  {published:>9,.0f}  {predicted:>9,.0f}  {predicted / published - 1:>+7.1%}  {memory}")
    print(f"mean |error| {sum(errors) / len(errors):.1%} over {len(errors)} runs")


if __name__ == "__main__":
    main_()
