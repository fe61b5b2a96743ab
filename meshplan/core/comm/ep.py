"""Expert parallelism: a dispatch and a combine all-to-all per MoE layer forward and again backward, k b s h
bytes per rank each (k b s h / t with sequence parallelism: each rank dispatches its own s/t tokens); under
node-limited routing (at most M nodes per token, once per node) the share leaving the node is min(M, k) / k of
the unlimited one. With expert TP e_t > 1 and SP the expert-TP group all-gathers the dispatched rows before the experts
and reduce-scatters their outputs (forward; the reverse in backward), k b s h e_t / t bytes gathered per call
(Megatron-Core's all-to-all token dispatcher; MoE parallel folding, arXiv:2504.14960, Sec. 3).

DeepEP (``EpDispatch.DEEPEP``, Megatron-Core's flex dispatcher) sends a token once to each node holding one of its
experts, over RDMA to the GPU of the same local rank there, which forwards it over NVLink to each GPU of its node
holding one (and the combine sums the copies back the same way): of a token's k copies, an expected
(D - 1)/D x D (1 - C(E - E/D, k) / C(E, k)) cross the fabric (D nodes of the EP group, E experts; at most M under
node-limited routing) against the all-to-all's k (D - 1)/D, and g (1 - C(E - E/g, k) / C(E, k)) (inner - 1)/inner
ride NVLink (g = ep GPUs) against k (inner - 1)/ep. Its kernels run on a fixed budget of 20 SMs (deep_ep
``Buffer.num_sms``, Megatron's --moe-deepep-num-sms), 15% of an H100's 132, less than the share of the compute
any overlapped collective costs already (``GpuCalibration.overlap_efficiency``, 0.4): not priced apart. DeepEP's
README measures its normal kernels at 153-158 GB/s over NVLink (intranode, EP 8, of about 160 GB/s on H800) and
43-58 GB/s over RDMA (EP 16-64, one 400 Gb/s CX7 per GPU): the links' own rates, which the links' effective
bandwidths already are."""

from __future__ import annotations

from meshplan.core.comm.call import CollectiveCall, StageShape
from meshplan.core.comm.call import make_call as _call
from meshplan.core.comm.cost import Collective
from meshplan.core.comm.patterns import INDEX_BYTES, PATTERNS
from meshplan.core.num import Num, maximum, minimum, where
from meshplan.core.placement import AxisPlacement
from meshplan.spec.cluster import Cluster
from meshplan.spec.conditions import EpDispatch
from meshplan.spec.layout import Recompute
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload

FP8_DISPATCH_BYTES = 1 + 4 / 128
"""Bytes per element of an FP8 dispatch: the e4m3 value and one fp32 scale per 1 x 128 tile (DeepSeek-V3
Sec. 3.3.2, the fine-grained activation quantization its FP8 up-projections consume)."""


def groups_hit(experts: int, k: int, groups: Num) -> Num:
    """Expected groups (nodes, GPUs) reached by a token's k distinct experts drawn uniformly from ``experts`` split
    evenly over ``groups``: groups (1 - C(E - E/groups, k) / C(E, k)), a group missed when all k fall elsewhere."""
    per = experts / groups
    miss: Num = 1.0
    for i in range(k):
        miss = miss * maximum(experts - per - i, 0.0) / (experts - i)
    return groups * (1 - miss)


def deepep_shares(model: ModelSpec, *, n: Num, inner: Num) -> tuple[Num, Num]:
    """(bytes leaving the node, bytes on NVLink) of DeepEP's dispatch as shares of the all-to-all's, over an EP
    group of ``n`` GPUs, ``inner`` of them per node."""
    assert model.moe is not None
    k, experts, limit = model.moe.experts_per_token, model.moe.num_experts, model.moe.max_nodes_per_token
    outer = maximum(n // maximum(inner, 1), 1)
    nodes = groups_hit(experts, k, outer)
    if limit:
        nodes = minimum(nodes, limit)
    leaving = where(outer > 1, nodes / k, 1.0)  # (D - 1)/D on both sides
    staying = where(inner > 1, groups_hit(experts, k, n) * outer / k, 1.0)
    return leaving, staying


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
    leaving: Num = minimum(limit, k) / k if limit else 1.0
    staying: Num = 1.0
    if work.conditions.ep_dispatch is EpDispatch.DEEPEP:
        leaving, staying = deepep_shares(model, n=p.size, inner=p.inner)
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
            staying_share=staying,
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
            staying_share=staying,
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
