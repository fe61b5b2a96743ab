"""The space of layouts: every factorization of the fleet and every execution choice, as arrays.

A candidate is one entry of a LayoutBatch: the same fields as Layout, each an
integer array, so the core's formulas evaluate a million candidates at once.
Candidates that break a rule are not dropped silently: ``rejections`` keeps a
count per reason.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

from meshplan.spec.layout import ContextParallel, Layout, Recompute, Schedule, ZeroStage
from meshplan.spec.model import ModelSpec

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutBatch:
    """Many layouts at once: field i of every array describes candidate i."""

    tp: IntArray
    pp: IntArray
    vpp: IntArray
    cp: IntArray
    ep: IntArray
    dp_shard: IntArray
    dp_replicate: IntArray
    sp: npt.NDArray[np.bool_]
    zero: IntArray
    recompute: IntArray
    schedule: IntArray
    cp_kind: IntArray
    micro_batch: IntArray

    def __len__(self) -> int:
        return int(self.tp.shape[0])

    @property
    def dp(self) -> IntArray:
        return self.dp_replicate * self.dp_shard

    @property
    def num_gpus(self) -> IntArray:
        return self.dp * self.cp * self.tp * self.pp

    def take(self, index: npt.NDArray[np.int64] | npt.NDArray[np.bool_]) -> LayoutBatch:
        """The candidates at ``index`` (an index array or a mask)."""
        return LayoutBatch(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def layout(self, i: int) -> Layout:
        """Candidate ``i`` as a validated Layout."""
        v = {f.name: getattr(self, f.name)[i].item() for f in fields(self)}
        return Layout(
            tp=v["tp"],
            pp=v["pp"],
            vpp=v["vpp"],
            cp=v["cp"],
            ep=v["ep"],
            dp_shard=v["dp_shard"],
            dp_replicate=v["dp_replicate"],
            sp=bool(v["sp"]),
            zero=ZeroStage(v["zero"]),
            recompute=Recompute(v["recompute"]),
            schedule=Schedule(v["schedule"]),
            cp_kind=ContextParallel(v["cp_kind"]),
            micro_batch=v["micro_batch"],
        )

    @staticmethod
    def of(layouts: list[Layout]) -> LayoutBatch:
        """A batch from single layouts (used to check that both paths agree)."""
        cols = {f.name: [getattr(x, f.name) for x in layouts] for f in fields(LayoutBatch)}
        return LayoutBatch(**{k: np.asarray(v, dtype=np.bool_ if k == "sp" else np.int64) for k, v in cols.items()})


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """Which values each axis may take, beyond what the fleet's size allows."""

    max_tp: int | None = None
    """Upper bound on TP (None: the scale-up domain; the planner may allow crossing it)."""
    max_cp: int = 64
    vpp_choices: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    micro_batch_choices: tuple[int, ...] = (1, 2, 4, 8, 16)
    zero_choices: tuple[int, ...] = (0, 1, 2, 3)
    recompute_choices: tuple[int, ...] = (0, 1, 2)
    cp_kind: ContextParallel = ContextParallel.RING
    zero_bubble: bool = False
    """Also try the ZB-H1 schedule for pipelines without interleaving."""


def _mesh_shapes(num_gpus: int, model: ModelSpec, max_tp: int, max_cp: int) -> list[tuple[int, int, int, int]]:
    """(tp, cp, pp, dp) with tp * cp * pp * dp = num_gpus."""
    out = []
    for tp in divisors(num_gpus):
        if tp > max_tp:
            break
        for cp in divisors(num_gpus // tp):
            if cp > max_cp:
                break
            for pp in divisors(num_gpus // (tp * cp)):
                out.append((tp, cp, pp, num_gpus // (tp * cp * pp)))
    return out


def _product(**axes: list[int]) -> dict[str, IntArray]:
    """The cartesian product of the value lists, one flat array per name."""
    grids = np.meshgrid(*[np.asarray(v, dtype=np.int64) for v in axes.values()], indexing="ij")
    return {name: g.ravel() for name, g in zip(axes, grids, strict=True)}


def enumerate_layouts(
    model: ModelSpec,
    *,
    num_gpus: int,
    global_batch: int,
    space: SearchSpace,
    domain: int,
    allow_cross_node_tp: bool,
) -> LayoutBatch:
    """Every candidate layout as arrays (before any rule or memory check).

    Redundant spellings of one layout are not generated: ZeRO needs a shard
    group of more than one rank, sequence parallelism needs TP, virtual
    stages need a pipeline.
    """
    max_tp = space.max_tp or (num_gpus if allow_cross_node_tp else domain)
    parts: list[dict[str, IntArray]] = []
    for tp, cp, pp, dp in _mesh_shapes(num_gpus, model, max_tp, space.max_cp):
        eps = divisors(dp * cp) if model.moe else [1]  # the rules reject what does not divide the experts
        vpps = [v for v in space.vpp_choices if v == 1 or pp > 1]
        mbs = [b for b in space.micro_batch_choices if global_batch % (b * dp) == 0] or [1]
        sps = [0, 1] if tp > 1 else [0]
        c = _product(
            ep=eps,
            dp_shard=divisors(dp),
            vpp=vpps,
            micro_batch=mbs,
            zero=list(space.zero_choices),
            recompute=list(space.recompute_choices),
            sp=sps,
        )
        keep = ((c["zero"] == 0) & (c["dp_shard"] == 1)) | ((c["zero"] > 0) & (c["dp_shard"] * cp > 1))
        c = {k: v[keep] for k, v in c.items()}
        n = len(c["ep"])
        c["schedule"] = np.where(c["vpp"] > 1, int(Schedule.INTERLEAVED), int(Schedule.ONE_F_ONE_B))
        if space.zero_bubble and pp > 1:
            zb = {k: v[c["vpp"] == 1] for k, v in c.items()}
            zb["schedule"] = np.full(len(zb["ep"]), int(Schedule.ZERO_BUBBLE))
            c = {k: np.concatenate([c[k], zb[k]]) for k in c}
            n = len(c["ep"])
        c["dp_replicate"] = dp // c["dp_shard"]
        for name, value in (("tp", tp), ("cp", cp), ("pp", pp), ("cp_kind", int(space.cp_kind))):
            c[name] = np.full(n, value, dtype=np.int64)
        parts.append(c)
    names = [f.name for f in fields(LayoutBatch)]
    if not parts:
        return LayoutBatch(**{k: np.zeros(0, dtype=np.bool_ if k == "sp" else np.int64) for k in names})
    merged = {k: np.concatenate([p[k] for p in parts]) for k in names}
    merged["sp"] = merged["sp"].astype(np.bool_)
    return LayoutBatch(**merged)
