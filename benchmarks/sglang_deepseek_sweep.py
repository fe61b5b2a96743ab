"""DeepSeek-R1 on 8 H200 under SGLang, a concurrency sweep outside the reference set, beside `meshplan serve`.

    PYTHONPATH=$PWD python benchmarks/sglang_deepseek_sweep.py

InferenceX (SemiAnalysis) runs DeepSeek-R1-0528 FP8 at TP 8 on 8 H200 under SGLang with the launch of
benchmarks/single_node/dsr1_fp8_h200.sh (--max-running-requests 512 at 1K / 1K and 256 at 8K / 1K, --chunked-prefill-
size 32768, --mem-fraction-static 0.82) and a closed-loop client that draws lengths from 0.8 to 1.0 of the nominal
(922 and 7,373 on average) and leaves 2 x concurrency warm-up requests out. The published baseline of its pull
request 3173 (the run of 2026-05-17, SGLang 0.5.12) gives the mean TPOT, output tokens/s a GPU and mean TTFT at
concurrency 4 to 64. The rows at 8 or fewer sequences are steps of catalog/serving/few_moe_decode.toml (the band
`serve` prints there); the rest are no source of `meshplan validate` (docs/validation.md, "A MoE model at a few
sequences a step"). This prints each beside `meshplan serve`'s answer to the same flags.
"""

from __future__ import annotations

from typed_estimate import estimate_json

COMMON = ["deepseek-v3", "--gpu", "h200", "--gpus", "8", "--tp", "8", "--engine", "sglang", "--weights-dtype", "fp8"]
CAPS = ["--max-num-tokens", "32768", "--gpu-memory-utilization", "0.82"]
LENGTHS = {"1K/1K": (922, 922, 512), "8K/1K": (7373, 922, 256)}  # mean input, mean output, --max-running-requests
PUBLISHED = (  # workload, concurrency, TPOT ms, output tokens/s a GPU, TTFT ms (SGLang 0.5.12)
    ("1K/1K", 4, 9.7, 49.17, 157.77),
    ("1K/1K", 8, 11.73, 82.37, 165.36),
    ("1K/1K", 16, 15.28, 126.62, 197.84),
    ("1K/1K", 32, 21.8, 177.14, 307.02),
    ("1K/1K", 64, 29.77, 259.8, 359.75),
    ("8K/1K", 4, 10.94, 43.12, 373.26),
    ("8K/1K", 8, 13.88, 68.33, 490.53),
    ("8K/1K", 16, 20.02, 93.89, 688.2),
    ("8K/1K", 32, 31.37, 121.01, 979.34),
    ("8K/1K", 64, 49.33, 150.98, 2245.58),
)


def main_() -> None:
    head = f"{'workload':8}  {'conc':>4}  {'TPOT pub':>8}  {'serve':>6}  {'tok/s/GPU pub':>13}  {'serve':>6}"
    print(f"{head}  {'TTFT pub':>8}  {'serve':>6}")
    for workload, conc, tpot, rate, ttft in PUBLISHED:
        isl, osl, cap = LENGTHS[workload]
        flags = ["--input-len", str(isl), "--output-len", str(osl), "--max-batch", str(cap), "--concurrency", str(conc)]
        r = estimate_json([*COMMON, *CAPS, *flags], "serve")
        print(
            f"{workload:8}  {conc:>4}  {tpot:>8.2f}  {1e3 * r['tpot_s']:>6.2f}  {rate:>13.1f}  "
            f"{r['tokens_per_s_per_gpu']:>6.1f}  {ttft:>8.1f}  {1e3 * r['ttft_s_mean']:>6.1f}"
        )


if __name__ == "__main__":
    main_()
