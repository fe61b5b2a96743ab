"""docs/exports.md shows what the exports really write: each marked block equals a fresh export."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from export_cases import LLAMA2_7B, LLAMA_405B, RECIPE_405B

from meshplan.exports import (
    DisaggregatedPlan,
    Export,
    ServingPlan,
    export_deepspeed,
    export_megatron,
    export_sglang,
    export_sglang_disaggregated,
    export_torchtitan,
    export_trtllm,
    export_vllm,
)
from meshplan.spec.layout import Layout, Recompute, ZeroStage
from meshplan.spec.workload import PRECISIONS, Workload
from meshplan.units import DType

DOC = Path(__file__).resolve().parents[2] / "docs" / "exports.md"

RECIPE_405B_WORKLOAD = Workload(seq_len=8192, global_batch=2048, precision=PRECISIONS["bf16-fp32-grads"])
FINETUNE_7B = Layout(dp_shard=8, zero=ZeroStage.PARAMETERS, recompute=Recompute.FULL, micro_batch=4)
SERVE_70B = ServingPlan(
    model_path="meta-llama/Llama-3.3-70B-Instruct",
    tp=8,
    max_model_len=32768,
    gpu_memory_utilization=0.9,
    max_num_seqs=64,
)

SPLIT_70B = DisaggregatedPlan(
    prefill=replace(SERVE_70B, tp=2, max_model_len=8300, max_num_seqs=96, kv_cache_dtype=DType.FP8),
    decode=replace(SERVE_70B, tp=2, dp=3, max_model_len=8300, max_num_seqs=96, kv_cache_dtype=DType.FP8),
)

EXAMPLES: dict[str, Callable[[], Export]] = {
    "torchtitan-405b": lambda: export_torchtitan(
        LLAMA_405B, RECIPE_405B, RECIPE_405B_WORKLOAD, model_path="/models/Llama-3.1-405B"
    ),
    "megatron-405b": lambda: export_megatron(
        LLAMA_405B, RECIPE_405B, RECIPE_405B_WORKLOAD, model_path="/models/Llama-3.1-405B"
    ),
    "deepspeed-7b": lambda: export_deepspeed(
        LLAMA2_7B, FINETUNE_7B, Workload(seq_len=4096, global_batch=128), model_path="/models/Llama-2-7b-hf"
    ),
    "vllm-70b": lambda: export_vllm(SERVE_70B),
    "sglang-70b": lambda: export_sglang(replace(SERVE_70B, gpu_memory_utilization=0.85)),
    "trtllm-70b": lambda: export_trtllm(replace(SERVE_70B, kv_cache_dtype=DType.FP8)),
    "sglang-70b-pd": lambda: export_sglang_disaggregated(SPLIT_70B),
}

_BLOCK = re.compile(r"<!-- export: (\S+) (\S+) -->\n```\w*\n(.*?)```", re.DOTALL)


def test_every_example_block_matches_a_fresh_export() -> None:
    blocks = _BLOCK.findall(DOC.read_text())
    assert {name for name, _, _ in blocks} == set(EXAMPLES)
    for name, file_name, text in blocks:
        assert EXAMPLES[name]().files[file_name] == text, f"{name}: {file_name} in docs/exports.md is stale"
