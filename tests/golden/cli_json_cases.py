"""The commands whose ``--json`` output is pinned byte for byte (tests/golden/test_cli_json_pinned.py).

Each case is the argument list after ``meshplan`` (``--json`` is added); its output lives in
tests/golden/cli_json/NAME.json. The outputs were printed by main 5c9a56b, before the package was laid out
in sub-packages: a change of layout must not change one byte of them. One deliberate change since: the
catalog's source notes name the modules where the formulas now live (core/serving/caps.py for
core/serve_caps.py, ...), which four serve outputs quote; nothing else moved. A deliberate change of a number
rewrites them with ``MESHPLAN_REWRITE_PINNED_JSON=1 python -m pytest tests/golden/test_cli_json_pinned.py``
and says so in its commit.
"""

from __future__ import annotations

H100 = ["--gpu", "h100-sxm"]
# fmt: off
CASES: dict[str, list[str]] = {
    "list_models": ["list", "models"],
    "list_gpus": ["list", "gpus"],
    "list_links": ["list", "links"],
    "list_recipes": ["list", "recipes"],
    "stacks": ["stacks"],
    "params_8b": ["params", "llama-3.1-8b"],
    "params_deepseek_v3": ["params", "deepseek-v3"],
    "params_70b_lora": ["params", "llama-3.1-70b", "--finetune", "lora", "--lora-rank", "16"],
    "memory_70b_tp8_pp4_zero1": ["memory", "llama-3.1-70b", *H100, "--gpus", "64", "--tp", "8", "--pp", "4",
                                 "--zero", "1", "--sp", "--seq", "8192", "--global-batch", "128"],
    "memory_8b_torchtitan_fsdp": ["memory", "llama-3.1-8b", "--gpu", "h200", "--gpus", "8", "--dp-shard", "8",
                                  "--zero", "3", "--stack", "torchtitan", "--seq", "8192", "--global-batch", "32"],
    "memory_mixtral_ep": ["memory", "mixtral-8x7b", *H100, "--gpus", "16", "--tp", "2", "--ep", "8",
                          "--seq", "4096", "--global-batch", "64", "--recompute", "full"],
    "memory_70b_qlora": ["memory", "llama-3.1-70b", *H100, "--gpus", "1", "--finetune", "qlora",
                         "--seq", "4096", "--global-batch", "8"],
    "memory_deepseek_v3_pp": ["memory", "deepseek-v3", "--gpu", "h800", "--gpus", "2048", "--pp", "16",
                              "--ep", "64", "--schedule", "dualpipe", "--seq", "4096", "--global-batch", "15360"],
    "estimate_70b": ["estimate", "llama-3.1-70b", *H100, "--gpus", "64", "--tp", "8", "--pp", "2", "--sp",
                     "--seq", "8192", "--global-batch", "128"],
    "estimate_70b_tokens": ["estimate", "llama-3.1-70b", *H100, "--gpus", "1024", "--tp", "8", "--pp", "4",
                            "--sp", "--seq", "8192", "--global-batch", "512", "--tokens", "15T"],
    "estimate_8b_torchtitan_cp": ["estimate", "llama-3.1-8b", "--gpu", "h200", "--gpus", "16", "--cp", "2",
                                  "--dp-shard", "8", "--zero", "3", "--stack", "torchtitan", "--seq", "32768",
                                  "--global-batch", "16"],
    "estimate_mixtral_ep": ["estimate", "mixtral-8x7b", *H100, "--gpus", "32", "--tp", "2", "--ep", "8",
                            "--pp", "2", "--seq", "4096", "--global-batch", "256"],
    "estimate_gpt3_megatron": ["estimate", "gpt3-175b", "--gpu", "a100-80gb", "--gpus", "1024", "--tp", "8",
                               "--pp", "8", "--stack", "megatron-lm-2021", "--seq", "2048",
                               "--global-batch", "1536", "--recompute", "full"],
    "collectives": ["collectives"],
    "plan_readme": ["plan", "llama-3.1-70b", "--gpu", "h200", "--gpus", "64", "--seq", "8192",
                    "--global-batch-tokens", "4194304", "--explain"],
    "plan_8b_torchtitan": ["plan", "llama-3.1-8b", *H100, "--gpus", "8", "--seq", "8192",
                           "--global-batch-tokens", "1M", "--engine", "torchtitan"],
    "plan_mixtral": ["plan", "mixtral-8x7b", *H100, "--gpus", "32", "--seq", "4096",
                     "--global-batch-tokens", "2M"],
    "plan_70b_pinned": ["plan", "llama-3.1-70b", *H100, "--gpus", "64", "--seq", "8192",
                        "--global-batch-tokens", "4M", "--zero", "1", "--micro-batch", "1"],
    "recipe_list": ["recipe", "--list"],
    "recipe_gpt3": ["recipe", "megatron-gpt3-175b"],
    "fit_8b_qlora": ["fit", "llama-3.1-8b", "--gpu", "a100-40gb", "--gpus", "1", "--finetune", "qlora",
                     "--seq", "4096"],
    "fit_70b": ["fit", "llama-3.1-70b", *H100, "--gpus", "8"],
    "serving_70b": ["serving", "llama-3.1-70b", *H100, "--gpus", "8"],
    "serving_deepseek_fp8": ["serving", "deepseek-v3", "--gpu", "h200", "--gpus", "8", "--dtype", "fp8"],
    "serve_70b_concurrency": ["serve", "llama-3.1-70b", *H100, "--gpus", "8", "--input-len", "1024",
                              "--output-len", "256", "--concurrency", "64"],
    "serve_8b_rate": ["serve", "llama-3.1-8b", *H100, "--gpus", "1", "--input-len", "2048",
                      "--output-len", "128", "--rate", "5"],
    "serve_70b_offline": ["serve", "llama-2-70b", *H100, "--gpus", "8", "--tp", "2", "--input-len", "1024",
                          "--output-len", "256", "--num-requests", "1000"],
    "serve_mixtral_ep": ["serve", "mixtral-8x7b", *H100, "--gpus", "8", "--tp", "8", "--input-len", "512",
                         "--output-len", "512", "--concurrency", "32"],
    "serve_plan_70b": ["serve-plan", "llama-2-70b", *H100, "--gpus", "8", "--input-len", "1024",
                       "--output-len", "256", "--ttft-p99", "2", "--tpot-p99", "0.2"],
    "serve_plan_disagg": ["serve-plan", "llama-3.1-8b", *H100, "--gpus", "8", "--input-len", "2048",
                          "--output-len", "256", "--search-disaggregated"],
    "export_torchtitan": ["export", "torchtitan", "llama-3.1-8b", *H100, "--gpus", "8", "--dp-shard", "8",
                          "--zero", "3", "--seq", "8192", "--global-batch", "32"],
    "export_megatron": ["export", "megatron", "llama-3.1-70b", *H100, "--gpus", "64", "--tp", "8", "--pp", "4",
                        "--seq", "8192", "--global-batch", "128"],
    "export_deepspeed": ["export", "deepspeed", "llama-3.1-8b", *H100, "--gpus", "8", "--zero", "3",
                         "--seq", "4096", "--global-batch", "64"],
    "export_vllm": ["export", "vllm", "llama-3.1-70b", *H100, "--gpus", "8", "--tp", "8"],
    "export_sglang": ["export", "sglang", "llama-3.1-70b", *H100, "--gpus", "8", "--tp", "4"],
    "export_trtllm": ["export", "trtllm", "llama-3.1-70b", *H100, "--gpus", "8", "--tp", "8"],
    "estimate_70b_lora": ["estimate", "llama-3.1-70b", *H100, "--gpus", "8", "--tp", "8", "--finetune", "lora",
                          "--lora-rank", "16", "--seq", "4096", "--global-batch", "32"],
    "plan_compare": ["plan", "llama-3.1-70b", *H100, "--gpus", "64", "--seq", "8192",
                     "--global-batch-tokens", "4M", "--compare", "tp=8,pp=2,dp_shard=4,zero=1,sp=true"],
    "validate_serving": ["validate", "--serving"],
    "validate_memory": ["validate", "--memory"],
    "calibrate_runs": ["calibrate", "tests/data/calibrate_runs.json"],
}
# fmt: on
