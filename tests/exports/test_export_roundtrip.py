"""Round trip: the degrees, batch and recompute read back from each export equal the plan's."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

import pytest
from export_cases import (
    DEEPSPEED,
    LLAMA2_7B,
    LLAMA_405B,
    MEGATRON_CASES,
    RECIPE_405B,
    SERVING,
    TRAINING,
)
from export_readers import ReadBack, flags, read_deepspeed, read_megatron, read_torchtitan

from meshplan.exports import (
    SERVING_EXPORTERS,
    TRAINING_EXPORTERS,
    Engine,
    export_deepspeed,
    export_megatron,
    export_sglang,
    export_torchtitan,
    export_vllm,
)
from meshplan.exports.common import effective_zero
from meshplan.spec.conditions import Conditions, Fp8Recipe, StageSplit
from meshplan.spec.layout import Layout, Schedule, ZeroStage
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import PRECISIONS, Workload


def expected(layout: Layout, workload: Workload) -> ReadBack:
    zero = effective_zero(layout)
    return ReadBack(
        tp=layout.tp,
        pp=layout.pp,
        vpp=layout.vpp,
        cp=layout.cp,
        ep=layout.ep,
        dp_shard=layout.dp_shard,
        dp_replicate=layout.dp_replicate,
        zero=zero,
        recompute=layout.recompute,
        micro_batch=layout.micro_batch,
        global_batch=workload.global_batch,
        seq_len=workload.seq_len,
    )


@pytest.mark.parametrize(("name", "model", "layout", "workload"), TRAINING, ids=[c[0] for c in TRAINING])
def test_torchtitan_round_trip(name: str, model: ModelSpec, layout: Layout, workload: Workload) -> None:
    export = export_torchtitan(model, layout, workload)
    assert read_torchtitan(export, model) == expected(layout, workload)
    compile(export.files["meshplan_torchtitan.py"], "meshplan_torchtitan.py", "exec")


@pytest.mark.parametrize(("name", "model", "layout", "workload"), MEGATRON_CASES, ids=[c[0] for c in MEGATRON_CASES])
def test_megatron_round_trip(name: str, model: ModelSpec, layout: Layout, workload: Workload) -> None:
    export = export_megatron(model, layout, workload)
    assert read_megatron(export) == expected(layout, workload)


@pytest.mark.parametrize(("name", "model", "layout", "workload"), DEEPSPEED, ids=[c[0] for c in DEEPSPEED])
def test_deepspeed_round_trip(name: str, model: ModelSpec, layout: Layout, workload: Workload) -> None:
    export = export_deepspeed(model, layout, workload)
    assert read_deepspeed(export, seq_len=workload.seq_len) == expected(layout, workload)
    config = json.loads(export.files["ds_config.json"])
    assert config["train_batch_size"] == (
        config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * layout.dp
    )


def test_megatron_405b_split_counts_embedding_and_loss() -> None:
    export = export_megatron(LLAMA_405B, RECIPE_405B, TRAINING[0][3])
    args = flags(shlex.split(export.command))
    # 126 layers + embedding + loss = 128 = 16 ranks x 2 chunks x 4 layers.
    assert args["--account-for-embedding-in-pipeline-split"] is True
    assert args["--num-virtual-stages-per-pipeline-rank"] == "2"


def test_megatron_uneven_layout_string_covers_every_layer() -> None:
    _name, model, layout, workload = TRAINING[4]
    layout_text = str(
        flags(shlex.split(export_megatron(model, layout, workload).command))["--pipeline-model-parallel-layout"]
    )
    stages = layout_text.split("|")
    assert len(stages) == layout.pp * layout.vpp
    assert stages[0].startswith("E") and stages[-1].endswith("L")
    assert sum(int(stage.strip("EL").removeprefix("t*")) for stage in stages) == model.num_layers


def test_megatron_stated_stage_layers() -> None:
    """Stated first/last stage layers: Megatron's own flags where every count divides into the chunks, else the
    explicit layout, written by hand here: pp 4 x vpp 2, 5 + 9 + 9 + 9 layers, rank 0's 5 as 2 + 3 (short chunk
    first on the first half of the ranks), rank 1's 9 as 4 + 5, ranks 2 and 3 as 5 + 4, listed chunk-major."""
    model = replace(LLAMA2_7B, num_layers=32)
    split = StageSplit(first=6, last=10)
    layout = Layout(pp=4, dp_replicate=2)
    workload = Workload(seq_len=4096, global_batch=8, conditions=Conditions(stage_split=split))
    args = flags(shlex.split(export_megatron(model, layout, workload).command))
    assert (args["--decoder-first-pipeline-num-layers"], args["--decoder-last-pipeline-num-layers"]) == ("6", "10")
    assert "--pipeline-model-parallel-layout" not in args
    layout = Layout(pp=4, vpp=2, dp_replicate=2, schedule=Schedule.INTERLEAVED)
    workload = replace(workload, conditions=Conditions(stage_split=StageSplit(first=5, last=9)))
    args = flags(shlex.split(export_megatron(model, layout, workload).command))
    assert args["--pipeline-model-parallel-layout"] == "Et*2|t*4|t*5|t*5|t*3|t*5|t*4|t*4L"
    assert "--decoder-first-pipeline-num-layers" not in args
    with pytest.raises(ValueError, match="first and last stage"):
        export_torchtitan(model, Layout(pp=4, dp_shard=2, zero=ZeroStage.GRADIENTS), workload)


