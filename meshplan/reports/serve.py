"""``meshplan serve``: latency and throughput of one serving layout under load."""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, fields
from functools import cache
from importlib import resources
from typing import Any

from meshplan import io
from meshplan.core.serving.bill import QUANT_GROUP, MemoryFraction, fewest_weight_split
from meshplan.core.serving.disagg import Pools, disaggregated_point
from meshplan.core.serving.load import LoadPoint, Requests, load_point
from meshplan.core.serving.offline import offline_run
from meshplan.core.serving.phases import pipeline_factor
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
from meshplan.reports.cost import serve_cost
from meshplan.reports.inputs import choice
from meshplan.spec.cluster import GPU
from meshplan.spec.model import ModelSpec
from meshplan.units import DType

ENGINES = ("trtllm", "vllm", "sglang", "gpt-fast")
DEFAULT_ENGINE = "trtllm"


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
    return ServeCalibration(engine=engine, **{k: v for k, v in data.items() if k != "engine"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Setup:
    """A resolved serving question: model, hardware, replica layout and how many replicas."""

    model: ModelSpec
    hw: Hardware
    layout: ServeLayout
    replicas: int
    shape: ReplicaShape


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
    weights_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    quant: str | None = None,
    quant_group: int = QUANT_GROUP,
    engine: str = DEFAULT_ENGINE,
    context: int,
    gpu_memory_utilization: float | None = None,
    max_num_tokens: int | None = None,
    cuda_graph_padding: bool = False,
) -> Setup:
    """Check and resolve the inputs: TP defaults to what the replicas leave (within one scale-up domain),
    replicas to what TP x PP leaves."""
    spec = io.load_model(model) if isinstance(model, str) else model
    gpu_spec = io.load_gpu(gpu)
    tp, replicas = _degrees(gpus, tp=tp, pp=pp, replicas=replicas, domain=gpu_spec.scale_up_domain)
    _check_experts(spec, tp=tp, ep=ep, dp_attention=dp_attention)
    w, kv, q = _dtypes(gpu_spec, weights_dtype=weights_dtype, kv_dtype=kv_dtype, quant=quant)
    layout = ServeLayout(
        tp=tp, pp=pp, ep=ep, dp_attention=dp_attention, weights_dtype=w, kv_dtype=kv, quant=q, quant_group=quant_group
    )
    cal = calibration(engine, gpu_spec.name)
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
    hw = Hardware(
        gpu=gpu_spec,
        scale_up=io.load_link(gpu_spec.scale_up_link),
        scale_out=io.load_link(gpu_spec.scale_out_link),
        cal=cal,
    )
    shape = replica_shape(spec, hw, layout, context=context)
    return Setup(model=spec, hw=hw, layout=layout, replicas=replicas, shape=shape)


def _degrees(gpus: int, *, tp: int | None, pp: int, replicas: int | None, domain: int) -> tuple[int, int]:
    """(tp, replicas): TP left unset fills what the replicas leave, up to one scale-up domain."""
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    if pp > gpus:
        raise ValueError(f"pp={pp} exceeds gpus={gpus}")
    if tp is None:
        room = max(gpus // (pp * (replicas or 1)), 1)
        tp = room if replicas else max(d for d in range(1, min(room, domain) + 1) if room % d == 0)
    if tp < 1 or gpus % (tp * pp):
        raise ValueError(f"tp x pp = {tp} x {pp} must divide gpus = {gpus}")
    replicas = replicas if replicas is not None else gpus // (tp * pp)
    if replicas * tp * pp != gpus:
        raise ValueError(f"replicas x tp x pp = {replicas} x {tp} x {pp} must equal gpus = {gpus}")
    return tp, replicas


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
    if w is DType.FP4 and DType.FP4 not in gpu.peak_flops:
        raise ValueError(f"fp4 weights need fp4 tensor cores (Blackwell); {gpu.name} has none")
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


def _seconds(x: float | None) -> float | None:
    return None if x is None or math.isinf(x) else x


def point_dict(setup: Setup, req: Requests, pt: LoadPoint) -> dict[str, Any]:
    """The JSON of one load point (replica figures scaled to the fleet where the key says total)."""
    lay, gpus_per_replica = setup.layout, setup.layout.gpus_per_replica
    per_gpu = pt.output_tokens_per_s / gpus_per_replica
    breakdown = {k: float(v) * pipeline_factor(setup.hw, lay) for k, v in pt.step.breakdown().items()}
    return {
        "ttft_s_p50": _seconds(pt.ttft_s_p50),
        "ttft_s_p99": _seconds(pt.ttft_s_p99),
        "ttft_s_unloaded": pt.ttft_unloaded_s,
        "queue_s_p50": _seconds(pt.queue_s_p50),
        "queue_s_p99": _seconds(pt.queue_s_p99),
        "tpot_s": pt.tpot_s,
        "itl_s": pt.tpot_s,
        "tokens_per_s_per_gpu": per_gpu,
        "tokens_per_s_per_user": 1.0 / pt.tpot_s,
        "tokens_per_s_total": pt.output_tokens_per_s * setup.replicas,
        "requests_per_s_total": pt.requests_per_s * setup.replicas,
        "batch_per_replica": pt.batch,
        "batch_limit": pt.limit.value,
        "batch_cap_per_replica": pt.capacity.sequences,
        "kv_sequences_per_replica": pt.capacity.kv_sequences,
        "saturated": pt.saturated,
        "knee_batch_per_replica": pt.knee_batch,
        "max_tokens_per_s_per_gpu": pt.max_output_tokens_per_s / gpus_per_replica,
        "step_s": breakdown,
    }


def _check_weights_fit(setup: Setup) -> None:
    """Refuse, naming the weights, a replica whose weights alone leave no room in what the engine takes of HBM
    (the KV cache is not to blame there), with the fewest GPUs a replica needs to hold them."""
    bill, lay = setup.shape.bill, setup.layout
    room = bill.usable_bytes - bill.activations_bytes - bill.runtime_reserve_bytes
    if bill.weights_bytes < room:
        return
    fewest = fewest_weight_split(setup.model, lay.weights_dtype, room)
    hint = (
        f"a replica needs {fewest.gpus} GPUs or more to hold them (e.g. --tp {fewest.tp} --pp {fewest.pp})"
        if fewest is not None
        else "no split of the model holds them on this GPU"
    )
    raise ValueError(
        f"the weights alone are {bill.weights_bytes / 1e9:.1f} GB per GPU at tp={lay.tp} pp={lay.pp}, "
        f"{bill.weights_bytes / bill.hbm_bytes:.1f}x the {bill.hbm_bytes / 1e9:.1f} GB of HBM "
        f"({room / 1e9:.1f} GB left beside activations and the runtime): {hint}"
    )


def serve_report(
    model: ModelSpec | str,
    *,
    gpu: str,
    gpus: int,
    input_len: int,
    output_len: int,
    concurrency: float | None = None,
    rate: float | None = None,
    tp: int | None = None,
    pp: int = 1,
    ep: int = 1,
    dp_attention: bool = False,
    replicas: int | None = None,
    weights_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    quant: str | None = None,
    engine: str = DEFAULT_ENGINE,
    max_batch: int | None = None,
    max_num_tokens: int | None = None,
    num_requests: int | None = None,
    cuda_graph_padding: bool = False,
    gpu_memory_utilization: float | None = None,
    disaggregate: str | None = None,
    price_per_gpu_hour: float | None = None,
) -> dict[str, Any]:
    """``meshplan serve``: TTFT, TPOT, throughput per GPU and per user, and where a step's time goes.

    ``disaggregate`` = "P:D" splits the GPUs into a prefill pool of P and a decode pool of D, each made of
    replicas of the given layout; ``price_per_gpu_hour`` adds the cost per million output tokens."""
    setup = resolve(
        model,
        gpu=gpu,
        gpus=gpus,
        tp=tp,
        pp=pp,
        ep=ep,
        dp_attention=dp_attention,
        replicas=replicas,
        weights_dtype=weights_dtype,
        kv_dtype=kv_dtype,
        quant=quant,
        engine=engine,
        context=input_len + output_len,
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_tokens=max_num_tokens,
        cuda_graph_padding=cuda_graph_padding,
    )
    if num_requests is not None and concurrency is None and rate is None:
        concurrency = float(num_requests)  # all of them queued at once
    if (concurrency is None) == (rate is None):
        raise ValueError("give exactly one of --concurrency and --rate")
    if disaggregate is not None and replicas is not None:
        raise ValueError("--disaggregate P:D sets the replicas of both pools; drop --replicas")
    _check_weights_fit(setup)
    head = _head(setup, engine, input_len, output_len, concurrency, rate)
    # colocated: the load is split evenly over the replicas; disaggregated: the pools share the fleet's load
    share = 1 if disaggregate is not None else setup.replicas
    req = Requests(
        input_len=input_len,
        output_len=output_len,
        max_batch=max_batch,
        concurrency=None if concurrency is None else concurrency / share,
        rate_per_s=None if rate is None else rate / share,
    )
    moe = setup.model.moe is not None
    if disaggregate is not None:
        if num_requests is not None:
            raise ValueError("--num-requests times one colocated layout; drop --disaggregate")
        out = head | _disaggregated(setup, req, disaggregate)
        return out | serving_band(out, moe=moe) | serve_cost(out, price_per_gpu_hour)
    pt = load_point(setup.model, setup.shape, setup.hw, setup.layout, req)
    out = head | point_dict(setup, req, pt) | {"calibration_source": setup.hw.cal.source}
    if num_requests is not None:
        out["offline"] = offline_dict(setup, req, pt, num_requests=num_requests)
    return out | serving_band(out, moe=moe) | serve_cost(out, price_per_gpu_hour)


def serving_band(point: dict[str, Any], *, moe: bool) -> dict[str, Any]:
    """P10-P90 of TPOT, unloaded TTFT and tokens/s per GPU: each figure times the P10 and P90 of measured over
    predicted time on the published serving measurements of its kind, held out by source
    (catalog/serving/held_out.toml): decode for TPOT, prefill for TTFT, offline throughput (dense or MoE) for
    tokens/s."""
    band = io.serving_held_out_band()
    kind = "throughput_moe" if moe else "throughput_dense"
    out: dict[str, Any] = {}
    for key, cls in (("tpot_s", "decode"), ("ttft_s_unloaded", "prefill")):
        out |= {f"{key}_{q}": point[key] * band[f"{cls}_time_ratio_{q}"] for q in ("p10", "p90")}
    rate = point["tokens_per_s_per_gpu"]
    out["tokens_per_s_per_gpu_p10"] = rate / band[f"{kind}_time_ratio_p90"]  # the slow end of the rate
    out["tokens_per_s_per_gpu_p90"] = rate / band[f"{kind}_time_ratio_p10"]
    n = {cls: int(band[f"{cls}_runs"]) for cls in ("decode", "prefill", kind)}
    out["uncertainty"] = (
        f"P10-P90 of measured over predicted on published serving measurements, each predicted with the "
        f"correction fitted without its source: TPOT from {n['decode']} decode runs, unloaded TTFT from "
        f"{n['prefill']} prefill runs, tokens/s per GPU from {n[kind]} offline {'MoE' if moe else 'dense'} "
        "throughput runs at the engine's own batch"
    )
    return out


def serving_band_text(*, moe: bool) -> str:
    """The serving band as factors on the model's figures, for a ranking of many plans (``serve-plan``)."""
    band = io.serving_held_out_band()
    kind = "throughput_moe" if moe else "throughput_dense"

    def factors(cls: str, *, rate: bool = False) -> str:
        lo, hi = band[f"{cls}_time_ratio_p10"], band[f"{cls}_time_ratio_p90"]
        return f"x{1 / hi:.2f}-{1 / lo:.2f}" if rate else f"x{lo:.2f}-{hi:.2f}"

    return (
        f"measured over predicted on published serving measurements held out by source, P10-P90: TPOT "
        f"{factors('decode')} ({int(band['decode_runs'])} decode runs), TTFT unloaded {factors('prefill')} "
        f"({int(band['prefill_runs'])} prefill runs), tokens/s per GPU {factors(kind, rate=True)} "
        f"({int(band[f'{kind}_runs'])} offline {'MoE' if moe else 'dense'} throughput runs): a plan within those "
        "factors of a target may miss it"
    )


def offline_dict(setup: Setup, req: Requests, pt: LoadPoint, *, num_requests: int) -> dict[str, Any]:
    """An offline run of ``num_requests`` requests split evenly over the replicas, each holding the load point's
    batch cap (core/serving/offline.py)."""
    per_replica = max(math.ceil(num_requests / setup.replicas), 1)
    run = offline_run(
        setup.model,
        setup.shape,
        setup.hw,
        setup.layout,
        input_len=req.input_len,
        output_len=req.output_len,
        num_requests=per_replica,
        max_sequences=max(min(pt.capacity.sequences, math.ceil(req.concurrency or per_replica), per_replica), 1),
    )
    return {
        "num_requests": num_requests,
        "steps": run.steps,
        "run_s": run.run_s,
        "tokens_per_s_per_gpu": run.output_tokens_per_s / setup.layout.gpus_per_replica,
        "tokens_per_s_total": run.output_tokens_per_s * setup.replicas,
        "mean_batch_per_replica": run.mean_batch,
        "decode_only_share": run.decode_only_share,
    }


def _head(
    setup: Setup, engine: str, input_len: int, output_len: int, concurrency: float | None, rate: float | None
) -> dict[str, Any]:
    lay = setup.layout
    return {
        "model": setup.model.name,
        "gpu": setup.hw.gpu.name,
        "gpus": setup.replicas * lay.gpus_per_replica,
        "engine": engine,
        "layout": {
            "tp": lay.tp,
            "pp": lay.pp,
            "ep": lay.ep,
            "dp_attention": lay.dp_attention,
            "replicas": setup.replicas,
        },
        "weights_dtype": lay.weights_dtype.value,
        "kv_dtype": lay.kv_dtype.value,
        "quant": lay.quant.value,
        "input_len": input_len,
        "output_len": output_len,
        "concurrency_total": concurrency,
        "rate_per_s_total": rate,
        **memory_dict(setup),
    }


def memory_dict(setup: Setup) -> dict[str, Any]:
    """One GPU's serving bill as the engine sizes it: the terms sum to the device's HBM."""
    bill, cal = setup.shape.bill, setup.hw.cal
    return {
        "weights_bytes_per_gpu": bill.weights_bytes,
        "kv_bytes_per_token_per_gpu": setup.shape.kv_bytes_per_token,
        "activations_bytes_per_gpu": bill.activations_bytes,
        "runtime_reserve_bytes_per_gpu": bill.runtime_reserve_bytes,
        "engine_headroom_bytes_per_gpu": bill.headroom_bytes,
        "kv_budget_bytes_per_gpu": setup.shape.kv_budget_bytes,
        "memory_fraction": cal.memory_fraction,
        "memory_fraction_of": cal.memory_fraction_of.value,
    }


def _pools(text: str, *, gpus: int, per_replica: int) -> Pools:
    try:
        p, d = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"--disaggregate takes P:D, prefill and decode GPUs (e.g. 8:24), got {text!r}") from None
    if p + d != gpus or p < 1 or d < 1:
        raise ValueError(f"--disaggregate {text}: the pools must split the {gpus} GPUs (P + D = {gpus}, both >= 1)")
    if p % per_replica or d % per_replica:
        raise ValueError(f"--disaggregate {text}: each pool must be whole replicas of {per_replica} GPUs")
    return Pools(prefill_replicas=p // per_replica, decode_replicas=d // per_replica)


def _disaggregated(setup: Setup, req: Requests, text: str) -> dict[str, Any]:
    lay, g = setup.layout, setup.layout.gpus_per_replica
    pools = _pools(text, gpus=setup.replicas * g, per_replica=g)
    pt = disaggregated_point(setup.model, setup.shape, setup.hw, lay, req, pools)
    gpus = setup.replicas * g
    return {
        "ttft_s_p50": _seconds(pt.ttft_s_p50),
        "ttft_s_p99": _seconds(pt.ttft_s_p99),
        "ttft_s_unloaded": pt.prefill_s + pt.kv_transfer_s + pt.tpot_s / 2,
        "queue_s_p50": _seconds(pt.queue_s_p50),
        "queue_s_p99": _seconds(pt.queue_s_p99),
        "tpot_s": pt.tpot_s,
        "itl_s": pt.tpot_s,
        "tokens_per_s_per_gpu": pt.output_tokens_per_s / gpus,
        "tokens_per_s_per_user": 1.0 / pt.tpot_s,
        "tokens_per_s_total": pt.output_tokens_per_s,
        "requests_per_s_total": pt.requests_per_s,
        "batch_per_replica": pt.batch,
        "batch_limit": pt.limit.value,
        "batch_cap_per_replica": pt.cap,
        "saturated": pt.saturated,
        "step_s": {k: float(v) * pipeline_factor(setup.hw, lay) for k, v in pt.step.breakdown().items()},
        "disaggregated": {
            "prefill_gpus": pools.prefill_replicas * g,
            "decode_gpus": pools.decode_replicas * g,
            "prefill_s": pt.prefill_s,
            "kv_transfer_s": pt.kv_transfer_s,
            "prefill_requests_per_s_max": pt.prefill_requests_per_s_max,
            "decode_requests_per_s_max": pt.decode_requests_per_s_max,
            "bottleneck": pt.bottleneck,
        },
        "calibration_source": setup.hw.cal.source,
    }
