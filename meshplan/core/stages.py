"""The stage table: which layers each pipeline stage holds, and which stages can be the heaviest.

A stage's row is its layer count, how many of those are dense and how many MoE
(DeepSeek-V3 and kin put their dense layers first), whether it holds the
embedding (stage 0) or the output head (stage p-1). Memory, compute time and
collectives all read these rows, for one layout or a batch of them.

Which stage is heaviest is found, not assumed. Within a run of stages whose
rows are equal (same layer counts and kinds, no embedding, no head), every
term of the bill and of the compute time is the same or falls with the stage
index (micro-batches in flight fall from the first stage to the last under
every schedule). So the maximum of every term sits on the first stage of such
a run, on stage 0 or on stage p-1: those are the candidates
(``candidate_stages``); a property test holds them against every stage.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.core import pipeline
from meshplan.core.num import Num, ceil_div, maximum, minimum, where
from meshplan.spec.conditions import EVEN_SPLIT, StageSplit
from meshplan.spec.model import ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class StageRow:
    """What one pipeline stage holds (ints, or arrays with one entry per layout)."""

    stage: Num
    first_layer: Num
    """Index of its first transformer layer."""
    layers: Num
    dense_layers: Num
    """Layers with a dense MLP (they come first in the model)."""
    moe_layers: Num
    embedding: Num
    """1 on the stage that holds the token embedding (stage 0), else 0."""
    head: Num
    """1 on the stage that holds the final norm, the output head and the loss (stage p-1), else 0."""


def stage_row(model: ModelSpec, *, pp: Num, stage: Num, split: StageSplit = EVEN_SPLIT) -> StageRow:
    """The row of ``stage`` for a pipeline of ``pp`` stages (layers split as in ``pipeline.stage_layers``)."""
    first, layers = pipeline.stage_span(model.num_layers, pp=pp, stage=stage, split=split)
    dense = minimum(maximum(model.num_dense_mlp_layers - first, 0), layers)
    return StageRow(
        stage=stage,
        first_layer=first,
        layers=layers,
        dense_layers=dense,
        moe_layers=layers - dense,
        embedding=where(stage == 0, 1, 0),
        head=where(stage == pp - 1, 1, 0),
    )


def vocab_params_per_rank(model: ModelSpec, *, tp: Num) -> Num:
    """Parameters of one vocabulary matrix (the embedding or the output head) on one TP rank: V h / t."""
    return model.vocab_size * model.hidden / tp


def stage_table(model: ModelSpec, *, pp: int, split: StageSplit = EVEN_SPLIT) -> tuple[StageRow, ...]:
    """Every stage of one layout's pipeline."""
    return tuple(stage_row(model, pp=pp, stage=i, split=split) for i in range(pp))


def layer_stage(num_layers: int, *, pp: Num, layer: Num, split: StageSplit = EVEN_SPLIT) -> Num:
    """The stage that holds layer index ``layer`` (0 <= layer < num_layers); inverse of the layer split.

    A stated first stage holds layers [0, f), a stated last one [L - l, L); the stages between split the rest
    evenly: the first ``a`` of them hold ceil(R/q) - 1 layers, the next ones ceil(R/q), the last ``b`` again
    one fewer (``pipeline.stage_layers``).
    """
    lead = 0 if split.first is None else 1
    inner = lead + _even_layer_stage(
        num_layers - split.stated_layers,
        pp=maximum(pp - split.stated, 1),
        layer=layer - (split.first or 0),
    )
    if split.first is not None:
        inner = where(layer < split.first, 0, inner)
    if split.last is not None:
        inner = where(layer >= num_layers - split.last, pp - 1, inner)
    return inner


def _even_layer_stage(num_layers: Num, *, pp: Num, layer: Num) -> Num:
    """The stage of ``layer`` in an even split of ``num_layers`` over ``pp`` stages."""
    base = ceil_div(num_layers, pp)
    short_first, short_last = pipeline.even_shortfall(num_layers, pp=pp)
    short = maximum(base - 1, 1)  # base - 1 is 0 only when L == p (no short stages at all)
    head_layers = short_first * (base - 1)
    middle_stages = pp - short_first - short_last
    after_head = layer - head_layers
    in_middle = short_first + after_head // maximum(base, 1)  # base is 0 only when stated ends hold every layer
    in_tail = short_first + middle_stages + (after_head - middle_stages * base) // short
    return where(
        layer < head_layers,
        layer // short,
        where(after_head < middle_stages * base, in_middle, in_tail),
    )


def candidate_stages(
    model: ModelSpec, *, pp: Num, boundaries: tuple[int, ...] = (), split: StageSplit = EVEN_SPLIT
) -> tuple[Num, ...]:
    """Stages that between them hold the maximum of every per-stage term, for one layout or a batch.

    The first stage of every run of equal rows: stage 0 (embedding), stage 1, the first stage holding
    ceil(L/p) layers (of the evenly split part, after a stated first stage), the stage holding the first MoE
    layer and the one after it, and the same pair at every other layer ``boundaries`` (e.g. the end of a
    frozen prefix); stage p-1 (head). Duplicates are harmless. Where the model's layers are all of one kind,
    the MoE pair is left out.
    """
    last = pp - 1
    lead = 0 if split.first is None else 1
    short_first, _ = pipeline.shortfall(model.num_layers, pp=pp, split=split)
    out: list[Num] = [0, minimum(1, last), minimum(lead + short_first, last), last]
    splits = list(boundaries)
    if 0 < model.num_dense_mlp_layers < model.num_layers:
        splits.append(model.num_dense_mlp_layers)
    for layer in splits:
        if 0 < layer < model.num_layers:
            at = layer_stage(model.num_layers, pp=pp, layer=layer, split=split)
            out += [at, minimum(at + 1, last)]
    return tuple(out)
