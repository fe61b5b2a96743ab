"""Pipeline parallelism: which layers a stage holds, what is in flight, and the bubble.

Symbols: p = pp, v = vpp (virtual stages per rank), m = micro-batches per step
per pipeline, i = stage index (0 holds the embedding, p-1 the output head).
"""

from __future__ import annotations

from meshplan.core.num import Num, ceil_div, maximum, minimum, where
from meshplan.spec.conditions import EVEN_SPLIT, StageSplit
from meshplan.spec.layout import Schedule


def stage_layers(num_layers: int, *, pp: Num, stage: Num, split: StageSplit = EVEN_SPLIT) -> Num:
    """Transformer layers on pipeline stage ``stage``.

    Layers are split as evenly as possible; when pp does not divide L, the
    stages short of a layer are the last, then the first, then inward, so the
    stages that also carry the embedding and the output head carry fewer
    layers (how Llama 3 405B put 126 layers on 16 stages: 7 on the first and
    last, 8 elsewhere; Llama 3 paper Sec. 3.3.2). A stated first or last
    stage (``split``) holds its stated layers, and the other stages split the
    rest by the same rule.
    """
    return stage_span(num_layers, pp=pp, stage=stage, split=split)[1]


def stage_span(num_layers: int, *, pp: Num, stage: Num, split: StageSplit = EVEN_SPLIT) -> tuple[Num, Num]:
    """(index of the first layer, number of layers) of ``stage``: one split computed once.

    With a stated split, stages 1 .. p-2 (or 1 .. p-1, 0 .. p-2 when one end is stated) split the
    L - f - l layers left as an even pipeline of their own; Megatron-LM's get_num_layers_to_build does the
    same where they divide evenly.
    """
    lead = 0 if split.first is None else 1
    inner_pp = maximum(pp - split.stated, 1)
    first, layers = _even_span(num_layers - split.stated_layers, pp=inner_pp, stage=stage - lead)
    first = first + (split.first or 0)
    if split.first is not None:
        first, layers = where(stage == 0, 0, first), where(stage == 0, split.first, layers)
    if split.last is not None:
        last = stage == pp - 1
        first, layers = where(last, num_layers - split.last, first), where(last, split.last, layers)
    return first, layers


def _even_span(num_layers: Num, *, pp: Num, stage: Num) -> tuple[Num, Num]:
    """The even split: ceil(L/p) layers a stage, short stages at the end first, then at the start."""
    base = ceil_div(num_layers, pp)
    deficit = base * pp - num_layers
    short_first = deficit // 2
    tail_start = pp - (deficit - short_first)
    first = stage * base - minimum(stage, short_first) - maximum(stage - tail_start, 0)
    layers = base - where(stage < short_first, 1, 0) - where(stage >= tail_start, 1, 0)
    return first, layers


def shortfall(num_layers: int, *, pp: Num, split: StageSplit = EVEN_SPLIT) -> tuple[Num, Num]:
    """How many leading and trailing stages of the evenly split part hold one layer fewer than the rest."""
    return even_shortfall(num_layers - split.stated_layers, pp=maximum(pp - split.stated, 1))


def even_shortfall(num_layers: Num, *, pp: Num) -> tuple[Num, Num]:
    """Leading and trailing stages of an even split of ``num_layers`` over ``pp`` that hold ceil(L/p) - 1."""
    deficit = ceil_div(num_layers, pp) * pp - num_layers
    return deficit // 2, deficit - deficit // 2


def micro_batches(global_batch: Num, *, micro_batch: Num, dp: Num) -> Num:
    """m: micro-batches each pipeline runs per step (global batch / (micro-batch * dp))."""
    return global_batch / (micro_batch * dp)


