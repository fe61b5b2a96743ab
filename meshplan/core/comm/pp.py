"""Pipeline parallelism: one activation send forward and one gradient send backward per micro-batch and model
chunk, b s h / t bytes (Narayanan et al. 2021, Sec. 4.1)."""

from __future__ import annotations

from meshplan.core.comm.call import CollectiveCall, StageShape
from meshplan.core.comm.call import make_call as _call
from meshplan.core.comm.cost import Collective
from meshplan.core.comm.patterns import PATTERNS
from meshplan.core.num import where
from meshplan.core.placement import AxisPlacement
from meshplan.spec.cluster import Cluster
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Framework, Workload


def pp_calls(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], st: StageShape
) -> list[CollectiveCall]:
    tp, sp = lay.tp, lay.sp  # type: ignore[attr-defined]
    # Megatron scatters the stage output over the TP ranks; PyTorch and DeepSpeed's engine send what the stage returns
    scatter = work.conditions.pp_scatter_gather
    if scatter is None:
        scatter = PATTERNS[work.framework].fused_column_inputs
    split = tp if scatter else where(sp, tp, 1)
    size = st.tokens * model.hidden * work.precision.activation_bytes / split
    count = where(lay.pp > 1, st.micro_batches * lay.vpp, 0)  # type: ignore[attr-defined]
    p = pl["pp"]
    calls = [
        _call("pp", Collective.SEND_RECV, p, cl, phase="forward", size=size, count=count * where(st.last_stage, 0, 1)),
        _call(
            "pp", Collective.SEND_RECV, p, cl, phase="backward", size=size, count=count * where(st.first_stage, 0, 1)
        ),
    ]
    if work.framework is Framework.MEGATRON and model.tied_embeddings:
        calls.append(_tied_embedding_call(model, lay, work, cl, p))
    return calls


def _tied_embedding_call(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, p: AxisPlacement
) -> CollectiveCall:
    """Megatron's tied embeddings under pipeline parallelism: the first stage holds the word embeddings and the last
    a copy as its output layer; after the last backward their gradients (each TP rank its V / t rows) are
    all-reduced between the two (finalize_model_grads' embedding group), before the optimizer step, blocking. The two
    share a node only when the whole pipeline does."""
    tp, pp = lay.tp, lay.pp  # type: ignore[attr-defined]
    size = model.vocab_size / tp * model.hidden * work.precision.grad_bytes
    return _call(
        "pp",
        Collective.ALL_REDUCE,
        p,
        cl,
        phase="step",
        size=size,
        count=where(pp > 1, 1, 0),
        group=2,
        inner=where(p.inner >= pp, 2, 1),
        per_micro_batch=False,
        overlappable=False,
    )
