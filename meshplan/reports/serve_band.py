"""The serving band of one question: which of catalog/serving/held_out.toml's bands it takes, and how much wider.

The file (written by validation/serving_band.py) holds, per metric class (decode, prefill, dense and MoE
throughput): the class's band, each engine family's band, the GPU kinds and model classes its rows ran, and the
width an unseen one adds. A question (a class, an engine, a GPU kind, a model) takes:

1. its engine family's band in the class where the family has published rows there (the class's spread around the
   family's own median, covering the class's band), else the class's band widened for an unseen engine; a
   question that states no engine (predicted with TensorRT-LLM's constants) takes the class's band widened as for
   an unseen engine too: it has said nothing of the engine that will run;
2. a class with no row of its own (MoE throughput, held out of its one source) takes its sibling's (dense
   throughput's) as the rest of this rule gives it, the model class that sibling never ran widening it;
3. each unseen level (the engine, the GPU kind, MoE, MLA) adds its class's width w in quadrature to each side's
   distance from the median, in logs: d' = sqrt(d^2 + sum w^2), and names why.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

SIBLING = {"throughput-moe": "throughput-dense", "throughput-dense": "throughput-moe"}
"""The class measuring the same quantity (offline tokens/s) on the other model class."""


def band_family(engine: str, launch: str) -> str:
    """The engine family a band is kept for: the engine, and its launch mode where that is not the replayed CUDA
    graphs every engine runs by default (an engine launched op by op is another machine: ``vllm-eager``)."""
    return engine if launch == "cudagraph" else f"{engine}-{launch}"


def key(name: str) -> str:
    """A class, engine or GPU name as a band-file key part (dashes and dots to underscores)."""
    return name.replace("-", "_").replace(".", "_")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Band:
    """P10, median and P90 of measured over predicted time for one question, and what stands behind it."""

    lo: float
    mid: float
    hi: float
    runs: int
    sources: int
    """Sources behind the band the question takes (its engine family's in the class, else the class's)."""
    class_sources: int
    engine_sources: int
    """Of them, the question's engine family's (0: none)."""
    widened: tuple[str, ...]
    """Why it is wider than the band its rows give: unseen levels, a borrowed class."""
    engine: str

    def text(self) -> str:
        """'32 runs of 4 sources (2 of them trtllm's)' and the reasons it is widened."""
        if self.class_sources == 0:
            head = "no published row of this class"
        else:
            head = f"{self.runs} runs of {self.class_sources} source{'s' if self.class_sources != 1 else ''}"
            if self.engine_sources == self.class_sources:
                head += f", all {self.engine}'s"
            elif self.engine_sources:
                head += f", {self.engine_sources} of them {self.engine}'s"
        return head + (f" (widened: {', '.join(self.widened)})" if self.widened else "")


ENGINE_NAMES = {
    "trtllm": "TensorRT-LLM",
    "vllm": "vLLM",
    "sglang": "SGLang",
    "gpt-fast": "gpt-fast",
    "vllm-0.2": "vLLM 0.2",
}


def unstated_engine_reason(engine: str) -> str:
    """Why the band of a question that states no engine is widened."""
    return f"no engine stated: {ENGINE_NAMES.get(engine, engine)}'s constants, widened as for an unseen engine"


def band_for(
    band: Mapping[str, float],
    cls: str,
    *,
    engine: str,
    gpu: str,
    moe: bool,
    mla: bool,
    stated: bool = True,
    _borrowed: bool = False,
) -> Band:
    """The band of a ``cls`` figure of ``engine`` on ``gpu`` for a model that is (or not) MoE and MLA (module
    docstring); ``stated``: whether the question names its engine (else ``engine``'s constants stand in)."""
    c = key(cls)
    if f"{c}_time_ratio_p10" not in band:
        sibling = SIBLING.get(cls)
        if _borrowed or sibling is None or f"{key(sibling)}_time_ratio_p10" not in band:
            raise ValueError(f"the serving band file has no {cls!r} band and no sibling class's")
        got = band_for(band, sibling, engine=engine, gpu=gpu, moe=moe, mla=mla, stated=stated, _borrowed=True)
        why = f"no published {cls} row: {sibling}'s band"
        return dataclasses.replace(got, class_sources=0, engine_sources=0, widened=(why, *got.widened))
    e = f"{c}_engine_{key(engine)}"
    widths, why = [], []
    if stated and f"{e}_sources" in band:
        lo, mid, hi = (band[f"{e}_time_ratio_{q}"] for q in ("p10", "p50", "p90"))
        engine_sources = int(band[f"{e}_sources"])
    else:
        lo, mid, hi = (band[f"{c}_time_ratio_{q}"] for q in ("p10", "p50", "p90"))
        engine_sources = 0
        widths.append(band[f"{c}_unseen_engine_log"])
        why.append(f"no published {cls} row of {engine}" if stated else unstated_engine_reason(engine))
    if f"{c}_gpu_{key(gpu)}_sources" not in band:
        widths.append(band[f"{c}_unseen_gpu_log"])
        why.append(f"no published {cls} row on {gpu}")
    for trait, has, name in (
        ("moe", moe, "a MoE" if moe else "a dense"),
        ("mla", mla, "an MLA" if mla else "a non-MLA"),
    ):
        if f"{c}_{trait}_{int(has)}_sources" not in band:
            widths.append(band[f"{c}_unseen_{trait}_log"])
            why.append(f"no published {cls} row of {name} model")
    if widths:
        extra = sum(w * w for w in widths)
        below, above = math.log(mid / lo), math.log(hi / mid)
        lo, hi = mid * math.exp(-math.sqrt(below**2 + extra)), mid * math.exp(math.sqrt(above**2 + extra))
    return Band(
        lo=lo,
        mid=mid,
        hi=hi,
        runs=int(band[f"{c}_runs"]),
        sources=engine_sources or int(band[f"{c}_sources"]),
        class_sources=int(band[f"{c}_sources"]),
        engine_sources=engine_sources,
        widened=tuple(why) + (() if int(band[f"{c}_sources"]) != 1 else ("one source: its sibling class's spread",)),
        engine=engine,
    )


FEW_MOE = "decode_few_moe"
"""The band of a MoE model decoding a few sequences a step, in catalog/serving/held_out.toml
(validation/serving_few_moe.py writes it from catalog/serving/few_moe_decode.toml)."""


def few_moe(band: Mapping[str, float], base: Band, *, batch: float) -> Band:
    """``base`` widened to cover the published steps of MoE models decoding a few sequences (``batch`` a step per
    replica, at or below reports/serve_coverage.py's ``SMALL_MOE_DECODE_BATCH``): the union of both P10-P90 ranges,
    since there the engine's release moves the step more than one family's constants follow. The file without
    that band (none written yet) leaves ``base`` as it is."""
    if f"{FEW_MOE}_time_ratio_p10" not in band:
        return base
    lo, hi = band[f"{FEW_MOE}_time_ratio_p10"], band[f"{FEW_MOE}_time_ratio_p90"]
    runs, sources = int(band[f"{FEW_MOE}_runs"]), int(band[f"{FEW_MOE}_sources"])
    why = (
        f"a MoE model at {batch:.3g} sequence{'' if batch == 1 else 's'} a step: x{lo:.2f}-{hi:.2f} on {runs} "
        f"published such steps of {sources} sources, engine release to release"
    )
    return dataclasses.replace(base, lo=min(base.lo, lo), hi=max(base.hi, hi), widened=(*base.widened, why))