def test_megatron_packed_documents_reset_the_mask_at_each_document() -> None:
    """--doc-tokens: Megatron's dataset resets position ids and the attention mask after each end of document."""
    model = replace(LLAMA2_7B, num_layers=32)
    layout = Layout(dp_shard=8, zero=ZeroStage.OPTIMIZER)
    work = Workload(seq_len=4096, global_batch=8)
    plain = shlex.split(export_megatron(model, layout, work).command)
    packed = shlex.split(export_megatron(model, layout, replace(work, conditions=Conditions(doc_tokens=512))).command)
    assert "--reset-attention-mask" not in plain and "--reset-position-ids" not in plain
    assert "--reset-attention-mask" in packed and "--reset-position-ids" in packed


def test_megatron_fp8_recipe() -> None:
    """A stated FP8 recipe becomes --fp8-recipe; rowwise and FSDP's FP8 all-gather have no Megatron flag."""
    model = replace(LLAMA2_7B, num_layers=32)
    layout = Layout(dp_shard=8, zero=ZeroStage.OPTIMIZER)
    fp8 = PRECISIONS["fp8"]
    work = Workload(seq_len=4096, global_batch=8, precision=fp8, conditions=Conditions(fp8_recipe=Fp8Recipe.DELAYED))
    assert flags(shlex.split(export_megatron(model, layout, work).command))["--fp8-recipe"] == "delayed"
    mx = replace(work, conditions=Conditions(fp8_recipe=Fp8Recipe.MXFP8))
    assert flags(shlex.split(export_megatron(model, layout, mx).command))["--fp8-recipe"] == "mxfp8"
    for conditions in (
        Conditions(fp8_recipe=Fp8Recipe.ROWWISE),
        Conditions(fp8_recipe=Fp8Recipe.TENSORWISE, fp8_all_gather=True),
    ):
        with pytest.raises(ValueError, match="megatron cannot"):
            export_megatron(model, layout, replace(work, conditions=conditions))


def test_predictions_become_comments() -> None:
    predicted = {"step_time_s": 7.25, "mfu": 0.41, "memory_bytes_per_gpu": 6.1e10}
    _name, model, layout, workload = TRAINING[0]
    for engine in (Engine.TORCHTITAN, Engine.MEGATRON):
        export = TRAINING_EXPORTERS[engine](model, layout, workload, predicted=predicted)
        for text in export.files.values():
            assert "#   step_time_s = 7.25" in text and "#   mfu = 0.41" in text
    ds = export_deepspeed(LLAMA2_7B, DEEPSPEED[0][2], DEEPSPEED[0][3], predicted=predicted)
    assert "#   memory_bytes_per_gpu = 6.1e+10" in ds.files["train_deepspeed.sh"]
    json.loads(ds.files["ds_config.json"])  # JSON has no comments: the numbers live in the launcher


def test_precision_mapping() -> None:
    _name, model, layout, _workload = TRAINING[2]
    fp8 = Workload(seq_len=8192, global_batch=256, precision=PRECISIONS["fp8"])
    megatron = flags(shlex.split(export_megatron(model, layout, fp8).command))
    assert megatron["--bf16"] is True and megatron["--fp8-format"] == "hybrid"
    assert "--main-grads-dtype" in megatron  # the fp8 policy keeps bf16 gradients
    titan = export_torchtitan(model, layout, fp8).files["meshplan_torchtitan.py"]
    assert "Float8LinearConverter" in titan
    bf16_405b = export_torchtitan(LLAMA_405B, RECIPE_405B, TRAINING[0][3]).files["meshplan_torchtitan.py"]
    assert "config.model_spec = model_registry('405B')" in bf16_405b  # the recipe's float8 is dropped
    ds = json.loads(export_deepspeed(LLAMA2_7B, DEEPSPEED[2][2], DEEPSPEED[2][3]).files["ds_config.json"])
    assert ds["bf16"] == {"enabled": True} and "data_types" not in ds


def test_vllm_round_trip() -> None:
    export = export_vllm(replace(SERVING, quantization="fp8"))
    tokens = shlex.split(export.command)
    assert tokens[:3] == ["vllm", "serve", SERVING.model_path]
    args = flags(tokens)
    assert (args["--tensor-parallel-size"], args["--pipeline-parallel-size"], args["--data-parallel-size"]) == (
        "8",
        "1",
        "1",
    )
    assert (args["--max-model-len"], args["--gpu-memory-utilization"], args["--max-num-seqs"]) == (
        "32768",
        "0.9",
        "128",
    )
    assert (args["--kv-cache-dtype"], args["--quantization"]) == ("fp8", "fp8")
    assert "--enable-expert-parallel" not in args
    assert "--enable-expert-parallel" in flags(shlex.split(export_vllm(replace(SERVING, ep=8)).command))


def test_sglang_round_trip() -> None:
    export = export_sglang(replace(SERVING, dp=2, ep=4))
    args = flags(shlex.split(export.command))
    assert (args["--tp-size"], args["--pp-size"], args["--dp-size"], args["--ep-size"]) == ("8", "1", "2", "4")
    assert args["--moe-dp-size"] == "2"  # SGLang: ep_size * moe_dp_size == tp_size
    assert (args["--context-length"], args["--mem-fraction-static"], args["--max-running-requests"]) == (
        "32768",
        "0.9",
        "128",
    )
    assert args["--kv-cache-dtype"] == "fp8_e4m3"


def test_registries_cover_every_engine() -> None:
    assert set(TRAINING_EXPORTERS) | set(SERVING_EXPORTERS) == set(Engine)
    for engine, exporter in SERVING_EXPORTERS.items():
        export = exporter(SERVING)
        assert export.engine is engine and export.files and export.command
