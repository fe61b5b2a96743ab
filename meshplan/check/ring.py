"""Context parallelism: causal ring attention over a process group, driven with isend/irecv.

Why not ``torch.distributed.tensor.experimental.context_parallel()``: in torch 2.13 its SDPA dispatch table
and sharding rules cover ``_scaled_dot_product_flash_attention``, ``_efficient_attention`` and
``_cudnn_attention`` (and their backwards) but not ``_scaled_dot_product_flash_attention_for_cpu``, the kernel
SDPA picks on CPU, so on a CPU tensor the call never reaches the ring. (Its default rotate method is also
``"allgather"``: one all-gather of K/V per layer, not a ring.) This module follows the hops of its ring path
(``_templated_ring_attention`` with ``set_rotate_method("alltoall")``, where every hop is a ``permute_tensor``
all-to-all): K and V travel concatenated in one message; forward passes them n-1 times; backward passes them
n-1 times again plus the fp32 dK/dV accumulators n times (the last hop returns each accumulator to the rank
that owns the block). Here each hop is one ``batch_isend_irecv`` of one send and one recv, same bytes.
Sequence layout: rank r holds the contiguous positions [r s/n, (r+1) s/n) (no load balancing); blocks from
later ranks are masked out but still pass through.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from meshplan.check.model import AttentionFn


def _exchange(send: torch.Tensor, group: dist.ProcessGroup) -> tuple[list[dist.Work], torch.Tensor]:
    """Start sending ``send`` to the next rank and receiving the previous rank's buffer."""
    rank, n = group.rank(), group.size()
    recv = torch.empty_like(send)
    ops = [
        dist.P2POp(dist.isend, send, group=group, group_peer=(rank + 1) % n),
        dist.P2POp(dist.irecv, recv, group=group, group_peer=(rank - 1) % n),
    ]
    return dist.batch_isend_irecv(ops), recv


def _wait(works: list[dist.Work]) -> None:
    for work in works:
        work.wait()


def _expand(kv: torch.Tensor, groups: int) -> torch.Tensor:
    expanded: torch.Tensor = kv.repeat_interleave(groups, dim=1)
    return expanded


def _scores(q: torch.Tensor, k: torch.Tensor, causal: bool) -> torch.Tensor:
    # q: (b, a, c, d), k: (b, a, c, d) -> (b, a, c, c)
    scores: torch.Tensor = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return scores


def _split(kv: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    k, v = kv.split(like.numel())  # type: ignore[no-untyped-call]
    return k.view_as(like), v.view_as(like)


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup) -> Any:
        rank, n, groups = group.rank(), group.size(), q.shape[1] // k.shape[1]
        kv = torch.cat([k.flatten(), v.flatten()])
        out = lse = torch.empty(0)
        for i in range(n):
            src = (rank - i) % n  # owner of the block held at step i
            works, recv = _exchange(kv, group) if i < n - 1 else ([], kv)
            if src <= rank:
                kb, vb = _split(kv, k)
                scores = _scores(q, _expand(kb, groups), causal=src == rank)
                block_lse = scores.logsumexp(-1)
                block_out = (scores - block_lse[..., None]).exp() @ _expand(vb, groups)
                if i == 0:
                    out, lse = block_out, block_lse
                else:
                    new_lse = torch.logaddexp(lse, block_lse)
                    out = out * (lse - new_lse).exp()[..., None] + block_out * (block_lse - new_lse).exp()[..., None]
                    lse = new_lse
            _wait(works)
            kv = recv
        # (b, s, a, d) in memory, as SDPA's CPU kernel returns it, so the caller's transpose-reshape is a view
        out = out.transpose(1, 2).contiguous().transpose(1, 2)
        ctx.group = group
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> Any:
        q, k, v, out, lse = ctx.saved_tensors
        group = ctx.group
        rank, n, groups = group.rank(), group.size(), q.shape[1] // k.shape[1]
        delta = (dout * out).sum(-1, keepdim=True)
        dq = torch.zeros_like(q)
        kv = torch.cat([k.flatten(), v.flatten()])
        dkv = torch.empty(0)
        for i in range(n):
            src = (rank - i) % n
            works, recv = _exchange(kv, group) if i < n - 1 else ([], kv)
            block_dkv = torch.zeros_like(kv, dtype=torch.float32)
            if src <= rank:
                kb, vb = _split(kv, k)
                p = (_scores(q, _expand(kb, groups), causal=src == rank) - lse[..., None]).exp()
                dv = p.transpose(-1, -2) @ dout
                ds = p * (dout @ _expand(vb, groups).transpose(-1, -2) - delta) * q.shape[-1] ** -0.5
                dq += ds @ _expand(kb, groups)
                dk = ds.transpose(-1, -2) @ q
                # sum the gradients of the query heads that share one KV head
                shape = (k.shape[0], k.shape[1], groups, *k.shape[2:])
                block_dkv = torch.cat([dk.view(shape).sum(2).flatten(), dv.view(shape).sum(2).flatten()])
            # the accumulator received now belongs to the block held now (it left its owner i steps ago)
            dkv = block_dkv if i == 0 else dkv + block_dkv
            dkv_works, dkv = _exchange(dkv, group)
            _wait(works + dkv_works)
            kv = recv
        dk, dv = _split(dkv.to(k.dtype), k)
        return dq, dk, dv, None


def ring_attention(group: dist.ProcessGroup) -> AttentionFn:
    """An ``Attention.attention_fn`` that runs causal ring attention over ``group``."""

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # no .contiguous(): autograd saves q, k, v as the views SDPA would get; only the messages are copies
        out: torch.Tensor = RingAttention.apply(q, k, v, group)  # type: ignore[no-untyped-call]
        return out

    return attention
