"""Pipeline parallelism: which layers a stage holds, what is in flight, and the bubble.

Symbols: p = pp, v = vpp (virtual stages per rank), m = micro-batches per step
per pipeline, i = stage index (0 holds the embedding, p-1 the output head).
"""

from __future__ import annotations

from meshplan.core.num import Num, ceil_div, maximum, minimum, where
from meshplan.spec.layout import Schedule


def stage_layers(num_layers: int, *, pp: Num, stage: Num) -> Num:
    """Transformer layers on pipeline stage ``stage``.

    Layers are split as evenly as possible; when pp does not divide L, the
    stages short of a layer are the last, then the first, then inward, so the
    stages that also carry the embedding and the output head carry fewer
    layers (how Llama 3 405B put 126 layers on 16 stages: 7 on the first and
    last, 8 elsewhere; Llama 3 paper Sec. 3.3.2).
    """
    return stage_span(num_layers, pp=pp, stage=stage)[1]


def stage_span(num_layers: int, *, pp: Num, stage: Num) -> tuple[Num, Num]:
    """(index of the first layer, number of layers) of ``stage``: one split computed once."""
    base = ceil_div(num_layers, pp)
    deficit = base * pp - num_layers
    short_first = deficit // 2
    tail_start = pp - (deficit - short_first)
    first = stage * base - minimum(stage, short_first) - maximum(stage - tail_start, 0)
    layers = base - where(stage < short_first, 1, 0) - where(stage >= tail_start, 1, 0)
    return first, layers


def shortfall(num_layers: int, *, pp: Num) -> tuple[Num, Num]:
    """How many leading and trailing stages hold one layer fewer than ceil(L/p)."""
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


def stage_copies(schedule: Num) -> Num:
    """Parameter copies per rank: DualPipe holds two stages (i and p-1-i), every other schedule one."""
    return where(schedule == Schedule.DUALPIPE, 2, 1)
