"""What the published runs measured, beside what a report predicts.

Two checks a practitioner can act on:

- The MFU range of the published runs (catalog/published_mfu.toml, written by ``benchmarks/validation_table.py
  --write-band`` from ``meshplan validate``; validation/mfu_range.py derives it): per GPU kind, per class of layout
  (``MFU_CLASSES``) and per matmul dtype, the lowest and highest MFU the published runs measured, in the reports'
  convention (core/time/flops.py ``MFU_CONVENTION``). A prediction above the highest of its class on its GPU kind
  is one no published run reached, and ``estimate``, ``recipe`` and each plan of ``plan`` say so with the numbers
  (and say so where no published run of the class ran on the GPU kind).
- Ties: plans of ``plan`` whose step times lie within each other's P10-P90 band, which the model cannot rank.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any

from meshplan.units import DType

MFU_CLASSES = {
    "dense": "dense models without context parallelism",
    "moe": "MoE models without expert or context parallelism",
    "cp": "layouts with context parallelism",
    "ep": "MoE layouts with expert parallelism",
    "cp_ep": "layouts with context or expert parallelism",
}
"""The classes of the published MFU range, and how the reports name them. A layout with both context and expert
parallelism takes ``cp_ep``: the runs of either class (the wider range, as its step-time band is the wider of
the two classes' bands: reports/estimate.py ``uncertainty``)."""


def mfu_class(*, cp: int, ep: int, moe: bool) -> str:
    """The class (``MFU_CLASSES``) of a layout of these degrees, of a MoE model or not."""
    if int(cp) > 1 and int(ep) > 1:
        return "cp_ep"
    if int(cp) > 1:
        return "cp"
    if int(ep) > 1:
        return "ep"
    return "moe" if moe else "dense"


def run_classes(*, cp: int, ep: int, moe: bool) -> tuple[str, ...]:
    """The classes a published run of these degrees counts in: its own, the two of a run with both CP and EP,
    and ``cp_ep`` for every run with either (the range a layout with both is held to)."""
    own = mfu_class(cp=cp, ep=ep, moe=moe)
    if own == "cp_ep":
        return ("cp", "ep", "cp_ep")
    return (own, "cp_ep") if own in ("cp", "ep") else (own,)


def matmul_kind(dtype: DType) -> str:
    """How the range splits runs by matmul dtype: "16-bit" (bf16 and fp16, one peak), else the dtype's name
    (fp8 runs reach MFUs over the bf16 peak no 16-bit run can)."""
    return "16-bit" if dtype in (DType.BF16, DType.FP16) else dtype.value


@cache
def published_mfu() -> dict[str, Any]:
    """catalog/published_mfu.toml: per GPU kind, class and matmul kind, the published runs' MFU range."""
    text = (resources.files("meshplan") / "catalog" / "published_mfu.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def mfu_range(*, gpu: str, cls: str, matmul: str) -> dict[str, Any]:
    """The published runs' MFU range for one GPU kind, class and matmul kind (``runs`` 0 and null bounds where
    none ran)."""
    cell = published_mfu().get(gpu, {}).get(cls, {}).get(matmul)
    return {
        "gpu": gpu,
        "layout_class": cls,
        "matmul": matmul,
        "runs": int(cell["runs"]) if cell else 0,
        "sources": int(cell["sources"]) if cell else 0,
        "mfu_min": float(cell["mfu_min"]) if cell else None,
        "mfu_max": float(cell["mfu_max"]) if cell else None,
        "highest_run": str(cell["highest"]) if cell else None,
    }


def mfu_check(mfu: float, *, gpu: str, cp: int, ep: int, moe: bool, dtype: DType) -> tuple[dict[str, Any], list[str]]:
    """One prediction against the published range of its class: the range with ``above`` (true when the MFU is
    above the highest, null where no published run of the class ran on the GPU kind), and its warning."""
    rng = mfu_range(gpu=gpu, cls=mfu_class(cp=cp, ep=ep, moe=moe), matmul=matmul_kind(dtype))
    rng["above"] = None if rng["mfu_max"] is None else bool(mfu > rng["mfu_max"])
    return rng, range_warning("", [mfu], rng)


def range_warning(subject: str, mfus: Sequence[float], rng: Mapping[str, Any]) -> list[str]:
    """What the published range says of these predicted MFUs (``subject``: who predicts them, "" for one)."""
    values = f"{min(mfus):.1%}" if len(mfus) == 1 or min(mfus) == max(mfus) else f"{min(mfus):.1%}-{max(mfus):.1%}"
    what = f"{MFU_CLASSES[rng['layout_class']]}, {rng['matmul']} matmuls"
    if rng["mfu_max"] is None:
        ran = sum(sum(int(c.get("runs", 0)) for c in m.values()) for m in published_mfu().get(rng["gpu"], {}).values())
        where = (
            f"no published run of its class ({what}) ran on {rng['gpu']}"
            if ran
            else f"none of the published training runs ran on {rng['gpu']}"
        )
        return [f"{subject}MFU {values}: {where}, so no measured MFU bounds it"]
    if max(mfus) <= rng["mfu_max"]:
        return []
    return [
        f"{subject}MFU {values} is above the highest any published run of its class measured on {rng['gpu']}: "
        f"{rng['mfu_max']:.1%} ({rng['highest_run']}); its {rng['runs']} runs from {rng['sources']} sources ({what}) "
        f"span {rng['mfu_min']:.1%}-{rng['mfu_max']:.1%} in the reports' MFU convention: this step time is likely "
        "optimistic"
    ]


def within_band(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two plans' step times lie within each other's P10-P90 band."""
    return (
        a["step_time_s_p10"] <= b["step_time_s"] <= a["step_time_s_p90"]
        and b["step_time_s_p10"] <= a["step_time_s"] <= b["step_time_s_p90"]
    )


def numbered(indices: Sequence[int]) -> str:
    """Plan numbers (1-based) as text: runs of three or more as "1-3", the rest listed."""
    groups: list[list[int]] = []
    for n in sorted(set(indices)):
        if groups and groups[-1][-1] == n - 1:
            groups[-1].append(n)
        else:
            groups.append([n])
    return ", ".join(f"{g[0]}-{g[-1]}" if len(g) >= 3 else ", ".join(map(str, g)) for g in groups)


def mark_ties(plans: list[dict[str, Any]]) -> str | None:
    """Sets each plan's ``ties_with_best``: its step time and plan 1's lie within each other's band (plan 1's own
    is true). Returns the line that says which plans the band cannot rank, or None when plan 1 stands alone."""
    if not plans:
        return None
    tied = [i for i, p in enumerate(plans) if within_band(plans[0], p)]
    for i, p in enumerate(plans):
        p["ties_with_best"] = i in tied
    if len(tied) < 2:
        return None
    mutual = all(within_band(plans[i], plans[j]) for i in tied for j in tied)
    return (
        f"plans {numbered([i + 1 for i in tied])} are within the step-time band (P10-P90) of "
        f"{'each other' if mutual else 'plan 1'}: the model cannot rank them; choose among them on memory, the "
        "fabric they cross or what your stack runs"
    )


def mark_plans(plans: list[dict[str, Any]], *, gpu: str, moe: bool, dtype: DType) -> dict[str, Any]:
    """``plan``'s ranked plans against the band and the published runs: each plan's ``ties_with_best`` and
    ``published_mfu`` (``mfu_check``'s range), and the report's ``ties`` (the line, or null) and ``warnings``
    (per class, the plans above the published range or with none to check against)."""
    ties = mark_ties(plans)
    by_class: dict[str, list[int]] = {}
    for i, p in enumerate(plans):
        lay = p["layout"]
        p["published_mfu"], _ = mfu_check(p["mfu"], gpu=gpu, cp=lay["cp"], ep=lay["ep"], moe=moe, dtype=dtype)
        by_class.setdefault(p["published_mfu"]["layout_class"], []).append(i)
    warnings: list[str] = []
    for members in by_class.values():
        rng = plans[members[0]]["published_mfu"]  # one range a class: the GPU kind and matmul dtype are the plans'
        flagged = [i for i in members if plans[i]["published_mfu"]["above"] is not False]
        if flagged:
            label = "plan" if len(flagged) == 1 else "plans"
            subject = f"{label} {numbered([i + 1 for i in flagged])}: "
            warnings += range_warning(subject, [plans[i]["mfu"] for i in flagged], rng)
    return {"ties": ties, "warnings": warnings}
