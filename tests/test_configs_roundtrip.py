"""Round trip over random valid plans: ``meshplan export ENGINE`` then ``--from`` the file it wrote gives the same
request (the layout resolved from what was read equals the exported one; sequence, global batch and precision
too), for every engine with a reader. Plans the engine cannot express are left out (the export refuses them)."""

from __future__ import annotations

from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st

from meshplan.configs import read_config_text
from meshplan.exports import (
    ServingPlan,
    UnsupportedByEngine,
    export_deepspeed,
    export_megatron,
    export_sglang,
    export_torchtitan,
    export_trtllm,
    export_vllm,
)
from meshplan.io import load_model
from meshplan.reports.inputs import LayoutRequest, resolve_layout, resolve_workload
from meshplan.spec.layout import Layout
from meshplan.spec.requests import Group, group
from meshplan.units import DType

MODEL = load_model("llama-3.1-8b")
LAYOUT_NAMES = {f.name for f in group(Group.LAYOUT)}


@st.composite
def training_plans(draw: Any, engine: str) -> tuple[dict[str, Any], int, str]:
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = 1 if engine == "deepspeed" else draw(st.sampled_from([1, 2, 4]))
    cp = 1 if engine == "deepspeed" else draw(st.sampled_from([1, 1, 2]))
    dp = draw(st.sampled_from([1, 2, 4]))
    stages = {"torchtitan": [0, 2, 3], "megatron": [0, 1, 2, 3], "deepspeed": [0, 1, 2, 3]}[engine]
    zero = draw(st.sampled_from(stages)) if dp * cp > 1 else 0
    micro = draw(st.sampled_from([1, 2]))
    values = {
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "vpp": draw(st.sampled_from([1, 2])) if pp > 1 and engine == "megatron" else 1,
        "zero": zero,
        "sp": draw(st.booleans()) if tp > 1 and engine != "deepspeed" else False,
        "recompute": draw(st.sampled_from(["none", "full"] + (["selective"] if engine != "deepspeed" else []))),
        "micro_batch": micro,
        "cp_kind": "all-gather" if engine == "torchtitan" and cp > 1 else "ring",
    }
    if engine == "torchtitan" and tp > 1:
        values["sp"] = True  # torchtitan's enable_sequence_parallel, written whenever TP is
    seq = draw(st.sampled_from([2048, 4096, 8192]))
    batch = micro * dp * pp * draw(st.sampled_from([1, 2, 4]))
    precisions = {"torchtitan": ["fsdp2-bf16"], "megatron": ["bf16", "bf16-fp32-grads", "fp16"]}
    precision = draw(st.sampled_from(precisions.get(engine, ["bf16", "bf16-fp32-grads", "fp16"])))
    return values | {"seq": seq, "global_batch": batch, "precision": precision}, tp * pp * cp * dp, engine


def _specs(values: dict[str, Any], gpus: int) -> tuple[Layout, Any]:
    layout = resolve_layout(LayoutRequest(**{k: v for k, v in values.items() if k in LAYOUT_NAMES}), gpus=gpus)
    work = resolve_workload(
        layout=layout, seq=values["seq"], global_batch=values["global_batch"], precision=values["precision"]
    )
    return layout, work


EXPORTS = {
    "torchtitan": (export_torchtitan, "meshplan_torchtitan.py"),
    "megatron": (export_megatron, "train_megatron.sh"),
    "deepspeed": (export_deepspeed, "ds_config.json"),
}


