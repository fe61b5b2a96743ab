"""``meshplan serve``: latency and throughput of one serving layout under load."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from meshplan import io
from meshplan.core.serving.bill import fewest_weight_split
from meshplan.core.serving.disagg import Pools, disaggregated_point
from meshplan.core.serving.load import LoadPoint, Requests, load_point
from meshplan.core.serving.offline import offline_run
from meshplan.core.serving.phases import pipeline_factor
from meshplan.core.serving.static import static_batch
from meshplan.reports.cost import serve_cost
from meshplan.reports.serve_band import Band, band_family, band_for, few_moe
from meshplan.reports.serve_coverage import SMALL_MOE_DECODE_BATCH, coverage_warnings, small_moe_decode_warnings
from meshplan.reports.serve_load import finite_s, load_band, near_capacity, slower_machine
from meshplan.reports.serve_setup import DEFAULT_ENGINE as DEFAULT_ENGINE
from meshplan.reports.serve_setup import Setup as Setup
from meshplan.reports.serve_setup import calibration as calibration
from meshplan.reports.serve_setup import engine_defaults as engine_defaults
from meshplan.reports.serve_setup import resolve as resolve
from meshplan.reports.serve_spec import prefix_dict, spec_dict, speculation
from meshplan.spec.model import ModelSpec


def point_dict(setup: Setup, req: Requests, pt: LoadPoint) -> dict[str, Any]:
    """The JSON of one load point (replica figures scaled to the fleet where the key says total)."""
    lay, gpus_per_replica = setup.layout, setup.layout.gpus_per_replica
    per_gpu = pt.output_tokens_per_s / gpus_per_replica
    breakdown = {k: float(v) * pipeline_factor(setup.hw, lay) for k, v in pt.step.breakdown().items()}
    return {
        "ttft_s_p50": finite_s(pt.ttft_s_p50),
        "ttft_s_p99": finite_s(pt.ttft_s_p99),
        "ttft_s_mean": finite_s(pt.ttft_s_mean),
        "ttft_s_unloaded": pt.ttft_unloaded_s,
        "queue_s_p50": finite_s(pt.queue_s_p50),
        "queue_s_p99": finite_s(pt.queue_s_p99),
        "tpot_s": pt.tpot_s,
        "tpot_s_p50": pt.tpot_s_p50,
        "tpot_s_p99": pt.tpot_s_p99,
        "itl_s": pt.tpot_s,
        "itl_s_p99": pt.itl_s_p99,
        "tokens_per_s_per_gpu": per_gpu,
        "tokens_per_s_per_user": 1.0 / pt.tpot_s,
        "tokens_per_s_total": pt.output_tokens_per_s * setup.replicas,
        "requests_per_s_total": pt.requests_per_s * setup.replicas,
        "batch_per_replica": pt.batch,
        "batch_limit": pt.limit.value,
        "batch_cap_per_replica": pt.capacity.sequences,
        "batch_cap_limit": pt.capacity.limit.value,
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
    weights_dtype: str | None = None,
    kv_dtype: str | None = None,
    quant: str | None = None,
    int4_group_size: int | None = None,
    engine: str | None = None,
    max_batch: int | None = None,
    max_num_tokens: int | None = None,
    num_requests: int | None = None,
    batch: int | None = None,
    cuda_graph_padding: bool = False,
    launch: str | None = None,
    capacity_scheduler: str | None = None,
    gpu_memory_utilization: float | None = None,
    disaggregate: str | None = None,
    price_per_gpu_hour: float | None = None,
    speculative: str | None = None,
    spec_acceptance: float | None = None,
    draft_model: ModelSpec | str | None = None,
    prefix_hit_rate: float | None = None,
    node_size: int | None = None,
) -> dict[str, Any]:
    """``meshplan serve``: TTFT, TPOT, throughput per GPU and per user, and where a step's time goes.

    ``disaggregate`` = "P:D" splits the GPUs into a prefill pool of P and a decode pool of D, each made of
    replicas of the given layout. ``batch`` = N times a static batch of N prompts instead of a load
    (core/serving/static.py); ``kv_dtype`` and ``int4_group_size`` left out are the engine's, and the report lists
    every default it applied; ``price_per_gpu_hour`` adds the cost per million output tokens. ``speculative`` =
    "METHOD:K" drafts K tokens a step, accepted each with ``spec_acceptance`` (core/serving/speculative.py);
    ``prefix_hit_rate`` is the share of each prompt the prefix cache holds (the load model only); ``launch``
    "eager" or "compile" puts each forward under the host floor (core/serving/phases.py). ``node_size`` replaces the
    GPU's scale-up domain (a 4-GPU board of direct links: reports/inputs.py ``scale_up_switched``). ``engine`` left
    out is TensorRT-LLM's constants, ``engine_source`` "default", the band widened as for an unseen engine."""
    loads = {"--concurrency": concurrency, "--rate": rate, "--num-requests": num_requests, "--batch": batch}
    given = [flag for flag, value in loads.items() if value is not None]
    if batch is not None and len(given) > 1:
        raise ValueError(f"--batch is a load of its own (one static batch): drop {', '.join(given[:-1])}")
    if batch is not None and disaggregate is not None:
        raise ValueError("--batch times one static batch on colocated replicas; drop --disaggregate")
    for flag, value in (("--speculative", speculative), ("--prefix-hit-rate", prefix_hit_rate)):
        apart = [f for f, v in (("--batch", batch), ("--num-requests", num_requests), ("--disaggregate", disaggregate))
                 if v is not None]  # fmt: skip
        if value is not None and apart:
            raise ValueError(f"{flag} is modelled under --concurrency or --rate on colocated replicas; drop {apart[0]}")
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
        quant_group=int4_group_size,
        engine=engine,
        context=input_len + output_len,
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_tokens=max_num_tokens,
        cuda_graph_padding=cuda_graph_padding,
        launch=launch,
        capacity_scheduler=capacity_scheduler,
        node_size=node_size,
    )
    engine = setup.hw.cal.engine
    spec = speculation(
        setup, speculative, acceptance=spec_acceptance, draft_model=draft_model, context=input_len + output_len
    )
    if max_batch is None:
        cap = ("max_batch", str(setup.hw.cal.max_batch), f"{engine}'s cap on sequences per step")
        setup = dataclasses.replace(setup, defaults=(*setup.defaults, cap))
    head = _head(setup, engine, input_len, output_len, concurrency, rate)
    head["warnings"] = coverage_warnings(setup.model, setup.hw.gpu.name)
    if batch is not None:
        concurrency = float(batch)  # the batch cap and the knee beside the batch: those of N users
    if num_requests is not None and concurrency is None and rate is None:
        concurrency = float(num_requests)  # all of them queued at once
    if (concurrency is None) == (rate is None):
        raise ValueError("give exactly one load: --concurrency, --rate, --num-requests or --batch")
    if disaggregate is not None and replicas is not None:
        raise ValueError("--disaggregate P:D sets the replicas of both pools; drop --replicas")
    _check_weights_fit(setup)
    if num_requests is not None and head["concurrency_total"] is None and rate is None:
        head["concurrency_total"] = float(num_requests)
    # colocated: the load is split evenly over the replicas; disaggregated: the pools share the fleet's load
    share = 1 if disaggregate is not None else setup.replicas
    req = Requests(
        input_len=input_len,
        output_len=output_len,
        max_batch=max_batch,
        concurrency=None if concurrency is None else concurrency / share,
        rate_per_s=None if rate is None else rate / share,
        prefix_hit_rate=prefix_hit_rate or 0.0,
        speculation=spec,
    )
    if disaggregate is not None:
        if num_requests is not None:
            raise ValueError("--num-requests times one colocated layout; drop --disaggregate")
        out = head | _disaggregated(setup, req, disaggregate)
        return out | serving_band(out, setup) | serve_cost(out, price_per_gpu_hour)
    pt = load_point(setup.model, setup.shape, setup.hw, setup.layout, req)
    out = head | point_dict(setup, req, pt) | {"calibration_source": setup.hw.cal.source}
    slower = slower_machine(setup, req, pt)
    small = small_moe_decode_warnings(setup.model, batch_per_replica=pt.batch, engine=engine)
    out["warnings"] = [*out["warnings"], *near_capacity(pt, req, slower), *small]
    if spec is not None:
        out["speculative"] = spec_dict(setup, req, pt)
    if prefix_hit_rate is not None:
        out["prefix_cache"] = prefix_dict(req)
    if num_requests is not None:
        out["offline"] = offline_dict(setup, req, pt, num_requests=num_requests)
    if batch is not None:
        out |= static_dict(setup, req, pt, batch=batch, max_batch=max_batch)
    return out | serving_band(out, setup, slower=slower) | serve_cost(out, price_per_gpu_hour)


