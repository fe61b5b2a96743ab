"""Parameters one GPU of a pipeline stage holds before any ZeRO sharding: its layers' share under TP and EP
(expert TP folded or not), the embedding on the first stage, the head (and MTP) on the last, times the model chunks
its schedule holds. Every function broadcasts over numpy arrays of layouts."""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.core import pipeline
from meshplan.core.num import Num, maximum, minimum, where
from meshplan.core.params import LayerParams, ParamCount
from meshplan.core.stages import stage_row, vocab_params_per_rank
from meshplan.spec.conditions import EVEN_SPLIT, StageSplit
from meshplan.spec.layout import LayoutLike
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload


def layer_rank_params(lp: LayerParams, model: ModelSpec, *, tp: Num, ep: Num, etp: Num = None) -> tuple[Num, Num]:
    """(dense, expert) parameters of one layer on one rank: dense ones split by TP, routed experts by EP x
    expert TP (``etp``, None: tp)."""
    sharded = lp.attention - lp.kv - lp.attention_replicated + lp.mlp - lp.mlp_replicated + lp.shared_experts
    kv_split = minimum(tp, model.num_kv_heads)
    dense = sharded / tp + lp.kv / kv_split + lp.attention_replicated + lp.mlp_replicated + lp.router + lp.norms
    return dense, lp.routed_experts / (ep * (tp if etp is None else etp))


@dataclass(frozen=True, slots=True, kw_only=True)
class StageParams:
    """Parameters one GPU of a pipeline stage holds before any ZeRO sharding."""

    dense: Num
    """Parameters every expert-parallel rank holds alike."""
    experts: Num
    """This rank's share of the routed experts."""
    largest_layer: Num
    """The biggest single layer on the rank (dense + expert share): what FSDP gathers at once."""
    dense_layers: Num
    moe_layers: Num


def stage_params(
    params: ParamCount,
    model: ModelSpec,
    *,
    tp: Num,
    pp: Num,
    ep: Num,
    stage: Num,
    copies: Num = 1,
    split: StageSplit = EVEN_SPLIT,
    etp: Num = None,
) -> StageParams:
    """Parameters on one GPU of pipeline stage ``stage`` (``copies`` = 2 under DualPipe; ``etp``: expert TP,
    None: tp)."""
    row = stage_row(model, pp=pp, stage=stage, split=split)
    dense_layers, moe_layers = row.dense_layers, row.moe_layers
    d_dense, _ = layer_rank_params(params.dense_layer, model, tp=tp, ep=ep, etp=etp)
    m_dense, m_expert = layer_rank_params(params.moe_layer, model, tp=tp, ep=ep, etp=etp)
    dense = dense_layers * d_dense + moe_layers * m_dense
    experts = moe_layers * m_expert
    is_first, is_last = row.embedding == 1, row.head == 1
    vocab_rows = vocab_params_per_rank(model, tp=tp)
    dense = dense + where(is_first, vocab_rows + params.position_embedding, 0)
    head = where(model.tied_embeddings & (pp == 1), 0, vocab_rows)  # tied and pp > 1: the last stage keeps a copy
    dense = dense + where(is_last, head + params.final_norm, 0)
    if model.mtp_layers:
        mtp_dense = model.mtp_layers * (m_dense + 2 * model.hidden**2 / tp + 3 * model.norm_params)
        dense = dense + where(is_last, mtp_dense, 0)
        experts = experts + where(is_last, model.mtp_layers * m_expert, 0)
    largest = maximum(where(dense_layers > 0, d_dense, 0), where(moe_layers > 0, m_dense + m_expert, 0))
    return StageParams(
        dense=dense * copies,
        experts=experts * copies,
        largest_layer=largest,
        dense_layers=dense_layers * copies,
        moe_layers=moe_layers * copies,
    )


def layout_stage_params(
    params: ParamCount, model: ModelSpec, lay: LayoutLike, workload: Workload, *, stage: Num
) -> StageParams:
    """``stage_params`` of pipeline stage ``stage`` of a layout (or a batch of them), its stages split as the
    workload's conditions say and its model chunks as its schedule holds them."""
    return stage_params(
        params,
        model,
        tp=lay.tp,
        pp=lay.pp,
        ep=lay.ep,
        stage=stage,
        copies=pipeline.stage_copies(lay.schedule),
        split=workload.conditions.stage_split,
        etp=lay.etp,
    )
