"""A cluster profile: shared scales on the catalog's constants, fitted from measured runs.

The catalog holds each GPU kind's and link kind's constants with their sources.
A profile does not replace them: it scales them all at once, as one cluster
(or one fit over published sources) says its stack runs faster or slower than
the catalog's physics, and adds the host-side time each of its steps pays.
``meshplan calibrate`` writes one; ``--profile FILE`` applies it;
``meshplan validate`` fits one per left-out source.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshplan.files import load_toml_file
from meshplan.spec.cluster import Cluster, Link

MAX_EFFICIENCY = 1.0
MAX_STEP_OVERHEAD_S = 600.0
"""A profile's host time per step is at most ten minutes: more is a typo, not a training loop."""
MAX_BAND_RATIO = 100.0
"""Widest band of measured over predicted step time a profile may state: its P90 at most 100 times its P10, and
each end within 100 times of 1 either way. The profile's own scales are bounded to [0.05, 20] (a 400x range
together), and a fitted profile is chosen to bring its runs' ratios near 1: runs whose held-out ratios still
spread over two orders of magnitude, or sit two orders away from their prediction, disagree with each other or
with the catalog beyond anything a set of shared constants describes (a unit slip, runs of another cluster or
model), and a step time quoted "between 1 us and 100 days" is no answer. Such a band is refused, where it is
fitted (``meshplan calibrate``) and where it is read (``--profile FILE``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """Scales on the constants of every GPU kind and link kind of a fleet, and its host's time per step."""

    compute_scale: float = 1.0
    """Multiplies the GPU kind's matmul and attention efficiencies (capped at 1: never above peak)."""
    comm_scale: float = 1.0
    """Multiplies the bandwidth every collective reaches on every link (scale-up and scale-out)."""
    attention_scale: float = 1.0
    """Multiplies the fused attention kernels' share of peak, on top of ``compute_scale`` (capped at peak): the
    part of compute that grows with the sequence."""
    memory_scale: float = 1.0
    """Multiplies the speed of the memory-bound kernels (the kind's share of HBM bandwidth, capped at the
    bandwidth) and divides the launch gap of every kernel: the part of compute that is not matmuls."""
    host_scale: float = 1.0
    """Multiplies the speed at which the hosts issue kernels (divides the host's seconds per kernel of every launch
    mode, core/time/host.py): moves only the layers whose host floor binds."""
    step_overhead_s: float = 0.0
    """Seconds added to every training step (``Cluster.step_overhead_s``): what the cluster's host and stack
    spend per step beside the GPUs' work (data loading, logging, metric syncs, the training loop's Python),
    which no scale of a GPU constant can express, since it does not grow with the work."""
    source: str = ""
    """How it was fitted: which runs, how many, the fit and held-out errors."""

    def __post_init__(self) -> None:
        for name in SCALES:
            value = getattr(self, name)
            if not 0.05 <= value <= 20:
                raise ValueError(f"profile {name} must be in [0.05, 20], got {value}")
        if not 0 <= self.step_overhead_s <= MAX_STEP_OVERHEAD_S:
            raise ValueError(
                f"profile step_overhead_s must be in [0, {MAX_STEP_OVERHEAD_S:g}] seconds, got {self.step_overhead_s}"
            )

    @property
    def is_identity(self) -> bool:
        return all(getattr(self, name) == NEUTRAL[name] for name in CONSTANTS)

    def inline(self) -> str:
        """The constants that differ from the catalog's as ``--profile`` takes them inline
        (``compute_scale=0.9,...``)."""
        return ",".join(f"{name}={getattr(self, name)}" for name in CONSTANTS if getattr(self, name) != NEUTRAL[name])


SCALES = ("compute_scale", "comm_scale", "attention_scale", "memory_scale", "host_scale")
"""The scales of a profile (multiplying catalog constants), in the order ``meshplan calibrate`` reports them."""
OFFSETS = ("step_overhead_s",)
"""The profile's additive constants (seconds per step)."""
CONSTANTS = SCALES + OFFSETS
"""Everything a profile sets, in the order ``meshplan calibrate`` reports it."""
NEUTRAL = {**dict.fromkeys(SCALES, 1.0), **dict.fromkeys(OFFSETS, 0.0)}
"""Each constant's value that leaves the catalog as it is."""


IDENTITY = Profile()


def from_values(values: Mapping[str, float], *, source: str = "") -> Profile:
    """The profile of the given constants (any of ``CONSTANTS``), the others neutral."""
    unknown = sorted(set(values) - set(CONSTANTS))
    if unknown:
        raise ValueError(f"unknown profile constants {', '.join(unknown)} (known: {', '.join(CONSTANTS)})")
    return Profile(**{name: float(values.get(name, NEUTRAL[name])) for name in CONSTANTS}, source=source)


def _link(link: Link, scale: float) -> Link:
    return dataclasses.replace(link, bandwidth_bytes_per_s=link.bandwidth_bytes_per_s * scale)


def apply_profile(cluster: Cluster, profile: Profile) -> Cluster:
    """``cluster`` with its GPU's efficiencies, launch gap and its links' bandwidths scaled by ``profile``, and
    the profile's host time per step added to the cluster's."""
    if profile.is_identity:
        return cluster
    cal = cluster.gpu.calibration
    k, attention, memory = profile.compute_scale, profile.compute_scale * profile.attention_scale, profile.memory_scale
    cal = dataclasses.replace(
        cal,
        matmul_efficiency_max=min(cal.matmul_efficiency_max * k, MAX_EFFICIENCY),
        attention_efficiency=min(cal.attention_efficiency * attention, MAX_EFFICIENCY),
        attention_scale=min(cal.attention_scale * attention, 2.0),
        hbm_efficiency=min(cal.hbm_efficiency * memory, MAX_EFFICIENCY),
        kernel_overhead_s=cal.kernel_overhead_s / memory,
    )
    return dataclasses.replace(
        cluster,
        gpu=dataclasses.replace(cluster.gpu, calibration=cal),
        scale_up=_link(cluster.scale_up, profile.comm_scale),
        scale_out=_link(cluster.scale_out, profile.comm_scale),
        step_overhead_s=cluster.step_overhead_s + profile.step_overhead_s,
        host_speed=cluster.host_speed * profile.host_scale,
    )


