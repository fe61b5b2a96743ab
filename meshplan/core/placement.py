"""Placement: how the mesh axes land on scale-up domains and the scale-out fabric.

Ranks are numbered with the first axis of ``order`` varying fastest, and
consecutive ranks fill one scale-up domain (NVLink node) before the next.
A group along an axis of size n whose ranks are ``stride`` apart is priced as
the least contained group of its axis, since a collective waits for the
slowest: it touches ``domains_touched`` domains, priced as the fewest whole
shares of its ranks that many or more (``outer``, each of ``inner`` = n / outer
members). Where the domain D and stride x n are powers of two this is
min(n, max(1, D / stride)) members in n / that domains; where they are not (a
node of 3 or 6 GPUs, an NVL72 rack under EP 16-128), some groups straddle a
domain boundary, and the worst of them crosses the fabric. The default order
puts the chattiest axis innermost, on the fastest link: tp, cp, ep, dp_shard,
dp_replicate, pp.

EP is not a mesh factor. With expert TP equal to TP, expert groups take the
innermost ``ep`` ranks of the cp x dp_shard x dp_replicate extent, in the
order those axes appear, and the experts' TP group is the TP group. Under
MoE parallel folding (expert TP below TP; Liu et al. 2025, arXiv:2504.14960)
the experts' mesh etp x ep x edp fills the ranks of the tp x cp x dp block
innermost first, as Megatron-Core's expert RankGenerator orders it
(tp-ep-dp-pp with expert TP for tp): the expert-TP group is the innermost
``etp`` ranks and EP's neighbours are ``etp`` ranks apart, so ep x etp <=
domain keeps an expert group inside one scale-up domain while attention uses
TP.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.core.num import Num, gcd, minimum, where

AXES = ("tp", "cp", "ep", "dp_shard", "dp_replicate", "pp")
DEFAULT_ORDER = AXES
MESH_AXES = ("tp", "cp", "dp_shard", "dp_replicate", "pp")
DATA_AXES = ("cp", "dp_shard", "dp_replicate")


def parse_order(text: str) -> tuple[str, ...]:
    """An axis order such as 'tp,cp,ep,dp_shard,dp_replicate,pp'; 'dp' stands for dp_shard,dp_replicate."""
    names: list[str] = []
    for raw in text.split(","):
        name = raw.strip().lower().replace("-", "_")
        names += ["dp_shard", "dp_replicate"] if name == "dp" else [name] if name else []
    unknown = [n for n in names if n not in AXES]
    if unknown:
        raise ValueError(f"unknown axis {unknown[0]!r} in axis order (axes: {', '.join(AXES)})")
    if len(set(names)) != len(names):
        raise ValueError(f"axis order repeats an axis: {text}")
    missing = [n for n in MESH_AXES if n not in names]
    if missing:
        raise ValueError(f"axis order misses {', '.join(missing)} (give all of {', '.join(MESH_AXES)})")
    if "ep" not in names:
        names.insert(names.index("dp_shard"), "ep")
    return tuple(names)


@dataclass(frozen=True, slots=True, kw_only=True)
class AxisPlacement:
    """Where the groups of one axis sit."""

    axis: str
    size: Num
    stride: Num
    """Rank distance between neighbours of one group."""
    inner: Num
    """Members of one group inside each scale-up domain."""
    outer: Num
    """Scale-up domains one group spans."""

    @property
    def tier(self) -> Num:
        """Scale-up when a whole group sits in one domain, scale-out otherwise (vectorized as a bool array)."""
        return self.outer > 1


def _stride_of(axis: str, sizes: dict[str, Num], order: tuple[str, ...]) -> Num:
    """Product of the mesh axes inside ``axis`` (EP's stride is that of the first data axis it spans)."""
    stride: Num = 1
    for name in order:
        if name == axis:
            return stride
        if name != "ep":
            stride = stride * sizes[name]
    raise AssertionError(f"axis {axis} missing from order")


def place_axis(axis: str, *, sizes: dict[str, Num], order: tuple[str, ...], domain: int) -> AxisPlacement:
    """Placement of one axis for a layout given by ``sizes`` (ints or arrays); ``etp`` is the experts' TP."""
    size = sizes[axis]
    stride = _expert_stride(axis, sizes, order) if axis in ("ep", "etp") else _stride_of(axis, sizes, order)
    outer = divisor_at_least(size, domains_touched(size=size, stride=stride, domain=domain))
    return AxisPlacement(axis=axis, size=size, stride=stride, inner=size // outer, outer=outer)


def divisor_at_least(n: Num, least: Num) -> Num:
    """The smallest divisor of ``n`` no less than ``least`` (1 <= least <= n): the domains a group's collectives
    are priced over, as whole shares of its ranks (its ``inner`` members each)."""
    if np.ndim(n) == 0 and np.ndim(least) == 0:
        return next(k for k in range(int(least), int(n) + 1) if n % k == 0)
    n, k = np.broadcast_arrays(np.asarray(n), np.asarray(least))
    k = k.copy()
    short = np.flatnonzero(n % k)  # the few layouts whose count of domains does not divide the group
    while short.size:
        k[short] += 1
        short = short[(n[short] % k[short]) != 0]
    return k


def domains_touched(*, size: Num, stride: Num, domain: int) -> Num:
    """Domains the least contained group of an axis touches, ranks filling domains of ``domain`` in turn.

    The groups of one block of stride x size ranks interleave; block c starts at c x stride x size, whose offsets
    in a domain are the multiples of g = gcd(stride x size, domain), so a group starts at most
    r = domain - g + min(stride, g) - 1 ranks into a domain (a fleet of domain / g blocks or more reaches it).
    Members less than a domain apart skip none: the group touches floor((r + (size - 1) stride) / domain) + 1
    domains; members a domain or more apart touch one each."""
    g = gcd(stride * size, domain)
    start = domain - g + minimum(stride, g) - 1
    touched = (start + (size - 1) * stride) // domain + 1
    return where(stride >= domain, size, minimum(size, touched))


def whole_node_size(span: int, domain: int) -> int:
    """The most GPUs of a ``domain``-GPU node a job can take so that groups spanning ``span`` consecutive ranks
    never straddle two nodes (the ``--node-size`` to type for a scheduler that gives the job that many a node)."""
    return domain // span * span


def _expert_stride(axis: str, sizes: dict[str, Num], order: tuple[str, ...]) -> Num:
    """Stride of the experts' EP or TP group: on the data axes and the TP axis when expert TP is TP; folded
    (expert TP below TP), the expert mesh fills the non-pipeline ranks from the innermost, expert TP first."""
    tp, etp = sizes["tp"], sizes.get("etp", sizes["tp"])
    base = _stride_of(next(n for n in order if n in MESH_AXES and n != "pp"), sizes, order)
    if axis == "etp":
        return where(etp == tp, _stride_of("tp", sizes, order), base)
    # expert groups start at the innermost data axis (exact while ep fits in that axis)
    plain = _stride_of(next(n for n in order if n in DATA_AXES), sizes, order)
    return where(etp == tp, plain, base * etp)


def place(sizes: dict[str, Num], *, order: tuple[str, ...] = DEFAULT_ORDER, domain: int) -> dict[str, AxisPlacement]:
    """Placement of every axis and of the experts' TP group (``etp``); ``sizes`` maps tp, cp, ep, dp_shard,
    dp_replicate, pp and (optionally) etp to degrees."""
    out = {axis: place_axis(axis, sizes=sizes, order=order, domain=domain) for axis in AXES}
    out["etp"] = place_axis("etp", sizes={**sizes, "etp": sizes.get("etp", sizes["tp"])}, order=order, domain=domain)
    return out