def serving_band(
    point: dict[str, Any], setup: Setup, *, slower: Callable[[float], LoadPoint] | None = None
) -> dict[str, Any]:
    """P10-P90 of TPOT, unloaded TTFT and tokens/s per GPU: each figure times the P10 and P90 of measured over
    predicted time on the published serving measurements of its kind, held out by source
    (catalog/serving/held_out.toml; reports/serve_band.py picks the engine family's band and widens it for what no
    row ran): decode for TPOT, prefill for TTFT, offline throughput (dense or MoE) for tokens/s. With the load
    point on a slower or faster machine (``slower``, a colocated load), the figures under load take the band of
    that machine (``load_band``): under Poisson arrivals near what a replica serves, a machine a few percent slower
    holds many more sequences, or cannot keep up, so these bands are not the figure times a factor; and an open
    loop serves at most the tokens that arrive."""
    band = io.serving_held_out_band()
    stated = setup.engine_source == "flag"
    engine = band_family(setup.hw.cal.engine, setup.hw.cal.launch.value)
    gpu, batch = setup.hw.gpu.name, point.get("batch_per_replica")
    bands = _bands(band, setup.model, engine=engine, gpu=gpu, stated=stated, batch=batch)
    kind = "throughput-moe" if setup.model.moe is not None else "throughput-dense"
    out: dict[str, Any] = {}
    for key, cls in (("tpot_s", "decode"), ("ttft_s_unloaded", "prefill")):
        b = bands[cls]
        out |= {f"{key}_p10": point[key] * b.lo, f"{key}_p90": point[key] * b.hi}
    if "static_batch" in point:  # the batch's TTFT is a prefill: the prefill class's band
        ttft, b = point["static_batch"]["ttft_s"], bands["prefill"]
        out["static_batch"] = point["static_batch"] | {"ttft_s_p10": ttft * b.lo, "ttft_s_p90": ttft * b.hi}
    rate = point["tokens_per_s_per_gpu"]
    out["tokens_per_s_per_gpu_p10"] = rate / bands[kind].hi  # the slow end of the rate
    out["tokens_per_s_per_gpu_p90"] = rate / bands[kind].lo
    if slower is not None:
        out["load_band"] = load_band(slower, bands)
        out["tpot_s_p10"], out["tpot_s_p90"] = out["load_band"]["tpot_s"]
        arriving = point["rate_per_s_total"]
        if arriving is not None:  # an open loop serves what arrives (as served here), at most what the machine can
            served = rate if not point["saturated"] else arriving * point["output_len"] / point["gpus"]
            most = point["max_tokens_per_s_per_gpu"]
            out["tokens_per_s_per_gpu_p10"] = min(rate, most / bands[kind].hi)
            out["tokens_per_s_per_gpu_p90"] = min(served, most / bands[kind].lo)
    out["band_sources"] = {
        "tpot": bands["decode"].sources,
        "ttft": bands["prefill"].sources,
        "tokens_per_s": bands[kind].sources,
    }
    out["band_widened"] = sorted({w for b in bands.values() for w in b.widened})
    out["uncertainty"] = (
        "P10-P90 of measured over predicted on published serving measurements, each predicted with the correction "
        f"fitted without its source, each source weighing the same, widened where few sources stand behind it: "
        f"TPOT from {bands['decode'].text()}; TTFT from {bands['prefill'].text()}; tokens/s per GPU "
        f"({'MoE' if kind == 'throughput-moe' else 'dense'} throughput) from {bands[kind].text()}"
    )
    return out


