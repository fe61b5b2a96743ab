"""A serving question resolved: the model, the GPU and its links, the engine's constants with the user's overrides
and defaults, the replica layout and its shape (``meshplan serve``, ``serve-plan`` and ``validate --serving``)."""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, fields
from functools import cache
from importlib import resources
from typing import Any

from meshplan import io
from meshplan.core.placement import domains_touched
from meshplan.core.serving.bill import MemoryFraction
from meshplan.core.serving.shape import (
    AllReduceKernel,
    Hardware,
    Quant,
    ReplicaShape,
    ServeCalibration,
    ServeLayout,
    default_quant,
    kv_dtype_bytes,
    replica_shape,
)
from meshplan.core.time.host import Launch
from meshplan.reports.inputs import choice, scale_up_switched
from meshplan.spec.cluster import GPU, Link
from meshplan.spec.conditions import CapacityScheduler
from meshplan.spec.model import ModelSpec
from meshplan.units import DType

DEFAULT_ENGINE = "trtllm"
"""The engine whose constants a question that states none is predicted with."""
ENGINE_SOURCES = ("flag", "default")


def stated_engine(engine: str | None) -> tuple[str, str]:
    """(the engine predicted, where it comes from): the one given (``flag``), else TensorRT-LLM's constants
    (``default``). A question that states no engine has said nothing of the engine that will run: its band is
    widened as for an engine no published row ran (reports/serve_band.py)."""
    return (DEFAULT_ENGINE, "default") if engine is None else (engine, "flag")


@cache
def _engines() -> dict[str, Any]:
    text = (resources.files("meshplan") / "catalog" / "serving" / "engines.toml").read_text(encoding="utf-8")
    return dict(tomllib.loads(text)["engine"])


def calibration(engine: str, gpu: str) -> ServeCalibration:
    """The engine family's constants, with the GPU kind's overrides."""
    table = _engines()
    if engine not in table:
        raise ValueError(f"unknown engine {engine!r} (choose from {', '.join(table)})")
    data = {k: v for k, v in table[engine].items() if k != "gpu"}
    data |= table[engine].get("gpu", {}).get(gpu, {})
    known = {f.name for f in fields(ServeCalibration)}
    unknown = set(data) - known
    assert not unknown, f"engines.toml [{engine}]: unknown keys {sorted(unknown)}"
    data["memory_fraction_of"] = MemoryFraction(data["memory_fraction_of"])
    data["allreduce"] = AllReduceKernel(data["allreduce"])
    data["fp8_kv_with"] = tuple(data.get("fp8_kv_with", ()))
    if "launch" in data:
        data["launch"] = Launch(data["launch"])
    return ServeCalibration(engine=engine, **{k: v for k, v in data.items() if k != "engine"})


def fleet_node(gpu: GPU, node_size: int | None) -> tuple[GPU, Link]:
    """The catalog's GPU kind with the fleet's own node as its scale-up domain (``node_size``; None keeps the
    kind's), and the scale-up link, without a switch where that node's board has none
    (reports/inputs.py ``scale_up_switched``)."""
    scale_up = io.load_link(gpu.scale_up_link)
    if node_size is None:
        return gpu, scale_up
    if node_size < 1:
        raise ValueError(f"node size must be >= 1, got {node_size}")
    if not scale_up_switched(scale_up, domain=node_size, catalog_domain=gpu.scale_up_domain):
        scale_up = dataclasses.replace(scale_up, switched=False)
    return dataclasses.replace(gpu, scale_up_domain=node_size), scale_up


@dataclass(frozen=True, slots=True, kw_only=True)
class Setup:
    """A resolved serving question: model, hardware, replica layout and how many replicas."""

    model: ModelSpec
    hw: Hardware
    layout: ServeLayout
    replicas: int
    shape: ReplicaShape
    defaults: tuple[tuple[str, str, str], ...] = ()
    """(setting, value, where it comes from) of each engine default applied to a setting the user left out."""
    engine_source: str = "flag"
    """``flag``: the engine was stated; ``default``: none was, TensorRT-LLM's constants stand in (``stated_engine``)."""


