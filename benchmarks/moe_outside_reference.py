"""Megatron MoE runs outside the reference set: Megatron-Bridge's 26.02 Qwen3 rows on H100, typed from their recipe.

    python benchmarks/moe_outside_reference.py

Megatron-Bridge docs/performance-summary.md at v0.3.0 (the 26.02 container), DGX-H100 table, and the presets they
ran (scripts/performance/configs/qwen/qwen3_workload_base_configs.py and qwen3_llm_pretrain.py at v0.3.0): FP8
with Transformer Engine's current scaling and FP8 parameter gathers, no activation recompute, bf16 gradient
reduce, tokens force-balanced over the experts, the all-to-all overlapped with the other micro-batch's compute,
sequences of 4,096 tokens, one sequence a micro-batch. Qwen3-30B-A3B also runs DeepEP and CUDA graphs of its
router and preprocessing, neither of which the schema states. These rows are not in the reference set, so they are
no source of `meshplan validate`: this prints each prediction beside the published tokens per second per GPU, and
the step time per MoE layer and micro-batch, published against predicted.
"""

from __future__ import annotations

from typed_estimate import estimate_json

COMMON = [
    "--stack", "nemo", "--gpu", "h100-sxm", "--scale-out", "ib-ndr", "--grad-dtype", "bf16", "--seq", "4096",
    "--precision", "fp8", "--fp8-recipe", "tensorwise", "--fp8-all-gather", "on", "--routing-imbalance", "1",
    "--overlap-ep", "on", "--expert-tp", "1", "--zero", "1", "--recompute", "none", "--micro-batch", "1",
    "--schedule", "interleaved",
]  # fmt: skip
ROWS = (  # name, published tokens/s per GPU, layers, model and layout flags
    ("Qwen3-235B-A22B FP8, 256 H100, TP 2 PP 8 VP 4 EP 32", 1633, 94,
     ["qwen3-235b-a22b", "--gpus", "256", "--global-batch", "8192", "--tp", "2", "--sp", "--pp", "8", "--vpp", "4",
      "--ep", "32"]),
    ("Qwen3-30B-A3B FP8, 16 H100, PP 2 VP 12 EP 8", 5113, 48,
     ["qwen3-30b-a3b", "--gpus", "16", "--global-batch", "1024", "--pp", "2", "--vpp", "12", "--ep", "8"]),
)  # fmt: skip


def estimate(args: list[str]) -> dict:
    return estimate_json([*args, *COMMON])


def main_() -> None:
    print(f"{'run':52}  {'published':>9}  {'predicted':>9}  {'error':>7}  {'ms a MoE layer-micro-batch':>27}")
    for name, published, layers, args in ROWS:
        plan = estimate(args)
        lay = plan["layout"]
        dp = plan["gpus"] // (lay["tp"] * lay["pp"] * lay["cp"])
        layer_mbs = plan["global_batch"] // dp * layers / lay["pp"]
        measured_step_s = plan["global_batch"] * plan["seq"] / (plan["gpus"] * published)
        predicted = plan["tokens_per_s_per_gpu"]
        per_layer = f"{1e3 * measured_step_s / layer_mbs:.1f} vs {1e3 * plan['step_time_s'] / layer_mbs:.1f}"
        print(f"{name:52}  {published:>9,}  {predicted:>9,.0f}  {predicted / published - 1:>+7.1%}  {per_layer:>27}")


if __name__ == "__main__":
    main_()
