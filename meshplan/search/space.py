"""The space of layouts: every factorization of the fleet and every execution choice, as arrays.

A candidate is one entry of a LayoutBatch: the same fields as Layout, each an
integer array, so the core's formulas evaluate a million candidates at once.
Candidates that break a rule are not dropped silently: ``rejections`` keeps a
count per reason.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from functools import lru_cache

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
    etp: IntArray
    """Expert tensor-parallel degree (tp, or 1 where EP folds over TP)."""
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
        if index.dtype == np.bool_:  # a mask is counted again for every field it indexes: once is enough
            index = np.flatnonzero(index)
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
            expert_tp=None if v["etp"] == v["tp"] else v["etp"],
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
        return _from_columns({f.name: [getattr(x, f.name) for x in layouts] for f in fields(LayoutBatch)})


def _from_columns(cols: Mapping[str, npt.ArrayLike]) -> LayoutBatch:
    """A batch from one column per field: ``sp`` as booleans, the others as int64 (arrays already so are not copied)."""

    def ints(name: str) -> IntArray:
        return np.asarray(cols[name], dtype=np.int64)

    return LayoutBatch(
        tp=ints("tp"),
        pp=ints("pp"),
        vpp=ints("vpp"),
        cp=ints("cp"),
        ep=ints("ep"),
        etp=ints("etp"),
        dp_shard=ints("dp_shard"),
        dp_replicate=ints("dp_replicate"),
        sp=np.asarray(cols["sp"], dtype=np.bool_),
        zero=ints("zero"),
        recompute=ints("recompute"),
        schedule=ints("schedule"),
        cp_kind=ints("cp_kind"),
        micro_batch=ints("micro_batch"),
    )


@lru_cache(maxsize=4096)
def divisors(n: int) -> tuple[int, ...]:
    """The divisors of ``n`` in increasing order, found in O(sqrt n) steps (once per n: a fleet's mesh shapes
    ask for the same few numbers many times)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return (*small, *large[::-1])


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
    cp_all_gather: bool = True
    """Also try the ring-CP layouts that fit, within ``rank.ALL_GATHER_WINDOW`` of the fastest, with their K/V
    all-gathered instead (Llama 3's context parallelism, Megatron-Core's ``--cp-comm-type allgather``): that pays
    no ring bookkeeping but holds the gathered K/V, so a layout too big as a ring is too big gathered. Off when
    the CP kind is pinned."""
    zero_bubble: bool = False
    """Also try the ZB-H1 schedule for pipelines without interleaving."""
    dualpipe: bool = True
    """Also try DeepSeek's DualPipe where it runs (``dualpipe_runs``): an even pipeline without interleaving, an
    even number of micro-batches, at least two per stage."""
    micro_batch_ladder: bool = True
    """Past the largest of ``micro_batch_choices``, double the micro-batch of the layouts that fit with it, within
    30% of the fastest, while they still fit (``search.rank``), up to ``MAX_MICRO_BATCH``: larger micro-batches
    are tried only where memory allows them. Off when the micro-batch is pinned."""

    def left_out(self) -> list[str]:
        """What this space does not enumerate, in words (the planner prints it beside its plans)."""
        out = ["the GPipe schedule (the bubble of 1F1B with every micro-batch's activations held: never faster)"]
        if not self.zero_bubble:
            out.append("the zero-bubble schedule (ZB-H1; pin --schedule zero-bubble to search it)")
        if not self.dualpipe:
            out.append("the DualPipe schedule")
        top = self.micro_batch_choices[-1]
        if self.micro_batch_ladder:
            out.append(
                f"micro-batches above {top}, but where {top} fits within 30% of the fastest (doubled while they fit, "
                f"up to {MAX_MICRO_BATCH})"
            )
        else:
            out.append(f"micro-batches other than {', '.join(map(str, self.micro_batch_choices))}")
        out.append(f"virtual stages other than {', '.join(map(str, self.vpp_choices))}")
        out.append(f"context parallelism above {self.max_cp}")
        return out


MAX_MICRO_BATCH = 1024
"""The micro-batch ladder's top rung (``SearchSpace.micro_batch_ladder``)."""


