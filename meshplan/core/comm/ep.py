"""Expert parallelism: a dispatch and a combine all-to-all per MoE layer forward and again backward, k b s h
bytes per rank each; under node-limited routing (at most M nodes per token, once per node) the share leaving
the node is min(M, k) / k of the unlimited one."""

from __future__ import annotations

from meshplan.core.comm.call import CollectiveCall, StageShape
from meshplan.core.comm.call import make_call as _call
from meshplan.core.comm.cost import Collective
from meshplan.core.comm.patterns import INDEX_BYTES, PATTERNS
from meshplan.core.num import minimum, where
from meshplan.core.placement import AxisPlacement
from meshplan.spec.cluster import Cluster
from meshplan.spec.layout import Recompute
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload


def ep_calls(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], st: StageShape
) -> list[CollectiveCall]:
    if model.moe is None:
        return []
    size = st.tokens * model.moe.experts_per_token * model.hidden * work.precision.activation_bytes
    redo = where(lay.recompute == Recompute.FULL, 2, 0)  # type: ignore[attr-defined]
    per_step = st.moe_layers * st.micro_batches
    p = pl["ep"]
    # node-limited routing: of k copies per token, those leaving the node are at most one per reachable node
    k, limit = model.moe.experts_per_token, model.moe.max_nodes_per_token
    leaving = minimum(limit, k) / k if limit else 1.0
    calls = [
        _call(
            "ep",
            Collective.ALL_TO_ALL,
            p,
            cl,
            phase="forward",
            size=size,
            count=(2 + redo) * per_step,
            overlappable=work.overlap.ep,
            leaving_share=leaving,
        ),
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
    if PATTERNS[work.framework].ep_count_exchange:
        counts = INDEX_BYTES * model.moe.num_experts
        exchanges = where(redo > 0, 2, 1) * per_step
        calls.append(
            _call("ep", Collective.ALL_TO_ALL, p, cl, phase="forward", size=counts, count=exchanges, overlappable=False)
        )
    return calls
