"""``meshplan serve-plan``: the serving layouts that meet latency targets, ranked, with the Pareto front."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Iterator
from typing import Any

from meshplan import io
from meshplan.core.placement import whole_node_size
from meshplan.core.serving.load import Requests
from meshplan.core.serving.search import Candidate, Objective, SearchResult, Targets, search
from meshplan.core.serving.shape import (
    Hardware,
    Quant,
    ReplicaShape,
    ServeCalibration,
    ServeLayout,
    default_quant,
    replica_shape,
)
from meshplan.core.time.host import Launch
from meshplan.reports.inputs import choice
from meshplan.reports.serve import calibration, engine_defaults, serving_band_text
from meshplan.reports.serve_band import band_family
from meshplan.reports.serve_coverage import coverage_warnings, small_moe_decode_warnings
from meshplan.reports.serve_setup import admitted, fleet_node, published_dtype, stated_engine, straddles
from meshplan.reports.serve_spec import head_speculation
from meshplan.search.limits import check_deadline
from meshplan.spec.cluster import GPU, Link
from meshplan.spec.model import ModelSpec
from meshplan.units import DType

PP_DEGREES = (1, 2, 4, 8)
WEIGHT_DTYPES = (DType.BF16, DType.FP8, DType.INT8, DType.INT4, DType.FP4)
KV_DTYPES = (DType.BF16, DType.FP8)
PARETO_SHOWN = 40
"""Pareto points kept in the answer (evenly spaced along the front)."""


JSON_KEYS = {
    "batch_cap": "batch_cap_per_replica",
    "kv_sequences": "kv_sequences_per_replica",
    "ttft_p99_s": "ttft_s_p99",
    "tpot_p99_s": "tpot_s_p99",
}
"""Candidate fields as the JSON contract names them: quantity, unit, then scope (docs/json.md)."""


def _weight_options(gpu: GPU, only: list[str] | None) -> list[tuple[DType, Quant]]:
    out = []
    for w in WEIGHT_DTYPES:
        if only is not None and w.value not in only:
            continue
        if w is DType.FP4 and w not in gpu.peak_flops and only is None:
            continue  # weight-only fp4 there is int4's twin (Marlin): searched where asked for or published in
        if w is DType.FP8 and w not in gpu.peak_flops:
            continue  # weight-only fp8 on Ampere is int8's twin; keep the list short
        out.append((w, default_quant(w, gpu)))
    return out


TP_DEGREES = (1, 2, 4, 8, 16, 32, 64, 72)
"""The TP (and attention-DP) degrees the search tries."""


def layouts(
    model: ModelSpec,
    gpu: GPU,
    *,
    gpus: int,
    dtypes: list[str] | None,
    kv_of: Callable[[DType], tuple[DType, ...]] | None = None,
) -> Iterator[ServeLayout]:
    """Every replica layout: TP within the scale-up domain (attention-DP groups may span it), PP, experts; the KV
    dtypes of each weight dtype ``kv_of`` gives (default: every one)."""
    tps = [t for t in TP_DEGREES if t <= gpus]
    for tp in tps:
        for pp in PP_DEGREES:
            if tp * pp > gpus or pp > model.num_layers:
                continue
            moe_options: list[tuple[int, bool]] = [(1, False)]
            if model.moe is not None and tp > 1:
                moe_options += [(tp, False), (tp, True)]
            for ep, dp_attention in moe_options:
                if tp > gpu.scale_up_domain and not dp_attention:
                    continue  # plain TP across the fabric: all-reduces on the NICs
                if straddles(tp, gpus, gpu.scale_up_domain):
                    continue  # groups that do not tile the node: some would straddle two
                for w, q in _weight_options(gpu, dtypes):
                    for kv in KV_DTYPES if kv_of is None else kv_of(w):
                        yield ServeLayout(
                            tp=tp, pp=pp, ep=ep, dp_attention=dp_attention, weights_dtype=w, kv_dtype=kv, quant=q
                        )


def _within_time_limit(items: Iterator[ServeLayout]) -> Iterator[ServeLayout]:
    """``items``, stopping with SearchTimeout once the caller's time limit (search.rank.time_limit) has passed or
    its search was cancelled: how the HTTP API bounds a serving search. Without a limit (the CLI) a no-op."""
    for item in items:
        check_deadline()
        yield item


def layout_dict(lay: ServeLayout) -> dict[str, Any]:
    return {
        "tp": lay.tp,
        "pp": lay.pp,
        "ep": lay.ep,
        "dp_attention": lay.dp_attention,
        "weights_dtype": lay.weights_dtype.value,
        "kv_dtype": lay.kv_dtype.value,
        "quant": lay.quant.value,
    }


def _spread(points: list[Any], n: int) -> list[Any]:
    if len(points) <= n:
        return points
    step = (len(points) - 1) / (n - 1)
    return [points[round(i * step)] for i in range(n)]


def engine_kv(cal: ServeCalibration) -> Callable[[DType], tuple[DType, ...]]:
    """The KV dtype the engine keeps with each weight dtype when left to it (``serve.engine_defaults``): the only one
    serve-plan searches without --allow-quantization."""

    def kv_of(weights: DType) -> tuple[DType, ...]:
        kv, _, _ = engine_defaults(cal, weights_dtype=weights.value, kv_dtype=None, quant_group=None)
        return (DType(kv),)

    return kv_of


def searched_dtypes(model: ModelSpec | str, dtypes: list[str] | None, *, allow_quantization: bool) -> list[str] | None:
    """The weight dtypes serve-plan searches: every one (None) or the user's list with ``allow_quantization``, else
    those that keep the model's quality (16-bit and the dtype it is published in); a quantized dtype asked for
    without ``allow_quantization`` is refused, never dropped."""
    for d in dtypes or []:
        choice(DType, d, "weights dtype")
    if allow_quantization:
        return dtypes
    native = published_dtype(model)
    keeps = [DType.BF16.value, DType.FP16.value, native.value]
    lowered = [d for d in dtypes or [] if d not in keeps]
    if lowered:
        name = model if isinstance(model, str) else model.name
        raise ValueError(
            f"--weights-dtypes {','.join(lowered)}: quantizes {name}'s {native.value} weights, which changes the "
            "model's quality: add --allow-quantization to search them"
        )
    return dtypes if dtypes else [d.value for d in WEIGHT_DTYPES if d.value in keeps]


def serve_plan_report(
    model: ModelSpec | str,
    *,
    gpu: str,
    gpus: int,
    input_len: int,
    output_len: int,
    ttft_p99_s: float | None = None,
    tpot_p99_s: float | None = None,
    objective: str = "throughput",
    concurrency: float | None = None,
    engine: str | None = None,
    dtypes: list[str] | None = None,
    top: int = 5,
    disaggregate: bool = False,
    allow_quantization: bool = False,
    prefix_hit_rate: float | None = None,
    speculative: str | None = None,
    spec_acceptance: float | None = None,
    launch: str | None = None,
    node_size: int | None = None,
    capacity_scheduler: str | None = None,
) -> dict[str, Any]:
    """Search, rank and explain: the best plans, the Pareto front, and why every other layout lost. Weights are
    searched below the model's published dtype only with ``allow_quantization`` (``searched_dtypes``). Every layout
    is timed with the prefix hit rate and the drafting head (eagle:K, mtp:K) given, launched as ``launch`` says
    (left out: the engine's own way, ``engine_launch``), admitted as TensorRT-LLM's ``capacity_scheduler`` says
    (left out: the engine's own admission), on nodes of ``node_size`` GPUs (left out: the kind's
    scale-up domain; a 4-GPU board without a switch gives each group only its pairs' links)."""
    start = time.perf_counter()
    engine, engine_source = stated_engine(engine)  # left out: TensorRT-LLM's constants, the band widened
    dtypes = searched_dtypes(model, dtypes, allow_quantization=allow_quantization)
    spec = io.load_model(model) if isinstance(model, str) else model
    gpu_spec, scale_up = fleet_node(io.load_gpu(gpu), node_size)
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    obj = choice(Objective, objective, "objective")
    if obj is Objective.FEWEST_GPUS and concurrency is None:
        raise ValueError("--objective fewest-gpus needs --concurrency (the users to serve)")
    kv_of = None if allow_quantization else engine_kv(calibration(engine, gpu_spec.name))
    head_speculation(spec, speculative, spec_acceptance)  # refused before the search starts
    result = _search(
        spec,
        gpu_spec,
        _within_time_limit(layouts(spec, gpu_spec, gpus=gpus, dtypes=dtypes, kv_of=kv_of)),
        gpus=gpus,
        input_len=input_len,
        output_len=output_len,
        targets=Targets(ttft_p99_s=ttft_p99_s, tpot_p99_s=tpot_p99_s),
        objective=obj,
        concurrency=concurrency,
        engine=engine,
        disaggregate=disaggregate,
        keep_splits=top,
        prefix_hit_rate=prefix_hit_rate,
        speculative=speculative,
        spec_acceptance=spec_acceptance,
        launch=launch,
        scale_up=scale_up,
        capacity_scheduler=capacity_scheduler,
    )
    searched = [w.value for w, _ in _weight_options(gpu_spec, dtypes)]
    launched = engine_launch(engine, gpu_spec.name, launch).value
    family = band_family(engine, launched)
    answer = _answer(spec, gpu_spec, result, gpus=gpus, engine=engine, obj=obj, top=top, start=start)
    best = answer["best"]
    few = []
    if best is not None:
        who = f"the best plan of {spec.name}"
        few = small_moe_decode_warnings(spec, batch_per_replica=best["batch_cap_per_replica"], engine=engine, who=who)
    return answer | {
        "input_len": input_len,
        "output_len": output_len,
        "targets": {"ttft_s_p99": ttft_p99_s, "tpot_s_p99": tpot_p99_s},
        "disaggregate_searched": disaggregate,
        "concurrency_total": concurrency,
        "engine_source": engine_source,
        "launch": launched,
        "node_size": node_size,
        "capacity_scheduler": capacity_scheduler,
        "uncertainty": serving_band_text(
            spec,
            engine=family,
            gpu=gpu_spec.name,
            stated=engine_source == "flag",
            batch=None if best is None else best["batch_cap_per_replica"],
        ),
        "weights_dtypes_searched": searched,
        "prefix_hit_rate": prefix_hit_rate,
        "speculative": speculative,
        "spec_acceptance": spec_acceptance,
        "warnings": [
            *coverage_warnings(spec, gpu_spec.name),
            *_quality_note(model, gpu_spec, allow_quantization, searched),
            *_straddle_note(gpu_spec, gpus),
            *few,
        ],
    }


def _straddle_note(gpu: GPU, gpus: int) -> list[str]:
    """The TP degrees the search left out because their groups would straddle two nodes of this fleet."""
    domain = gpu.scale_up_domain
    skipped = [t for t in TP_DEGREES if t <= gpus and straddles(t, gpus, domain)]
    if not skipped:
        return []
    keep = whole_node_size(max(skipped), domain)
    return [
        f"TP {', '.join(map(str, skipped))} not searched: over {gpus} GPUs some of their groups would straddle two "
        f"{domain}-GPU nodes; a fleet that gives each replica {keep} GPUs a node types --node-size {keep}"
    ]


def engine_launch(engine: str, gpu: str, launch: str | None) -> Launch:
    """How each layout's kernels launch: as stated, else the engine's own way (replayed CUDA graphs; vllm-0.2's op
    by op)."""
    return Launch(launch) if launch is not None else calibration(engine, gpu).launch


def _quality_note(model: ModelSpec | str, gpu: GPU, allow_quantization: bool, searched: list[str]) -> list[str]:
    """What a search at the model's published quality left out (the quantized weights this GPU runs)."""
    native = published_dtype(model).value
    lower = [w.value for w, _ in _weight_options(gpu, None) if w.value not in searched and w is not DType.BF16]
    if allow_quantization or not lower:
        return []
    return [
        f"weights searched in {', '.join(searched)} only, the quality the model is published at ({native}), each "
        f"with the engine's default KV cache: --allow-quantization also searches {', '.join(lower)} weights and an "
        "fp8 KV cache, which change it"
    ]


def _search(
    spec: ModelSpec,
    gpu: GPU,
    candidates: Iterator[ServeLayout],
    *,
    gpus: int,
    input_len: int,
    output_len: int,
    targets: Targets,
    objective: Objective,
    concurrency: float | None,
    engine: str,
    disaggregate: bool,
    keep_splits: int = 5,
    splits: Collection[int] | None = None,
    prefix_hit_rate: float | None = None,
    speculative: str | None = None,
    spec_acceptance: float | None = None,
    launch: str | None = None,
    scale_up: Link | None = None,
    capacity_scheduler: str | None = None,
) -> SearchResult:
    if disaggregate and (prefix_hit_rate is not None or speculative is not None):
        given = "--prefix-hit-rate" if prefix_hit_rate is not None else "--speculative"
        raise ValueError(f"{given} is modelled on colocated replicas; drop --search-disaggregated")
    hw = Hardware(
        gpu=gpu,
        scale_up=io.load_link(gpu.scale_up_link) if scale_up is None else scale_up,
        scale_out=io.load_link(gpu.scale_out_link),
        cal=admitted(
            dataclasses.replace(calibration(engine, gpu.name), launch=engine_launch(engine, gpu.name, launch)),
            engine,
            capacity_scheduler,
        ),
    )
    req = Requests(
        input_len=input_len,
        output_len=output_len,
        concurrency=float(gpus * 1e6),
        prefix_hit_rate=prefix_hit_rate or 0.0,
        speculation=head_speculation(spec, speculative, spec_acceptance),
    )

    def shape_of(lay: ServeLayout) -> ReplicaShape:
        return replica_shape(spec, hw, lay, context=input_len + output_len)

    return search(
        spec,
        hw,
        candidates,
        shape_of,
        req,
        gpus=gpus,
        targets=targets,
        objective=objective,
        concurrency=concurrency,
        disaggregate=disaggregate,
        keep_splits=keep_splits,
        splits=splits,
    )


def candidate_dict(c: Candidate) -> dict[str, Any]:
    """A ranked plan as ``best`` and ``top[]`` hold it."""
    return {"layout": layout_dict(c.layout)} | {
        JSON_KEYS.get(k, k): v for k, v in dataclasses.asdict(c).items() if k != "layout"
    }


def plan_of_layout(
    spec: ModelSpec,
    gpu: GPU,
    layout: ServeLayout,
    *,
    gpus: int,
    input_len: int,
    output_len: int,
    targets: Targets,
    objective: Objective,
    concurrency: float | None,
    engine: str,
    prefill_replicas: int,
    prefix_hit_rate: float | None = None,
    speculative: str | None = None,
    spec_acceptance: float | None = None,
    launch: str | None = None,
    node_size: int | None = None,
    capacity_scheduler: str | None = None,
) -> dict[str, Any]:
    """The plan serve-plan ranks for one layout (split into ``prefill_replicas`` prefill replicas and the rest
    decode, when above 0), as ``best`` holds it, on the catalog's ``gpu`` in nodes of ``node_size``; ValueError with
    the reason when the layout yields none."""
    node_gpu, scale_up = fleet_node(gpu, node_size)
    result = _search(
        spec,
        node_gpu,
        iter([layout]),
        gpus=gpus,
        input_len=input_len,
        output_len=output_len,
        targets=targets,
        objective=objective,
        concurrency=concurrency,
        engine=engine,
        disaggregate=prefill_replicas > 0,
        splits=(prefill_replicas,),
        prefix_hit_rate=prefix_hit_rate,
        speculative=speculative,
        spec_acceptance=spec_acceptance,
        launch=launch,
        scale_up=scale_up,
        capacity_scheduler=capacity_scheduler,
    )
    for c in result.ranked:
        if c.prefill_replicas == prefill_replicas:
            return candidate_dict(c)
    if result.rejected:
        raise ValueError(result.rejected[0].reason)
    raise ValueError(f"no split of its replicas into {prefill_replicas} prefill replicas meets the targets")


def _answer(
    spec: ModelSpec, gpu: GPU, result: SearchResult, *, gpus: int, engine: str, obj: Objective, top: int, start: float
) -> dict[str, Any]:
    ranked = [candidate_dict(c) for c in result.ranked[:top]]
    pareto = [
        {
            "layout": layout_dict(p.layout),
            "batch_cap_per_replica": p.batch_cap,
            "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
            "tokens_per_s_per_user": p.tokens_per_s_per_user,
        }
        for p in _spread(result.pareto, PARETO_SHOWN)
    ]
    return {
        "model": spec.name,
        "gpu": gpu.name,
        "gpus": gpus,
        "engine": engine,
        "objective": obj.value,
        "best": ranked[0] if ranked else None,
        "top": ranked,
        "pareto": pareto,
        "pareto_points_total": len(result.pareto),
        "rejected": [{"layout": layout_dict(r.layout), "reason": r.reason} for r in result.rejected],
        "layouts_evaluated": result.evaluated_layouts,
        "points_evaluated": result.evaluated_points,
        "layouts_meeting_targets": len(result.ranked),
        "elapsed_s": time.perf_counter() - start,
    }