def _bands(
    band: dict[str, float], model: ModelSpec, *, engine: str, gpu: str, stated: bool = True, batch: float | None = None
) -> dict[str, Band]:
    """The band each metric class gives a question of ``engine`` (``stated`` or standing in) on ``gpu`` for
    ``model``, decoding ``batch`` sequences a step per replica: a MoE model at so few that its step is the engine
    release's (``SMALL_MOE_DECODE_BATCH`` or fewer) takes the published such steps' spread beside its decode and
    throughput bands (reports/serve_band.py, ``few_moe``)."""
    moe, mla = model.moe is not None, model.mla is not None
    kind = "throughput-moe" if moe else "throughput-dense"
    out = {
        c: band_for(band, c, engine=engine, gpu=gpu, moe=moe, mla=mla, stated=stated)
        for c in ("decode", "prefill", kind)
    }
    if moe and batch is not None and batch <= SMALL_MOE_DECODE_BATCH:
        out |= {c: few_moe(band, out[c], batch=batch) for c in ("decode", kind)}
    return out


def serving_band_text(
    model: ModelSpec, *, engine: str, gpu: str, stated: bool = True, batch: float | None = None
) -> str:
    """The serving band as factors on the model's figures, for a ranking of many plans (``serve-plan``);
    ``stated``: whether the engine was given (else widened as for an unseen engine); ``batch``: the sequences a
    step the best plan decodes per replica."""
    bands = _bands(io.serving_held_out_band(), model, engine=engine, gpu=gpu, stated=stated, batch=batch)
    kind = "throughput-moe" if model.moe is not None else "throughput-dense"

    def factors(cls: str, *, rate: bool = False) -> str:
        b = bands[cls]
        return f"x{1 / b.hi:.2f}-{1 / b.lo:.2f}" if rate else f"x{b.lo:.2f}-{b.hi:.2f}"

    return (
        f"measured over predicted on published serving measurements held out by source, P10-P90: TPOT "
        f"{factors('decode')} ({bands['decode'].text()}), TTFT {factors('prefill')} ({bands['prefill'].text()}), "
        f"tokens/s per GPU {factors(kind, rate=True)} ({bands[kind].text()}): a plan within those factors of a "
        "target may miss it"
    )