def dualpipe_runs(batch: LayoutBatch, global_batch: int) -> npt.NDArray[np.bool_]:
    """Which layouts DeepSeek's DualPipe runs: an even pipeline without virtual stages, and an even number of
    micro-batches, at least twice the stages (``DualPipe.step`` asserts ``num_ranks % 2 == 0`` and
    ``num_chunks % 2 == 0 and num_chunks >= num_ranks * 2``, deepseek-ai/DualPipe dualpipe/dualpipe.py)."""
    per_step = batch.micro_batch * batch.dp
    m = global_batch // per_step
    whole = global_batch % per_step == 0
    runs = (batch.vpp == 1) & (batch.pp >= 2) & (batch.pp % 2 == 0) & whole & (m % 2 == 0) & (m >= 2 * batch.pp)
    return np.asarray(runs, dtype=np.bool_)


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


CHUNK_CANDIDATES = 1 << 18
"""Candidates evaluated at once by a chunked search: bounds its memory (about 0.3 GB a chunk) on any fleet."""


def _outer_rows(
    model: ModelSpec, *, num_gpus: int, space: SearchSpace, domain: int, allow_cross_node_tp: bool
) -> tuple[int, Iterator[tuple[int, int, int, int, int, int, int]]]:
    """(how many, the rows lazily): a fleet size with many divisors has tens of millions of rows."""
    max_tp = space.max_tp or (num_gpus if allow_cross_node_tp else domain)
    shapes = [
        (tp, cp, pp, dp, expert_degrees(model, tp=tp, data=dp * cp), divisors(dp))  # the rules reject bad ep
        for tp, cp, pp, dp in _mesh_shapes(num_gpus, model, max_tp, space.max_cp)
    ]
    count = sum(len(experts) * len(shards) for *_, experts, shards in shapes)
    rows = (
        (tp, cp, pp, dp, ep, etp, shard)
        for tp, cp, pp, dp, experts, shards in shapes
        for ep, etp in experts
        for shard in shards
    )
    return count, rows


def expert_degrees(model: ModelSpec, *, tp: int, data: int) -> list[tuple[int, int]]:
    """(ep, expert TP) pairs: EP out of the data ranks with expert TP = tp, and, where tp > 1, EP folded over
    tp x data with expert TP 1 (MoE parallel folding: experts without TP, EP inside the NVLink domain)."""
    if model.moe is None:
        return [(1, tp)]
    plain = [(ep, tp) for ep in divisors(data)]
    return plain + ([(ep, 1) for ep in divisors(tp * data)] if tp > 1 else [])


MAX_CANDIDATES = 200_000_000
"""Upper estimate of the layouts one search may evaluate (about 2 minutes on one core): past it, refused."""


def _inner_count(space: SearchSpace) -> int:
    """Inner rows per outer row at most: every (vpp, micro-batch, zero, recompute, sp) choice, and the rows
    without virtual stages again for each extra schedule searched."""
    sizes = (space.micro_batch_choices, space.zero_choices, space.recompute_choices, (0, 1))
    count = 1
    for values in sizes:
        count *= len(values)
    return count * (len(space.vpp_choices) + int(space.zero_bubble) + int(space.dualpipe))


