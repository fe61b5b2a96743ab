"""A cluster profile: shared scales on the catalog's constants, fitted from measured runs.

The catalog holds each GPU kind's and link kind's constants with their sources.
A profile does not replace them: it scales them all at once, as one cluster
(or one fit over published sources) says its stack runs faster or slower than
the catalog's physics. ``meshplan calibrate`` writes one; ``--profile FILE``
applies it; ``meshplan validate`` fits one per left-out source.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path

from meshplan.spec.cluster import Cluster, Link

MAX_EFFICIENCY = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """Scales on the constants of every GPU kind and link kind of a fleet."""

    compute_scale: float = 1.0
    """Multiplies the GPU kind's matmul and attention efficiencies (capped at 1: never above peak)."""
    comm_scale: float = 1.0
    """Multiplies the bandwidth every collective reaches on every link (scale-up and scale-out)."""
    source: str = ""
    """How it was fitted: which runs, how many, the fit and held-out errors."""

    def __post_init__(self) -> None:
        for name in ("compute_scale", "comm_scale"):
            value = getattr(self, name)
            if not 0.05 <= value <= 20:
                raise ValueError(f"profile {name} must be in [0.05, 20], got {value}")

    @property
    def is_identity(self) -> bool:
        return self.compute_scale == 1.0 and self.comm_scale == 1.0


IDENTITY = Profile()


def _link(link: Link, scale: float) -> Link:
    return dataclasses.replace(link, bandwidth_bytes_per_s=link.bandwidth_bytes_per_s * scale)


def apply_profile(cluster: Cluster, profile: Profile) -> Cluster:
    """``cluster`` with its GPU's efficiencies and its links' bandwidths scaled by ``profile``."""
    if profile.is_identity:
        return cluster
    cal = cluster.gpu.calibration
    k = profile.compute_scale
    cal = dataclasses.replace(
        cal,
        matmul_efficiency_max=min(cal.matmul_efficiency_max * k, MAX_EFFICIENCY),
        attention_efficiency=min(cal.attention_efficiency * k, MAX_EFFICIENCY),
        attention_scale=min(cal.attention_scale * k, 2.0),
    )
    return dataclasses.replace(
        cluster,
        gpu=dataclasses.replace(cluster.gpu, calibration=cal),
        scale_up=_link(cluster.scale_up, profile.comm_scale),
        scale_out=_link(cluster.scale_out, profile.comm_scale),
    )


def load_profile(path: str | Path) -> Profile:
    """A profile TOML file as ``meshplan calibrate`` writes it; unknown keys are errors."""
    data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    known = {f.name for f in dataclasses.fields(Profile)}
    unknown = sorted(set(data) - known - {"fit"})
    if unknown:
        raise ValueError(f"profile {path}: unknown keys {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    return Profile(**{k: v for k, v in data.items() if k in known})


def parse_profile(text: str | None, *, files: bool = True) -> Profile:
    """A profile from ``--profile``: inline ``compute_scale=0.9,comm_scale=1.2``, or (``files``) a TOML file."""
    if text is None or not text.strip():
        return IDENTITY
    text = text.strip()
    if "=" in text and not text.endswith(".toml"):
        values: dict[str, float] = {}
        for item in filter(None, (x.strip() for x in text.split(","))):
            key, _, value = item.partition("=")
            key = key.strip().replace("-", "_")
            if key not in ("compute_scale", "comm_scale"):
                raise ValueError(f"--profile: unknown key {key!r} (known: compute_scale, comm_scale)")
            try:
                values[key] = float(value)
            except ValueError:
                raise ValueError(f"--profile: {key} must be a number, got {value.strip()[:40]!r}") from None
        return Profile(**values, source="inline")
    if not files:
        raise ValueError(
            "--profile: give the scales inline (compute_scale=0.9,comm_scale=1.2); files are read by the CLI"
        )
    return load_profile(text)


def dump_profile(profile: Profile, fit: dict[str, float] | None = None) -> str:
    """The TOML text of a profile, with the numbers of its fit in a [fit] table."""
    lines = [
        "# meshplan cluster profile: shared scales on the catalog's GPU and link constants",
        f"compute_scale = {profile.compute_scale:.4f}",
        f"comm_scale = {profile.comm_scale:.4f}",
        f"source = {_quote(profile.source)}",
    ]
    if fit:
        lines += ["", "[fit]", *(f"{k} = {v:.6g}" for k, v in fit.items())]
    return "\n".join(lines) + "\n"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