def _read(path: str | Path) -> dict[str, Any]:
    """A profile file through the one guarded reader (files.py): a regular file under 4 MB, finite numbers."""
    return load_toml_file(path, what="profile")


def load_profile(path: str | Path) -> Profile:
    """A profile TOML file as ``meshplan calibrate`` writes it; unknown keys are errors."""
    data = _read(path)
    known = {f.name for f in dataclasses.fields(Profile)}
    unknown = sorted(set(data) - known - {"fit"})
    if unknown:
        raise ValueError(f"profile {path}: unknown keys {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    for name in CONSTANTS:
        value = data.get(name, NEUTRAL[name])
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"profile {path}: {name} must be a number, got {value!r:.40}")
    if not isinstance(data.get("source", ""), str):
        raise ValueError(f"profile {path}: source must be a string")
    try:
        return Profile(**{k: v for k, v in data.items() if k in known})
    except ValueError as exc:
        raise ValueError(f"profile {path}: {str(exc).removeprefix('profile ')}") from None


def parse_profile(text: str | None, *, files: bool = True) -> Profile:
    """A profile from ``--profile``: inline ``compute_scale=0.9,comm_scale=1.2`` (any of ``CONSTANTS``), or
    (``files``) a TOML file."""
    if text is None or not text.strip():
        return IDENTITY
    text = text.strip()
    if _inline(text):
        values: dict[str, float] = {}
        for item in filter(None, (x.strip() for x in text.split(","))):
            key, _, value = item.partition("=")
            key = key.strip().replace("-", "_")
            if key not in CONSTANTS:
                raise ValueError(f"--profile: unknown key {key!r} (known: {', '.join(CONSTANTS)})")
            try:
                values[key] = float(value)
            except ValueError:
                raise ValueError(f"--profile: {key} must be a number, got {value.strip()[:40]!r}") from None
        return from_values(values, source="inline")
    if not files:
        raise ValueError(
            "--profile: give the scales inline (compute_scale=0.9,comm_scale=1.2); files are read by the CLI"
        )
    return load_profile(text)


def _inline(text: str) -> bool:
    """``--profile``'s text gives the constants itself (``compute_scale=0.9,...``), not a file's name."""
    return "=" in text and not text.endswith(".toml")


@dataclass(frozen=True, slots=True, kw_only=True)
class Band:
    """A fitted profile's own P10-P90 of measured over predicted step time: each of its runs predicted with the
    profile fitted on the others (``meshplan calibrate`` writes it in the file's [fit] table)."""

    p10: float
    p90: float
    runs: int


def band_problem(p10: float, p90: float) -> str | None:
    """Why a band of measured over predicted step time (P10, P90) says nothing (None: it is a band): not finite,
    not ordered, or wider than ``MAX_BAND_RATIO`` allows."""
    if not (math.isfinite(p10) and math.isfinite(p90) and 0 < p10 <= p90):
        return f"the band {p10:.3g}-{p90:.3g} is not two finite ratios with 0 < P10 <= P90"
    if p10 < 1 / MAX_BAND_RATIO or p90 > MAX_BAND_RATIO or p90 / p10 > MAX_BAND_RATIO:
        return (
            f"the band of measured over predicted step time, {p10:.3g}-{p90:.3g}, spans more than "
            f"{MAX_BAND_RATIO:g}x or lies over {MAX_BAND_RATIO:g}x from the prediction"
        )
    return None


def fitted_band(text: str | None) -> Band | None:
    """The band of the profile file ``--profile`` names, or None: no profile, an inline one, or a file whose [fit]
    table has none (written by hand, or by an older calibrate)."""
    if text is None or not text.strip() or _inline(text.strip()):
        return None
    path = text.strip()
    fit = _read(path).get("fit", {})
    if not isinstance(fit, dict) or not {"time_ratio_p10", "time_ratio_p90", "runs"} <= set(fit):
        return None
    p10, p90, runs = fit["time_ratio_p10"], fit["time_ratio_p90"], fit["runs"]
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (p10, p90, runs))
    if not numbers or not 0 < p10 <= p90 < float("inf") or runs < 1 or runs != int(runs):
        raise ValueError(f"profile {path}: [fit] needs 0 < time_ratio_p10 <= time_ratio_p90 and runs >= 1")
    problem = band_problem(float(p10), float(p90))
    if problem is not None:
        raise ValueError(f"profile {path}: {problem}: refit it from runs that agree (meshplan calibrate)")
    return Band(p10=float(p10), p90=float(p90), runs=int(runs))


def dump_profile(profile: Profile, fit: dict[str, float] | None = None) -> str:
    """The TOML text of a profile, with the numbers of its fit in a [fit] table."""
    lines = [
        "# meshplan cluster profile: scales on the catalog's GPU and link constants, and the host's time per step",
        *(f"{name} = {getattr(profile, name):.4f}" for name in CONSTANTS),
        f"source = {_quote(profile.source)}",
    ]
    if fit:
        lines += ["", "[fit]", *(f"{k} = {v:.6g}" for k, v in fit.items())]
    return "\n".join(lines) + "\n"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
