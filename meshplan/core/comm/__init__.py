"""Communication: what one collective costs (cost.py), the record of one call (call.py), and every
collective one training step issues on one GPU: what, how big, how often, over which link.

Per strategy (the module docstrings of Megatron-LM, PyTorch FSDP and the
papers cited below say the same):
  dp    gradient all-reduce over dp x cp (ZeRO-0), once per step, bucketed;
  zero  ZeRO-1: gradient reduce-scatter and parameter all-gather over the
        shard group once per step; ZeRO-2: the reduce-scatter every
        micro-batch; ZeRO-3: parameter all-gathers in forward and backward
        and a gradient reduce-scatter every micro-batch (3x the parameters,
        ZeRO Sec. 7.2); HSDP adds an all-reduce of the shard across replicas;
  tp    Megatron: two all-reduces per layer in forward and two in backward
        (Shoeybi et al. 2019, Sec. 3); with sequence parallelism an
        all-gather and a reduce-scatter in their place (Korthikanti Sec. 4.2.2);
        full recompute repeats the forward ones;
  pp    one activation send forward and one gradient send backward per
        micro-batch and model chunk, b s h / t bytes (Narayanan Sec. 4.1);
  cp    ring: cp-1 K/V block exchanges per attention layer forward, twice the
        bytes backward (K/V and their gradients); all-gather: one all-gather
        of K/V forward and one reduce-scatter of their gradients backward;
  ep    a dispatch and a combine all-to-all per MoE layer forward and again
        backward, k b s h bytes per rank each.

Where frameworks issue different collectives for the same layout,
``patterns.PATTERNS`` says which (measured for PyTorch 2.13 by ``meshplan check``,
docs/check.md), and core/pytorch/collectives.py builds what only PyTorch-native training
issues (embedding and head collectives, Partial norm gradients, FSDP2 units,
DDP buckets and buffer broadcasts).
"""

from __future__ import annotations

from meshplan.core.comm.call import CollectiveCall, StageShape
from meshplan.core.comm.cp import cp_calls
from meshplan.core.comm.dp import dp_calls
from meshplan.core.comm.ep import ep_calls
from meshplan.core.comm.pp import pp_calls
from meshplan.core.comm.tp import tp_calls
from meshplan.core.placement import AxisPlacement
from meshplan.spec.cluster import Cluster
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload

__all__ = ["CollectiveCall", "StageShape", "dp_calls", "inventory", "model_parallel_calls"]


def inventory(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], st: StageShape
) -> list[CollectiveCall]:
    """All collectives of one step on a GPU of the stage described by ``st``."""
    return model_parallel_calls(model, lay, work, cl, pl, st) + dp_calls(model, lay, work, cl, pl, st)


def model_parallel_calls(
    model: ModelSpec, lay: object, work: Workload, cl: Cluster, pl: dict[str, AxisPlacement], st: StageShape
) -> list[CollectiveCall]:
    """The TP, CP, EP and pipeline collectives: those that read neither the ZeRO stage nor the placement of
    the data-parallel axes (the data-parallel ones are ``dp_calls``)."""
    calls: list[CollectiveCall] = []
    for build in (tp_calls, cp_calls, ep_calls, pp_calls):
        calls += build(model, lay, work, cl, pl, st)
    return calls
