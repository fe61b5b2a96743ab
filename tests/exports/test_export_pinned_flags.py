"""Every option an export writes is one the pinned engine version defines (export_pins.py says where each comes from).

These run everywhere; the engines themselves are not needed.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

from export_cases import DEEPSPEED, MEGATRON_CASES, SERVING, TRAINING
from export_pins import (
    DEEPSPEED_CHECKPOINTING_KEYS,
    DEEPSPEED_KEYS,
    DEEPSPEED_ZERO_KEYS,
    MEGATRON_CHOICES,
    MEGATRON_CP_COMM,
    MEGATRON_FLAGS,
    SGLANG_FLAGS,
    SGLANG_KV_CACHE_DTYPES,
    TORCH_PIPELINE_SCHEDULES,
    TORCHTITAN_PARALLELISM,
    TORCHTITAN_RECIPES,
    TORCHTITAN_TRAINING,
    VLLM_FLAGS,
    VLLM_KV_CACHE_DTYPES,
)
from export_readers import torchtitan_assignments

from meshplan.exports import (
    DisaggregatedPlan,
    deepspeed,
    export_deepspeed,
    export_megatron,
    export_sglang,
    export_sglang_disaggregated,
    export_torchtitan,
    export_vllm,
    export_vllm_disaggregated,
    sglang,
    torchtitan,
    vllm,
)


def _options(tokens: list[str]) -> list[str]:
    return [token for token in tokens if token.startswith("--")]


def test_megatron_flags_are_pinned() -> None:
    for _name, model, layout, workload in MEGATRON_CASES:
        for model_path in (None, "/models/hf"):
            tokens = shlex.split(export_megatron(model, layout, workload, model_path=model_path).command)
            args = tokens[tokens.index("pretrain_gpt.py") + 1 :]
            assert set(_options(args)) <= MEGATRON_FLAGS
            for flag, choices in MEGATRON_CHOICES.items():
                if flag in args:
                    assert args[args.index(flag) + 1] in choices, flag
            if "--cp-comm-type" in args:
                assert args[args.index("--cp-comm-type") + 1] in MEGATRON_CP_COMM


def test_torchtitan_fields_are_pinned() -> None:
    for _name, model, layout, workload in TRAINING:
        values = torchtitan_assignments(export_torchtitan(model, layout, workload).files["meshplan_torchtitan.py"])
        for name in values:
            section, _, field = name.partition(".")
            if section == "parallelism":
                assert field in TORCHTITAN_PARALLELISM, name
            elif section == "training":
                assert field in TORCHTITAN_TRAINING, name
        if "parallelism.pipeline_parallel_schedule" in values:
            assert values["parallelism.pipeline_parallel_schedule"] in TORCH_PIPELINE_SCHEDULES
        assert values.get("parallelism.fsdp_reshard_after_forward", "default") in {"default", "always", "never"}
    assert {(r.module, r.function) for r in torchtitan.RECIPES.values()} <= TORCHTITAN_RECIPES
    assert set(torchtitan.SCHEDULES.values()) <= TORCH_PIPELINE_SCHEDULES


def test_deepspeed_keys_are_pinned() -> None:
    for _name, model, layout, workload in DEEPSPEED:
        config = json.loads(export_deepspeed(model, layout, workload).files[deepspeed.CONFIG_FILE])
        assert set(config) <= DEEPSPEED_KEYS
        assert set(config["zero_optimization"]) <= DEEPSPEED_ZERO_KEYS
        assert set(config.get("activation_checkpointing", {})) <= DEEPSPEED_CHECKPOINTING_KEYS
        assert set(config.get("tensor_parallel", {})) <= {"autotp_size"}
        assert set(config.get("expert_parallel", {})) <= {"enabled", "autoep_size"}


def test_serving_flags_are_pinned() -> None:
    for ep in (1, 8):
        tokens = shlex.split(export_vllm(replace(SERVING, ep=ep, quantization="fp8")).command)
        assert set(_options(tokens)) <= VLLM_FLAGS
    tokens = shlex.split(export_sglang(replace(SERVING, ep=4, quantization="fp8")).command)
    assert set(_options(tokens)) <= SGLANG_FLAGS
    assert set(vllm.KV_CACHE_DTYPES.values()) <= VLLM_KV_CACHE_DTYPES
    assert set(sglang.KV_CACHE_DTYPES.values()) <= SGLANG_KV_CACHE_DTYPES
    assert {"fp8", "awq", "gptq", "compressed-tensors"} <= set(vllm.QUANTIZATION_METHODS)
    assert {"fp8", "awq", "gptq", "compressed-tensors", "w8a8_fp8"} <= set(sglang.QUANTIZATION_METHODS)


def test_disaggregated_pool_flags_are_pinned() -> None:
    pools = DisaggregatedPlan(prefill=replace(SERVING, dp=1), decode=replace(SERVING, dp=3))
    for exporter, pinned in ((export_vllm_disaggregated, VLLM_FLAGS), (export_sglang_disaggregated, SGLANG_FLAGS)):
        export = exporter(pools)
        for name, text in export.files.items():
            if "router" not in name:
                command = text.split("set -euo pipefail\n", 1)[1].replace("\\\n", " ")
                command = "\n".join(line for line in command.splitlines() if not line.startswith("export "))
                options = set(_options(shlex.split(command)))
                assert "--port" in options and options <= pinned, name
