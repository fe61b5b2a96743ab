"""Expert parallelism: a dispatch and a combine all-to-all per MoE layer forward and again backward, k b s h
bytes per rank each (k b s h / t with sequence parallelism: each rank dispatches its own s/t tokens); under
node-limited routing (at most M nodes per token, once per node) the share leaving the node is min(M, k) / k of
the unlimited one. With expert TP e_t > 1 and SP the expert-TP group all-gathers the dispatched rows before the experts
and reduce-scatters their outputs (forward; the reverse in backward), k b s h e_t / t bytes gathered per call
(Megatron-Core's all-to-all token dispatcher; MoE parallel folding, arXiv:2504.14960, Sec. 3)."""

from __future__ import annotations

from meshplan.core.comm.call import CollectiveCall, StageShape
from meshplan.core.comm.call import make_call as _call
from meshplan.core.comm.cost import Collective
from meshplan.core.comm.patterns import INDEX_BYTES, PATTERNS
from meshplan.core.num import Num, minimum, where
from meshplan.core.placement import AxisPlacement
from meshplan.spec.cluster import Cluster
from meshplan.spec.layout import Recompute
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload

FP8_DISPATCH_BYTES = 1 + 4 / 128
"""Bytes per element of an FP8 dispatch: the e4m3 value and one fp32 scale per 1 x 128 tile (DeepSeek-V3
Sec. 3.3.2, the fine-grained activation quantization its FP8 up-projections consume)."""


def ep_calls(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], st: StageShape
) -> list[CollectiveCall]:
    if model.moe is None:
        return []
    tp, sp = lay.tp, lay.sp  # type: ignore[attr-defined]
    rows = st.tokens * where(sp, 1 / tp, 1.0) * model.moe.experts_per_token  # rows this rank dispatches
    size = rows * model.hidden * work.precision.activation_bytes
    redo = where(lay.recompute == Recompute.FULL, 2, 0)  # type: ignore[attr-defined]
    per_step = st.moe_layers * st.micro_batches
    p = pl["ep"]
    # node-limited routing: of k copies per token, those leaving the node are at most one per reachable node
    k, limit = model.moe.experts_per_token, model.moe.max_nodes_per_token
    leaving = minimum(limit, k) / k if limit else 1.0
    # the dispatch in FP8 where the run states it: 1 byte an element and an fp32 scale per 128 (DeepSeek-V3 Sec. 3.3.2)
    dispatch = rows * model.hidden * FP8_DISPATCH_BYTES if work.conditions.fp8_dispatch else size
    calls = [
        _call(
            "ep",
            Collective.ALL_TO_ALL,
            p,
            cl,
            phase="forward",
            size=part,
            count=(1 + redo / 2) * per_step,  # a dispatch and a combine, again in the recomputed forward
            overlappable=work.overlap.ep,
            leaving_share=leaving,
        )
        for part in (dispatch, size)
    ] + [
        _call(
            "ep",
            Collective.ALL_TO_ALL,
            p,
            cl,
            phase="backward",
            size=size,
            count=2 * per_step,
            overlappable=work.overlap.ep,
            leaving_share=leaving,
        ),
    ]
    calls += _expert_tp_calls(lay, work, cl, pl, size=size, per_step=per_step, redo=redo)
    if PATTERNS[work.framework].ep_count_exchange:
        counts = INDEX_BYTES * model.moe.num_experts
        exchanges = where(redo > 0, 2, 1) * per_step
        calls.append(
            _call("ep", Collective.ALL_TO_ALL, p, cl, phase="forward", size=counts, count=exchanges, overlappable=False)
        )
    return calls


def _expert_tp_calls(
    lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], *, size: Num, per_step: Num, redo: Num
) -> list[CollectiveCall]:
    """The expert-TP group's all-gather of the dispatched rows and reduce-scatter of the expert outputs, per MoE
    layer forward (again under full recompute) and backward; ``size``: the rows one rank dispatches (bytes)."""
    etp, sp = lay.etp, lay.sp  # type: ignore[attr-defined]
    # without SP every TP rank already holds all its tokens, and TP's own all-reduce sums the experts' partials
    gathering = (etp > 1) & sp
    gathered = where(gathering, size * etp, 0.0)
    return [
        _call(
            "etp",
            op,
            pl["etp"],
            cl,
            phase=phase,
            size=gathered,
            count=where(gathering, count, 0),
            overlappable=work.overlap.ep,
        )
        for phase, count in (("forward", (1 + redo // 2) * per_step), ("backward", per_step))
        for op in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER)
    ]
