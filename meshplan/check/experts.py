"""Expert parallelism: each rank owns E/n experts; tokens travel to them and back with all-to-all.

Per MoE layer and micro-batch, forward issues three ``all_to_all_single`` calls on the EP group:
1. the token counts per expert (E int64, no autograd), so every rank learns how many rows it will receive;
2. dispatch: the T t routed rows (T = b s tokens, t = experts per token) grouped by destination rank;
3. combine: the expert outputs back to the ranks their tokens came from.
Dispatch and combine go through the functional ``all_to_all_single`` (differentiable since torch 2.13; the older
``torch.distributed.nn.functional.all_to_all_single`` is deprecated), so backward issues one all-to-all for
each of them, with the splits swapped. The routed rows of one rank are
``T t h`` elements whatever the routing; what each rank receives depends on the routing.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn

from meshplan.check.model import MoE, MoEFn


def shard_experts(moe: MoE, group: dist.ProcessGroup) -> list[str]:
    """Keep this rank's E/n experts (contiguous block of dim 0); returns the local expert parameter names."""
    rank, n = group.rank(), group.size()
    if moe.num_experts % n:
        raise ValueError(f"num_experts={moe.num_experts} must be divisible by the expert-parallel degree {n}")
    per_rank = moe.num_experts // n
    for name in ("w1", "w2", "w3"):
        full = getattr(moe, name)
        setattr(moe, name, nn.Parameter(full.detach()[rank * per_rank : (rank + 1) * per_rank].clone()))
    moe.dispatch = expert_parallel_dispatch(group)
    return ["w1", "w2", "w3"]


def expert_parallel_dispatch(group: dist.ProcessGroup) -> MoEFn:
    def dispatch(moe: MoE, x: torch.Tensor, expert_ids: torch.Tensor, gate_weights: torch.Tensor) -> torch.Tensor:
        n, per_rank, top_k = group.size(), moe.num_experts // group.size(), expert_ids.shape[1]
        flat_ids = expert_ids.reshape(-1)
        order = torch.argsort(flat_ids, stable=True)
        routed = x[order // top_k]  # (T t, h), grouped by global expert, hence by destination rank
        counts = torch.bincount(flat_ids, minlength=moe.num_experts)
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=group)
        send_splits = counts.view(n, per_rank).sum(1).tolist()
        recv_by_source = recv_counts.view(n, per_rank)  # rows for each local expert from each source rank
        recv_splits = recv_by_source.sum(1).tolist()
        received = funcol.wait_tensor(  # type: ignore[no-untyped-call]
            funcol.all_to_all_single(routed, recv_splits, send_splits, group)
        )
        # received rows come source-major, expert-minor: regroup them expert-major for the expert loop
        expert_of_row = torch.arange(per_rank).repeat(n).repeat_interleave(recv_by_source.flatten())
        regroup = torch.argsort(expert_of_row, stable=True)
        expert_out = moe.run_experts(received[regroup], recv_by_source.sum(0).tolist())
        returned = funcol.wait_tensor(  # type: ignore[no-untyped-call]
            funcol.all_to_all_single(expert_out[torch.argsort(regroup)], send_splits, recv_splits, group)
        )
        weighted = returned * gate_weights.reshape(-1)[order, None]
        return torch.zeros_like(x).index_add(0, order // top_k, weighted)

    return dispatch