def resolve(
    model: ModelSpec | str,
    *,
    gpu: str,
    gpus: int,
    tp: int | None = None,
    pp: int = 1,
    ep: int = 1,
    dp_attention: bool = False,
    replicas: int | None = None,
    weights_dtype: str | None = None,
    kv_dtype: str | None = None,
    quant: str | None = None,
    quant_group: int | None = None,
    engine: str | None = None,
    context: int,
    gpu_memory_utilization: float | None = None,
    max_num_tokens: int | None = None,
    cuda_graph_padding: bool = False,
    launch: str | None = None,
    capacity_scheduler: str | None = None,
    node_size: int | None = None,
) -> Setup:
    """Check and resolve the inputs: TP defaults to what the replicas leave (within one scale-up domain),
    replicas to what TP x PP leaves; the KV dtype and the int4 group size left out are the engine's
    (``engine_defaults``); the engine left out is TensorRT-LLM's (``stated_engine``); the weights left out are in the
    dtype the model is published in (``published_dtype``), which the engines load."""
    engine, engine_source = stated_engine(engine)
    spec = io.load_model(model) if isinstance(model, str) else model
    published = published_dtype(model).value if weights_dtype is None else None
    weights_dtype = weights_dtype if published is None else published
    gpu_spec, scale_up = fleet_node(io.load_gpu(gpu), node_size)
    tp, replicas = _degrees(gpus, tp=tp, pp=pp, replicas=replicas, domain=gpu_spec.scale_up_domain)
    _check_experts(spec, tp=tp, ep=ep, dp_attention=dp_attention)
    cal = calibration(engine, gpu_spec.name)
    if quant_group is not None and quant_group < 1:
        raise ValueError(f"--int4-group-size must be >= 1, got {quant_group}")
    kv_dtype, quant_group, defaults = engine_defaults(
        cal, weights_dtype=weights_dtype, kv_dtype=kv_dtype, quant_group=quant_group
    )
    if published not in (None, DType.BF16.value):  # a 16-bit default says nothing; a quantized release does
        defaults += (("weights_dtype", published, f"the dtype {spec.name} is published in"),)
    w, kv, q = _dtypes(gpu_spec, weights_dtype=weights_dtype, kv_dtype=kv_dtype, quant=quant)
    if quant is None and q is not Quant.NONE:
        why = "the GPU's tensor cores run it" if q is Quant.WEIGHT_ACTIVATION else "no tensor cores run it"
        defaults += (("quant", q.value, f"{w.value} weights: {why}"),)
    layout = ServeLayout(
        tp=tp, pp=pp, ep=ep, dp_attention=dp_attention, weights_dtype=w, kv_dtype=kv, quant=q, quant_group=quant_group
    )
    if gpu_memory_utilization is not None:  # the engine's own knob, read as that engine reads it
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        cal = dataclasses.replace(cal, memory_fraction=gpu_memory_utilization)
    if max_num_tokens is not None:  # the run's own tokens-per-step cap (its prefill chunk and activations too)
        if max_num_tokens < 1:
            raise ValueError(f"max_num_tokens must be >= 1, got {max_num_tokens}")
        cal = dataclasses.replace(cal, max_num_tokens=max_num_tokens)
    if cuda_graph_padding:
        cal = dataclasses.replace(cal, cuda_graph_padding=True)
    if launch is not None:  # left out: the engine's own (replayed CUDA graphs, but for vllm-0.2's op by op)
        cal = dataclasses.replace(cal, launch=Launch(launch))
    if cuda_graph_padding and cal.launch is not Launch.CUDAGRAPH:
        fix = f"drop it or --launch {launch}" if launch is not None else "drop it or add --launch cudagraph"
        raise ValueError(f"--cuda-graph-padding pads replayed CUDA graphs, and {engine} launches op by op here: {fix}")
    cal = admitted(cal, engine, capacity_scheduler)
    if gpu_memory_utilization is None:
        of = cal.memory_fraction_of.value
        defaults += (("gpu_memory_utilization", f"{cal.memory_fraction:g}", f"{engine}'s memory fraction (of {of})"),)
    if max_num_tokens is None:
        defaults += (("max_num_tokens", str(cal.max_num_tokens), f"{engine}'s tokens per step"),)
    if capacity_scheduler is None and engine == "trtllm":
        why = "trtllm's admission: KV room for the whole sequence"
        defaults += (("capacity_scheduler", CapacityScheduler.GUARANTEED_NO_EVICT.value, why),)
    hw = Hardware(gpu=gpu_spec, scale_up=scale_up, scale_out=io.load_link(gpu_spec.scale_out_link), cal=cal)
    shape = replica_shape(spec, hw, layout, context=context)
    return Setup(
        model=spec, hw=hw, layout=layout, replicas=replicas, shape=shape, defaults=defaults, engine_source=engine_source
    )


def admitted(cal: ServeCalibration, engine: str, capacity_scheduler: str | None) -> ServeCalibration:
    """The engine's calibration admitting requests as TensorRT-LLM's ``capacity_scheduler`` says (left out: as the
    engine does)."""
    if capacity_scheduler is None:
        return cal
    return dataclasses.replace(cal, reserve_full_sequence=reserves_full_sequence(engine, capacity_scheduler))


def reserves_full_sequence(engine: str, policy: str) -> bool:
    """Whether admission reserves a request's whole sequence under TensorRT-LLM's capacity scheduler ``policy``
    (GUARANTEED_NO_EVICT) or only the cache it holds as it grows (MAX_UTILIZATION, which pauses requests when the
    cache runs out); the policy is TensorRT-LLM's alone (the paging engines always grow)."""
    if engine != "trtllm":
        raise ValueError(
            f"--capacity-scheduler is TensorRT-LLM's scheduler policy; {engine} admits requests as their cache grows "
            "(drop it, or --engine trtllm)"
        )
    return CapacityScheduler(policy) is CapacityScheduler.GUARANTEED_NO_EVICT


