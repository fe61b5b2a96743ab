"""Context parallelism from 4K to 1M tokens against NeMo's long-sequence table, which is not a validation source.

    python benchmarks/nemo_long_sequence.py

NVIDIA NeMo, docs/source/performance/performance_long_sequence.md (NeMo 24.03.01, Llama 2 7B in FP8 on DGX H100,
as many GPUs as thousands of tokens): the layout of every row with context parallelism (TP, PP, DP, CP) and its
model TFLOP/s per GPU. The table states neither the global batch nor the activation recompute, so it is not a
source of `meshplan validate`; this script evaluates each row with NeMo's stack as validate would and prints
the prediction (Megatron's FLOP count, the one NeMo reports) with no recompute and with selective recompute, at
one and at eight micro-batches a step, beside the published number.
"""

from __future__ import annotations

from meshplan.validation.training import run_case

ROWS = (  # thousands of tokens (= GPUs), published TFLOP/s per GPU, tp, pp, dp, cp
    (4, 768, 1, 1, 4, 1),
    (8, 730, 1, 2, 4, 1),
    (16, 660, 2, 1, 8, 1),
    (32, 610, 2, 1, 8, 2),
    (64, 574, 4, 1, 8, 2),
    (128, 555, 4, 1, 8, 4),
    (256, 549, 4, 1, 8, 8),
    (512, 549, 8, 1, 4, 16),
    (1024, 536, 8, 1, 4, 32),
)


def predicted_tflops(
    seq_k: int, published: int, tp: int, pp: int, dp: int, cp: int, *, recompute: str, steps: int
) -> float:
    """Model TFLOP/s per GPU of one row, ``steps`` micro-batches a step, as `meshplan validate` would predict it
    (the same command `meshplan estimate` runs: tests/golden/test_validation_targets.py checks the two agree)."""
    case = {
        "id": f"{seq_k}K",
        "model": "llama-2-7b",
        "gpu": "h100-sxm",
        "scale_out": "ib-ndr",
        "stack": "nemo",
        "precision": "fp8",
        "gpus": seq_k,
        "seq": seq_k * 1024,
        "global_batch": dp * steps,
        "measured": published,
        "layout": {"tp": tp, "pp": pp, "cp": cp, "dp_shard": dp, "zero": 1, "sp": tp > 1, "micro_batch": 1,
                   "recompute": recompute},
    }  # fmt: skip
    return run_case("nemo_long_sequence", case, "tflops_per_gpu_megatron").predicted


def main() -> None:
    print("tokens  layout              published  none, m=1  none, m=8  selective, m=1  selective, m=8")
    for seq_k, published, tp, pp, dp, cp in ROWS:
        cells = []
        for recompute in ("none", "selective"):
            for steps in (1, 8):
                tf = predicted_tflops(seq_k, published, tp, pp, dp, cp, recompute=recompute, steps=steps)
                cells.append(f"{tf:4.0f} ({tf / published - 1:+.0%})")
        layout = f"TP{tp} PP{pp} DP{dp} CP{cp}"
        print(f"{seq_k:5d}K  {layout:18s}  {published:9d}  " + "  ".join(f"{c:>14s}" for c in cells))


if __name__ == "__main__":
    main()
