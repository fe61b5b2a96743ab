"""Fine-tuning runs outside the reference set: NeMo 24.07's SFT and LoRA rows on DGX H100, typed as a user would.

    python benchmarks/finetune_outside_reference.py

NVIDIA NeMo docs/source/performance/performance_summary.md as of the 24.07 release (git d31653f792^), the
'Finetuning' table: Llama 2 7B, 13B and 70B, SFT and LoRA, FP8, SQuAD-v1.1 packed into 4,096-token sequences,
global batch 32, micro-batch 1, on 8 or 16 H100s. The run conditions come from the same release's launcher
(NVIDIA/NeMo-Framework-Launcher tag 24.07: examples/peft/llama/h100/*.sh, one script a row, whose GPUs, TP, PP,
batch and sequence match the table's, on launcher_scripts/conf/peft/llama/sft.yaml):
- every row: Transformer Engine FP8 with FP8 parameters (fp8_params: the weights are kept in FP8 and the
  distributed optimizer all-gathers them in FP8: `--fp8-all-gather on`);
- SFT: Apex's distributed Adam with its state in bf16 (optim.dtype bf16: bf16 moments and, with FP8 parameters,
  a bf16 copy of the parameters to update: `--moment-dtype bf16 --master-dtype bf16`), bf16 gradient reduction,
  and virtual pipeline stages where PP > 1 (13B: 10, 70B: 20) with the P2P overlapped;
- LoRA: plain fused Adam on the adapters, NeMo 1.x's default adapters (rank 32 on the fused QKV projection);
and the overlaps of the release's pre-training rows (catalog/runs/nemo2407_h100.toml). The packing keeps each
token's attention inside its own SQuAD sample: typed once without it (full causal attention over the 4,096
tokens) and once with `--doc-tokens 200`, a sample's length as assumed here (a SQuAD paragraph, its question and
answer in the prompt template; the source states none). These rows are no source of `meshplan validate`: this
prints each prediction beside the published tokens per second per GPU, and the LoRA over SFT speed-up.
"""

from __future__ import annotations

from typed_estimate import estimate_json

COMMON = [
    "--stack", "nemo", "--gpu", "h100-sxm", "--scale-out", "ib-ndr", "--precision", "fp8", "--attention", "flash",
    "--kernels", "fused", "--overlap-dp", "on", "--overlap-param-gather", "on", "--overlap-tp", "on",
    "--overlap-tp-backward", "on", "--overlap-pp", "on", "--pp-host-sync", "off", "--seq", "4096",
    "--global-batch", "32", "--micro-batch", "1", "--zero", "1", "--fp8-all-gather", "on",
]  # fmt: skip
LORA = ["--finetune", "lora", "--lora-rank", "32", "--lora-targets", "q,k,v"]
SFT = ["--moment-dtype", "bf16", "--master-dtype", "bf16"]
PACKED = ["--doc-tokens", "200"]
ROWS = (  # model, task, GPUs, TP, PP, virtual stages, published tokens/s per GPU
    ("llama-2-7b", "SFT", 8, 1, 1, 1, 16891),
    ("llama-2-13b", "SFT", 8, 1, 4, 10, 10176),
    ("llama-2-70b", "SFT", 16, 4, 4, 20, 1816),
    ("llama-2-7b", "LoRA", 8, 1, 1, 1, 24824),
    ("llama-2-13b", "LoRA", 8, 1, 1, 1, 14629),
    ("llama-2-70b", "LoRA", 8, 2, 4, 1, 2621),
)


def estimate(args: list[str]) -> dict:
    return estimate_json([*args, *COMMON])


def main_() -> None:
    print(f"{'run':42}  {'published':>9}  {'full attn':>9}  {'error':>7}  {'packed':>9}  {'error':>7}  fits")
    predicted: dict[tuple[str, str], tuple[float, float]] = {}
    for model, task, gpus, tp, pp, vpp, published in ROWS:
        layout = ["--gpus", str(gpus), "--tp", str(tp), "--pp", str(pp), "--vpp", str(vpp)]
        args = [model, *layout, *(["--sp"] if tp > 1 else []), *(LORA if task == "LoRA" else SFT)]
        full, packed = estimate(args), estimate([*args, *PACKED])
        rates = full["tokens_per_s_per_gpu"], packed["tokens_per_s_per_gpu"]
        predicted[model, task] = rates
        name = f"{model} {task}, {gpus} H100, TP {tp} PP {pp}" + (f" VP {vpp}" if vpp > 1 else "")
        fits = "yes" if full["fits"] else "no"
        errors = "  ".join(f"{r:>9,.0f}  {r / published - 1:>+7.1%}" for r in rates)
        print(f"{name:42}  {published:>9,}  {errors}  {fits}")
    published = {(m, t): p for m, t, *_, p in ROWS}
    print("\nLoRA over SFT, same model, tokens/s per GPU (7B: same layout; 13B and 70B: their own layouts)")
    for model in ("llama-2-7b", "llama-2-13b", "llama-2-70b"):
        pub = published[model, "LoRA"] / published[model, "SFT"]
        lora, sft = predicted[model, "LoRA"], predicted[model, "SFT"]
        full, packed = lora[0] / sft[0], lora[1] / sft[1]
        print(f"  {model:12}  published {pub:.2f}x  full attention {full:.2f}x  packed {packed:.2f}x")


if __name__ == "__main__":
    main_()