def layout_chunks(
    model: ModelSpec,
    *,
    num_gpus: int,
    global_batch: int,
    space: SearchSpace,
    domain: int,
    allow_cross_node_tp: bool,
    chunk: int = CHUNK_CANDIDATES,
) -> tuple[int, Iterator[LayoutBatch]]:
    """(how many batches, the batches) of ``enumerate_layouts``'s candidates, in its order, about ``chunk`` each
    (at least one mesh row): a search over millions of layouts holds one batch at a time, and the count lets a
    long search show its progress."""
    count, rows = _outer_rows(
        model, num_gpus=num_gpus, space=space, domain=domain, allow_cross_node_tp=allow_cross_node_tp
    )
    inner = _inner_count(space)
    if count * inner > MAX_CANDIDATES:
        raise ValueError(
            f"a search of {num_gpus:,} GPUs would evaluate up to {count * inner:.2g} layouts, over the limit of "
            f"{MAX_CANDIDATES:.0e}: give a fleet size with fewer divisors (e.g. a power of two) or fewer GPUs"
        )
    step = max(1, chunk // inner)
    num_chunks = max(1, -(-count // step))
    return num_chunks, (
        _expand(list(itertools.islice(rows, step)), global_batch=global_batch, space=space) for _ in range(num_chunks)
    )


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

    Each mesh shape (tp, cp, pp, dp) with each expert and shard degree is an
    outer row; each (vpp, micro-batch, zero, recompute, sp) choice an inner
    row. Outer rows that accept the same inner rows are crossed with them in
    one step. Redundant spellings of one layout are not generated: ZeRO needs
    a shard group of more than one rank, sequence parallelism needs TP,
    virtual stages need a pipeline, EP folded over TP needs sequence parallelism.
    """
    _, chunks = layout_chunks(
        model,
        num_gpus=num_gpus,
        global_batch=global_batch,
        space=space,
        domain=domain,
        allow_cross_node_tp=allow_cross_node_tp,
    )
    batches = list(chunks)
    if len(batches) == 1:
        return batches[0]
    return _from_columns({f.name: np.concatenate([getattr(b, f.name) for b in batches]) for f in fields(LayoutBatch)})


def _expand(
    rows: list[tuple[int, int, int, int, int, int, int]], *, global_batch: int, space: SearchSpace
) -> LayoutBatch:
    """The outer rows crossed with the inner choices each accepts."""
    names = [f.name for f in fields(LayoutBatch)]
    if not rows:
        return _from_columns({k: np.zeros(0, dtype=np.bool_ if k == "sp" else np.int64) for k in names})
    outer = np.asarray(rows, dtype=np.int64)
    tp, cp, pp, dp, ep, etp, shard = outer.T
    inner_names = ("vpp", "micro_batch", "zero", "recompute", "sp")
    grids = np.meshgrid(
        *(
            np.asarray(v, dtype=np.int64)
            for v in (space.vpp_choices, space.micro_batch_choices, space.zero_choices, space.recompute_choices, (0, 1))
        ),
        indexing="ij",
    )
    inner = dict(zip(inner_names, (g.ravel() for g in grids), strict=True))
    mbs = np.asarray(space.micro_batch_choices, dtype=np.int64)
    fits_batch = (global_batch % (mbs[None, :] * dp[:, None])) == 0  # which micro-batches divide B/dp
    fits_batch[~fits_batch.any(axis=1), 0] = True  # none does: keep the first, for the rules to reject
    zero_mode = np.where(shard > 1, 2, np.where(cp > 1, 1, 0))  # 0: zero 0 only, 1: any, 2: zero > 0 only
    folded = etp != tp  # MoE parallel folding dispatches sequence-parallel shards: SP only
    key = np.column_stack([pp > 1, tp > 1, zero_mode, folded, fits_batch]).astype(np.int64)
    uniq, group = np.unique(key, axis=0, return_inverse=True)
    group = group.ravel()
    cols: dict[str, list[IntArray]] = {k: [] for k in names}
    for g, k in enumerate(uniq):
        has_pp, has_tp, mode, is_folded, allowed = bool(k[0]), bool(k[1]), int(k[2]), bool(k[3]), k[4:].astype(bool)
        take = (inner["vpp"] == 1) | has_pp
        take &= (inner["sp"] == 0) | has_tp
        take &= (inner["sp"] == 1) | (not is_folded)
        take &= np.isin(inner["micro_batch"], mbs[allowed])
        take &= {0: inner["zero"] == 0, 1: np.ones_like(take), 2: inner["zero"] > 0}[mode]
        sel = np.flatnonzero(group == g)
        n_in, n_out = int(take.sum()), len(sel)
        for name, values in (("tp", tp), ("cp", cp), ("pp", pp), ("ep", ep), ("etp", etp), ("dp_shard", shard)):
            cols[name].append(np.repeat(values[sel], n_in))
        cols["dp_replicate"].append(np.repeat(dp[sel] // shard[sel], n_in))
        for name in inner_names:
            cols[name].append(np.tile(inner[name][take], n_out))
    merged = {k: np.concatenate(v) for k, v in cols.items() if v}
    merged["schedule"] = np.where(merged["vpp"] > 1, int(Schedule.INTERLEAVED), int(Schedule.ONE_F_ONE_B))
    merged["cp_kind"] = np.full(len(merged["tp"]), int(space.cp_kind), dtype=np.int64)
    merged["sp"] = merged["sp"].astype(np.bool_)
    out = _from_columns({k: merged[k] for k in names})
    extra = []
    if space.zero_bubble:
        extra.append((out.take((out.vpp == 1) & (out.pp > 1)), Schedule.ZERO_BUBBLE))
    if space.dualpipe:
        extra.append((out.take(dualpipe_runs(out, global_batch)), Schedule.DUALPIPE))
    if not extra:
        return out
    parts = [out] + [dataclasses.replace(b, schedule=np.full(len(b), int(s), dtype=np.int64)) for b, s in extra]
    return _from_columns({k: np.concatenate([getattr(b, k) for b in parts]) for k in names})