def published_dtype(model: ModelSpec | str) -> DType:
    """The dtype a model's weights are published in, which an engine loads unless told otherwise: a catalog model's
    ``[meta] published_weights_dtype`` (FP8 for DeepSeek-V3, trained and released in FP8; FP4 for gpt-oss, its
    experts released in MXFP4), else bf16."""
    if isinstance(model, str) and model in io.list_models():
        return choice(DType, str(io.model_meta(model).get("published_weights_dtype", "bf16")), "weights dtype")
    return DType.BF16


def engine_defaults(
    cal: ServeCalibration, *, weights_dtype: str, kv_dtype: str | None, quant_group: int | None
) -> tuple[str, int, tuple[tuple[str, str, str], ...]]:
    """(KV dtype, int4 group size, the defaults applied): what the engine does with a setting the user leaves out
    (catalog/serving/engines.toml ``fp8_kv_with``, ``int4_group_size``, ``defaults_source``). TensorRT-LLM keeps an
    FP8 KV cache with FP8 or FP4 weights; vLLM, SGLang and gpt-fast keep the model's 16-bit dtype."""
    applied: list[tuple[str, str, str]] = []
    weights = weights_dtype.strip().lower()
    if kv_dtype is None:
        kv_dtype = "fp8" if weights in cal.fp8_kv_with else ("fp16" if weights == "fp16" else "bf16")
        why = f"{weights} weights" if weights in cal.fp8_kv_with else "the model's 16-bit dtype"
        applied.append(("kv_dtype", kv_dtype, f"{cal.engine}'s default KV cache with {why}"))
    if quant_group is None:
        quant_group = cal.int4_group_size
        if weights == "int4":
            applied.append(("int4_group_size", str(quant_group), f"{cal.engine}'s usual int4 checkpoints"))
    return kv_dtype, quant_group, tuple(applied)


def _degrees(gpus: int, *, tp: int | None, pp: int, replicas: int | None, domain: int) -> tuple[int, int]:
    """(tp, replicas): TP left unset fills what the replicas leave, up to one scale-up domain."""
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    if pp > gpus:
        raise ValueError(f"pp={pp} exceeds gpus={gpus}")
    if tp is None:
        room = max(gpus // (pp * (replicas or 1)), 1)
        fits = [d for d in range(1, min(room, domain) + 1) if room % d == 0 and not straddles(d, gpus, domain)]
        tp = room if replicas else max(fits)
    if tp < 1 or gpus % (tp * pp):
        raise ValueError(f"tp x pp = {tp} x {pp} must divide gpus = {gpus}")
    if straddles(tp, gpus, domain):
        raise ValueError(
            f"tp={tp} does not tile a node of {domain} GPUs: over {gpus} GPUs some TP groups would straddle two "
            f"nodes; give a tp that divides {domain}, or --node-size for the GPUs each node gives the job"
        )
    replicas = replicas if replicas is not None else gpus // (tp * pp)
    if replicas * tp * pp != gpus:
        raise ValueError(f"replicas x tp x pp = {replicas} x {tp} x {pp} must equal gpus = {gpus}")
    return tp, replicas


def straddles(tp: int, gpus: int, domain: int) -> bool:
    """Whether TP groups of ``tp`` GPUs, filled rank by rank into nodes of ``domain`` over a fleet of ``gpus``,
    put some group across two nodes: a group no wider than a node that does not divide it, on more than one node
    (core/placement.py prices the same straddle in training)."""
    return tp <= domain < gpus and bool(domains_touched(size=tp, stride=1, domain=domain) > 1)


def _check_experts(spec: ModelSpec, *, tp: int, ep: int, dp_attention: bool) -> None:
    if dp_attention and spec.moe is None:
        raise ValueError("--dp-attention needs a MoE model (dense layers would replicate every weight)")
    if dp_attention and ep != tp:
        raise ValueError(f"--dp-attention spreads the experts over the whole TP group: give --ep {tp} (got {ep})")
    if ep > 1 and spec.moe is None:
        raise ValueError(f"ep={ep} needs a MoE model; {spec.name} is dense")


def _dtypes(gpu: GPU, *, weights_dtype: str, kv_dtype: str, quant: str | None) -> tuple[DType, DType, Quant]:
    """Weight and KV dtypes and the quantization, refused where the GPU cannot run them."""
    w = choice(DType, weights_dtype, "weights dtype")
    kv = choice(DType, kv_dtype, "kv dtype")
    kv_dtype_bytes(kv)
    q = default_quant(w, gpu) if quant is None else _quant(quant)
    if q is Quant.WEIGHT_ACTIVATION and w not in gpu.peak_flops:
        raise ValueError(f"{gpu.name} has no {w} tensor cores: use weight-only quantization")
    if (q is Quant.NONE) != (w in (DType.BF16, DType.FP16)):
        raise ValueError(f"quantization {q} does not suit {w} weights")
    return w, kv, q


def _quant(text: str) -> Quant:
    try:
        return Quant(text.strip().lower())
    except ValueError:
        raise ValueError(f"unknown quantization {text!r} (choose from {', '.join(q.value for q in Quant)})") from None