def static_dict(setup: Setup, req: Requests, pt: LoadPoint, *, batch: int, max_batch: int | None) -> dict[str, Any]:
    """A static batch of ``batch`` prompts split evenly over the replicas (the largest share sets the times): its
    TTFT (the whole batch's prefill), TPOT and tokens/s replace the steady state's (core/serving/static.py)."""
    per_replica = math.ceil(batch / setup.replicas)
    cal, lay = setup.hw.cal, setup.layout
    ranks = lay.tp if lay.dp_attention else 1
    caps = [
        (pt.capacity.kv_sequences, f"{pt.capacity.kv_sequences:,} sequences of {req.input_len + req.output_len:,} "
         "tokens fit in the KV cache"),
        (cal.max_batch * ranks, f"{cal.engine} runs at most {cal.max_batch * ranks:,} sequences a step"),
    ]  # fmt: skip
    if max_batch is not None:
        caps.append((max_batch, f"--max-batch {max_batch:,}"))
    for cap, why in caps:
        if per_replica > cap:
            raise ValueError(f"--batch {batch:,}: {per_replica:,} sequences per replica, but {why}")
    sb = static_batch(
        setup.model, setup.shape, setup.hw, lay, batch=per_replica, input_len=req.input_len, output_len=req.output_len
    )
    gpus = lay.gpus_per_replica
    return {
        "ttft_s_p50": sb.ttft_s,
        "ttft_s_p99": sb.ttft_s,
        "ttft_s_mean": sb.ttft_s,
        "queue_s_p50": 0.0,
        "queue_s_p99": 0.0,
        "tpot_s": sb.tpot_s,
        "tpot_s_p50": sb.tpot_s,
        "tpot_s_p99": sb.tpot_s,
        "itl_s": sb.tpot_s,
        "itl_s_p99": sb.tpot_s,
        "tokens_per_s_per_gpu": sb.output_tokens_per_s / gpus,
        "tokens_per_s_per_user": 1.0 / sb.tpot_s,
        "tokens_per_s_total": sb.output_tokens_per_s * setup.replicas,
        "requests_per_s_total": per_replica / sb.run_s * setup.replicas,
        "batch_per_replica": float(per_replica),
        "batch_limit": "load",
        "saturated": False,
        "step_s": {k: float(v) * pipeline_factor(setup.hw, lay) for k, v in sb.step.breakdown().items()},
        "static_batch": {
            "batch": batch,
            "batch_per_replica": per_replica,
            "prefill_forwards": sb.prefill_forwards,
            "ttft_s": sb.ttft_s,
            "decode_s": sb.decode_s,
            "run_s": sb.run_s,
        },
    }


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
        "engine_source": setup.engine_source,
        "launch": setup.hw.cal.launch.value,
        "kv_admission": "whole-sequence" if setup.hw.cal.reserve_full_sequence else "growing",
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
        "defaults_applied": [{"setting": k, "value": v, "source": why} for k, v, why in setup.defaults],
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
        "ttft_s_p50": finite_s(pt.ttft_s_p50),
        "ttft_s_p99": finite_s(pt.ttft_s_p99),
        "ttft_s_mean": finite_s(pt.ttft_s_p50),  # the pools' model gives the mean wait
        "ttft_s_unloaded": pt.prefill_s + pt.kv_transfer_s + pt.tpot_s / 2,
        "queue_s_p50": finite_s(pt.queue_s_p50),
        "queue_s_p99": finite_s(pt.queue_s_p99),
        "tpot_s": pt.tpot_s,
        "tpot_s_p50": pt.tpot_s,  # decode-only steps at a steady batch
        "tpot_s_p99": pt.tpot_s,
        "itl_s": pt.tpot_s,
        "itl_s_p99": pt.tpot_s,
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
