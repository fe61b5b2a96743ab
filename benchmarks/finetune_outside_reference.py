"""Fine-tuning runs outside the reference set: NeMo 24.07's SFT and LoRA rows on DGX H100, typed as a user would.

    python benchmarks/finetune_outside_reference.py

NVIDIA NeMo docs/source/performance/performance_summary.md as of the 24.07 release (git d31653f792^), the
'Finetuning' table: Llama 2 7B, 13B and 70B, SFT and LoRA, FP8, SQuAD-v1.1 packed into 4,096-token sequences,
global batch 32, micro-batch 1, on 8 or 16 H100s. Typed with the conditions of the same release's pre-training
rows (catalog/runs/nemo2407_h100.toml: Transformer Engine FP8, the distributed optimizer, NeMo's overlaps) and,
for LoRA, NeMo 1.x's default adapters (rank 32 on the fused QKV projection). The packing keeps each token's
attention inside its own SQuAD sample: typed once without it (full causal attention over the 4,096 tokens) and
once with `--doc-tokens 200`, a sample's length as assumed here (a SQuAD paragraph, its question and answer in the
prompt template; the source states none). These rows are no source of `meshplan validate`: this prints each
prediction beside the published tokens per second per GPU, and the LoRA over SFT speed-up.
"""

from __future__ import annotations

from typed_estimate import estimate_json

COMMON = [
    "--stack", "nemo", "--gpu", "h100-sxm", "--scale-out", "ib-ndr", "--precision", "fp8", "--attention", "flash",
    "--kernels", "fused", "--overlap-dp", "on", "--overlap-param-gather", "on", "--overlap-tp", "on",
    "--overlap-tp-backward", "on", "--overlap-pp", "on", "--pp-host-sync", "off", "--seq", "4096",
    "--global-batch", "32", "--micro-batch", "1", "--zero", "1",
]  # fmt: skip
LORA = ["--finetune", "lora", "--lora-rank", "32", "--lora-targets", "q,k,v"]
PACKED = ["--doc-tokens", "200"]
ROWS = (  # model, task, GPUs, TP, PP, published tokens/s per GPU
    ("llama-2-7b", "SFT", 8, 1, 1, 16891),
    ("llama-2-13b", "SFT", 8, 1, 4, 10176),
    ("llama-2-70b", "SFT", 16, 4, 4, 1816),
    ("llama-2-7b", "LoRA", 8, 1, 1, 24824),
    ("llama-2-13b", "LoRA", 8, 1, 1, 14629),
    ("llama-2-70b", "LoRA", 8, 2, 4, 2621),
)


def estimate(args: list[str]) -> dict:
    return estimate_json([*args, *COMMON])


def main_() -> None:
    print(f"{'run':40}  {'published':>9}  {'full attn':>9}  {'error':>7}  {'packed':>9}  {'error':>7}  fits")
    predicted: dict[tuple[str, str], tuple[float, float]] = {}
    for model, task, gpus, tp, pp, published in ROWS:
        layout = ["--gpus", str(gpus), "--tp", str(tp), "--pp", str(pp), *(["--sp"] if tp > 1 else [])]
        args = [model, *layout, *(LORA if task == "LoRA" else [])]
        full, packed = estimate(args), estimate([*args, *PACKED])
        rates = full["tokens_per_s_per_gpu"], packed["tokens_per_s_per_gpu"]
        predicted[model, task] = rates
        name = f"{model} {task}, {gpus} H100, TP {tp} PP {pp}"
        fits = "yes" if full["fits"] else "no"
        errors = "  ".join(f"{r:>9,.0f}  {r / published - 1:>+7.1%}" for r in rates)
        print(f"{name:40}  {published:>9,}  {errors}  {fits}")
    published = {(m, t): p for m, t, *_, p in ROWS}
    print("\nLoRA over SFT, same model, tokens/s per GPU (7B: same layout; 13B and 70B: their own layouts)")
    for model in ("llama-2-7b", "llama-2-13b", "llama-2-70b"):
        pub = published[model, "LoRA"] / published[model, "SFT"]
        lora, sft = predicted[model, "LoRA"], predicted[model, "SFT"]
        full, packed = lora[0] / sft[0], lora[1] / sft[1]
        print(f"  {model:12}  published {pub:.2f}x  full attention {full:.2f}x  packed {packed:.2f}x")


if __name__ == "__main__":
    main_()