def _round_trip(values: dict[str, Any], gpus: int, engine: str) -> None:
    layout, work = _specs(values, gpus)
    exporter, name = EXPORTS[engine]
    try:
        export = exporter(MODEL, layout, work)
    except UnsupportedByEngine:
        assume(False)
        return
    read = read_config_text(export.files[name], name)
    assert read.kind == engine
    got = dict(read.values)
    assert got.pop("stack") == {"torchtitan": "torchtitan", "megatron": "megatron-core"}.get(engine, "deepspeed")
    got_gpus = got.pop("gpus", gpus)
    assert got_gpus == gpus
    if engine != "deepspeed":
        assert read.model == "llama-3.1-8b"
    back = resolve_layout(LayoutRequest(**{k: v for k, v in got.items() if k in LAYOUT_NAMES}), gpus=got_gpus)
    assert back == layout
    assert got.get("seq", values["seq"]) == values["seq"]
    assert got.get("global_batch", values["micro_batch"] * layout.dp * layout.pp) == values["global_batch"]
    assert got["precision"] == values["precision"]


@given(training_plans("torchtitan"))
def test_torchtitan_export_reads_back(plan: tuple[dict[str, Any], int, str]) -> None:
    _round_trip(*plan)


@given(training_plans("megatron"))
def test_megatron_export_reads_back(plan: tuple[dict[str, Any], int, str]) -> None:
    _round_trip(*plan)


@given(training_plans("deepspeed"))
def test_deepspeed_export_reads_back(plan: tuple[dict[str, Any], int, str]) -> None:
    _round_trip(*plan)


@given(
    st.sampled_from(["vllm", "sglang"]),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([1, 2]),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([4096, 8192, 32768]),
    st.sampled_from([0.8, 0.9, 0.95]),
    st.sampled_from([16, 64, 256]),
    st.sampled_from([None, DType.FP8, DType.BF16]),
)
def test_serving_exports_read_back(
    engine: str, tp: int, pp: int, dp: int, context: int, share: float, seqs: int, kv: DType | None
) -> None:
    plan = ServingPlan(
        model_path="meta-llama/Llama-3.1-8B",
        tp=tp,
        pp=pp,
        dp=dp,
        max_model_len=context,
        gpu_memory_utilization=share,
        max_num_seqs=seqs,
        kv_cache_dtype=kv,
    )
    export = (export_vllm if engine == "vllm" else export_sglang)(plan)
    read = read_config_text(export.command, "launch.sh", engine)
    assert read.model == "llama-3.1-8b"
    expected = {
        "engine": engine,
        "tp": tp,
        "pp": pp,
        "replicas": dp,
        "context": context,
        "gpu_memory_utilization": share,
        "max_batch": seqs,
        "gpus": tp * pp * dp,
    }
    expected |= {"kv_dtype": {DType.FP8: "fp8", DType.BF16: "bf16"}[kv]} if kv is not None else {}
    expected |= {"ep": 1} if engine == "sglang" else {}
    assert dict(read.values) == expected


@given(
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([1, 2]),
    st.sampled_from([4096, 8192, 32768]),
    st.sampled_from([0.8, 0.9, 0.95]),
    st.sampled_from([16, 64, 256]),
)
def test_trtllm_export_reads_back(tp: int, pp: int, context: int, share: float, seqs: int) -> None:
    """One trtllm-serve process is one replica: the launch line reads back but for what its LLM-API YAML holds
    (the KV dtype, attention data parallelism), which the reader lists as a second file."""
    plan = ServingPlan(
        model_path="meta-llama/Llama-3.1-8B",
        tp=tp,
        pp=pp,
        dp=1,
        max_model_len=context,
        gpu_memory_utilization=share,
        max_num_seqs=seqs,
        kv_cache_dtype=DType.FP8,
    )
    read = read_config_text(export_trtllm(plan).command, "serve_trtllm.sh", "trtllm")
    assert read.model == "llama-3.1-8b"
    assert dict(read.values) == {
        "engine": "trtllm",
        "tp": tp,
        "pp": pp,
        "context": context,
        "gpu_memory_utilization": share,
        "max_batch": seqs,
        "gpus": tp * pp,
    }
    assert [u.key for u in read.unread if u.key == "--extra_llm_api_options"] == ["--extra_llm_api_options"]