def in_flight(*, schedule: Num, pp: Num, vpp: Num, m: Num, stage: Num) -> Num:
    """Micro-batches whose activations stage ``stage`` holds at its peak, in units of its whole layer set.

    GPipe keeps all m; 1F1B and zero-bubble keep min(p - i, m) (Narayanan et al.
    2021 Sec. 2.2.1); interleaved 1F1B keeps (p - i - 1) * 2 + (v - 1) * p + 1
    model chunks of L/(p v) layers (Megatron's warm-up count), which for stage 0
    is p (1 + (p - 1)/(p v)) micro-batches (Korthikanti et al. 2022 Sec. 4.2.3);
    DualPipe keeps p + 1 micro-batches of one of its two stages (DeepSeek-V3,
    DualPipe README), i.e. (p + 1)/2 of its two-stage layer set.
    """
    one_f_one_b = minimum(pp - stage, m)
    chunks = minimum((pp - stage - 1) * 2 + (vpp - 1) * pp + 1, m * vpp)
    interleaved = chunks / vpp
    dualpipe = minimum((pp + 1) / 2, m)
    out = where(schedule == Schedule.GPIPE, m, one_f_one_b)
    out = where(schedule == Schedule.INTERLEAVED, interleaved, out)
    return where(schedule == Schedule.DUALPIPE, dualpipe, out)


def interleaved_forwards(*, pp: Num, vpp: Num, m: Num, stage: Num, group: Num) -> Num:
    """Chunk forwards rank ``stage`` has run when its first backward starts under interleaved 1F1B.

    Megatron's warm-up is (v - 1) N + 2 (p - 1 - r) chunk forwards with micro-batch groups of N (its
    microbatch_group_size_per_vp_stage, N = p by default; Llama 3 Sec. 3.3.2 sets N freely), and the steady
    state runs one more forward before the first backward; never more than the m v forwards of the step.
    """
    return minimum((vpp - 1) * group + 2 * (pp - 1 - stage) + 1, m * vpp)


def interleaved_chunk_forwards(*, pp: Num, vpp: Num, m: Num, stage: Num, group: Num, chunk: Num) -> Num:
    """Forwards of chunk ``chunk`` among those rank ``stage`` has run at its peak (groups of N per chunk)."""
    forwards = interleaved_forwards(pp=pp, vpp=vpp, m=m, stage=stage, group=group)
    return _chunk_share(forwards, vpp=vpp, group=group, chunk=chunk)


def _chunk_share(forwards: Num, *, vpp: Num, group: Num, chunk: Num) -> Num:
    """Of ``forwards`` run group by group (N micro-batches through each of v chunks in turn), chunk ``chunk``'s."""
    rounds = forwards // (group * vpp)
    rest = forwards - rounds * group * vpp
    return rounds * group + minimum(maximum(rest - chunk * group, 0), group)


def interleaved_layer_microbatches(*, pp: Num, vpp: Num, m: Num, stage: Num, group: Num, layers: Num) -> Num:
    """Layer-micro-batches (one layer's activations for one micro-batch) rank ``stage`` holds at its peak.

    Forwards run group by group: N micro-batches through chunk 0, the same N through chunk 1, ..., chunk v-1,
    then the next group. The rank's ``layers`` are spread over its v chunks as evenly as they go; where they
    do not divide, the short chunks are the first ones on the first half of the ranks (rank 0's first chunk
    holds only the embedding, as in Llama 3 405B's 126 layers on 16 x 8 chunks) and the last ones elsewhere
    (rank p-1's last chunk holds only the head). Llama 3 405B, p = 16, v = 8, N = 16, m = 32: 141 forwards
    of one layer on rank 1, and on rank 0 143 forwards of which 31 are of its empty first chunk: 112.
    """
    base = ceil_div(layers, vpp)
    short = base * vpp - layers
    first_half = stage < pp / 2
    forwards = interleaved_forwards(pp=pp, vpp=vpp, m=m, stage=stage, group=group)
    # whole rounds (N micro-batches through every chunk) hold N of every layer; the last, partial round has run
    # k whole chunks and ``partial`` micro-batches of chunk k
    rounds = forwards // (group * vpp)
    rest = forwards - rounds * group * vpp
    k = rest // group
    partial = rest - k * group

    def short_before(n: Num) -> Num:  # short chunks among the rank's first n
        return where(first_half, minimum(n, short), maximum(n - (vpp - short), 0))

    layers_before = k * base - short_before(k)
    layers_of_k = base - (short_before(k + 1) - short_before(k))
    return rounds * group * layers + group * layers_before + partial * layers_of_k


def stage_copies(schedule: Num) -> Num:
    """Parameter copies per rank: DualPipe holds two stages (i and p-1-i), every other schedule one."""
    return where(schedule == Schedule.DUALPIPE, 2, 1)
