"""Small-batch decode of a 671B MoE outside the reference set: SGLang's own notes for DeepSeek-V3 at TP 8.

    PYTHONPATH=$PWD python benchmarks/moe_small_batch_decode.py

SGLang v0.4.1.post2's release notes (sgl-project/sglang pull request 2643, 2024-12-29: "Using CUDA Graph and FP8
GEMM Tuning") give DeepSeek-V3 at TP 8, input 128, output 256: 30.29 tokens/s at batch 1, 206.32 at batch 8 and
760.52 at batch 32. Pull request 3582 (2025-02-14) gives 77 tokens/s at batch 1 with MTP, 1.76 times its speed
without (about 44). Neither names the GPU in the text read: 8 H200 with the FP8 weights is typed here as an
assumption (a node that holds them at TP 8). They set no constant (one release each, the GPU unstated, and
``--engine sglang`` stands for today's SGLang); the batch-1 and batch-8 rows are among the published steps whose
spread is the band ``serve`` prints beside a MoE model at 8 or fewer sequences a step
(catalog/serving/few_moe_decode.toml, ``meshplan validate --serving``). This prints each beside ``meshplan serve``'s
answer for a static batch (output tokens over the batch's whole time, its prefill in), and the decode step each
implies (docs/validation.md, "A MoE model at a few sequences a step").
"""

from __future__ import annotations

from typed_estimate import estimate_json

COMMON = ["deepseek-v3", "--gpu", "h200", "--gpus", "8", "--tp", "8", "--engine", "sglang", "--weights-dtype", "fp8"]
ROWS = (  # release, batch, published output tokens/s (all sequences), input and output tokens
    ("v0.4.1.post2 (PR 2643)", 1, 30.29, 128, 256),
    ("v0.4.1.post2 (PR 2643)", 8, 206.32, 128, 256),
    ("v0.4.1.post2 (PR 2643)", 32, 760.52, 128, 256),
)


def main_() -> None:
    print(f"{'release':24}  {'batch':>5}  {'published':>9}  {'predicted':>9}  {'step published':>14}  {'predicted':>9}")
    for release, batch, published, isl, osl in ROWS:
        r = estimate_json([*COMMON, "--input-len", str(isl), "--output-len", str(osl), "--batch", str(batch)], "serve")
        step_ms = 1e3 * r["tpot_s"]
        print(
            f"{release:24}  {batch:>5}  {published:>9,.1f}  {r['tokens_per_s_total']:>9,.1f}  "
            f"{1e3 * batch / published:>12.1f} ms  {step_ms:>6.1f} ms"
        )


if __name__ == "__main__":
    main_()
