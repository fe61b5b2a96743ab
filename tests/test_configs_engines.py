"""The engines' own parsers, where installed, read the same files the same way meshplan's readers do: DeepSpeed's
DeepSpeedConfig the DeepSpeed examples, torchtitan 0.3.0's ConfigManager an exported config module, and
torchtitan 0.3.0's config dataclasses hold every key meshplan's torchtitan reader knows in their sections."""

from __future__ import annotations

import dataclasses
import importlib.util
import shlex
import sys
from pathlib import Path

import pytest

from meshplan.configs import read_config, read_config_text
from meshplan.configs.torchtitan import READ_SECTIONS
from meshplan.exports import export_torchtitan
from meshplan.io import load_model
from meshplan.reports.inputs import LayoutRequest, resolve_layout, resolve_workload

DATA = Path(__file__).parent / "data" / "configs"


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


class _DataParallelGroup:
    def __init__(self, size: int) -> None:
        self.size = size

    def get_data_parallel_world_size(self) -> int:
        return self.size


@needs_deepspeed
@pytest.mark.parametrize("name", ["deepspeed_llama_7b_single_node.json", "deepspeed_llama_70b_multi_node.json"])
def test_deepspeed_reads_the_example_as_meshplan_does(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import deepspeed.runtime.config as ds_config

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda: 0)
    read = read_config(DATA / name)
    ranks = read.values["gpus"]  # no AutoTP in these files: every GPU is a data-parallel rank
    config = ds_config.DeepSpeedConfig(str(DATA / name), mpu=_DataParallelGroup(ranks))
    assert config.train_batch_size == read.values["global_batch"]
    assert config.train_micro_batch_size_per_gpu == read.values["micro_batch"]
    assert config.gradient_accumulation_steps * config.train_micro_batch_size_per_gpu * ranks == config.train_batch_size
    assert config.zero_optimization_stage == read.values["zero"]
    assert config.bfloat16_config.enabled == (read.values["precision"] == "bf16")


@needs_torchtitan
def test_torchtitan_config_manager_agrees_with_the_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torchao", reason="torchtitan's recipes import torchao")
    from torchtitan.config import ConfigManager

    model = load_model("llama-3.1-70b")
    layout = resolve_layout(LayoutRequest(tp=8, pp=2, zero=3, micro_batch=1, recompute="full"), gpus=64)
    work = resolve_workload(layout=layout, seq=8192, global_batch=64, precision="fsdp2-bf16")
    export = export_torchtitan(model, layout, work)
    source = export.files["meshplan_torchtitan.py"]
    (tmp_path / "meshplan_torchtitan.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "meshplan_torchtitan", raising=False)
    config = ConfigManager().parse_args(shlex.split(export.command)[-4:])
    read = read_config_text(source, "meshplan_torchtitan.py")
    p = config.parallelism
    assert (p.tensor_parallel_degree, p.pipeline_parallel_degree) == (read.values["tp"], read.values["pp"])
    assert p.data_parallel_shard_degree == read.values["dp_shard"]
    assert p.pipeline_parallel_microbatch_size == read.values["micro_batch"]
    assert (config.training.seq_len, config.training.global_batch_size) == (
        read.values["seq"],
        read.values["global_batch"],
    )
    assert type(config.activation_checkpoint).__qualname__.startswith("FullAC") == (read.values["recompute"] == "full")


@needs_torchtitan
def test_torchtitan_030_sections_hold_the_readers_keys() -> None:
    """Every field of torchtitan 0.3.0's training, parallelism and compile dataclasses is a key the reader knows
    (so a 0.3.0 file is never refused for a key torchtitan accepts)."""
    from torchtitan.config import configs

    for section, cls in (
        ("training", configs.TrainingConfig),
        ("parallelism", configs.ParallelismConfig),
        ("compile", configs.CompileConfig),
    ):
        fields = {f.name for f in dataclasses.fields(cls)}
        assert fields <= READ_SECTIONS[section], (section, fields - READ_SECTIONS[section])
