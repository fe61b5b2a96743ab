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
from meshplan.spec.workload import Workload


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
    return [
        _call("pp", Collective.SEND_RECV, p, cl, phase="forward", size=size, count=count * where(st.last_stage, 0, 1)),
        _call(
            "pp", Collective.SEND_RECV, p, cl, phase="backward", size=size, count=count * where(st.first_stage, 0, 1)
        ),
    ]
