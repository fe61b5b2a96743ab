"""Transformer Engine's ring attention (Megatron-Core's context parallelism, ``--cp-comm-type p2p``): the bf16
work around each ring step's fused attention call, at HBM speed.

The sequence is cut into 2 cp chunks and rank r holds chunks r and 2 cp - 1 - r (causal load balancing). Each of
the cp steps runs one fused attention call: the first on the rank's own K and V (causal), the next ones on the
K and V received from the previous rank, with either the first half of them (when the sender is not after this
rank: its later chunk lies ahead of every query here) or only the second half of the queries; over the ranks,
half of the later steps take each branch. Source: NVIDIA/TransformerEngine transformer_engine/pytorch/
attention.py at v1.8 (AttnFuncWithCPAndKVP2P, flash_attn_fwd_out_correction; the same loop in
attention/dot_product_attention/context_parallel.py at v2.6), bshd/sbhd layouts, bf16 (no FP8 attention).

Forward: K and V concatenated into the first send buffer, the output zeroed, then every step's output rescaled
by exp(lse_i - lse) and added in place (``out.add_``; a whole step reads its output and the running one and
writes it back, a half step half of that), and at each later step the half it takes made contiguous (the first
half of K and V, or the second half of the queries). Backward: K and V copied into the send buffer, per step the
halves made contiguous (K and V, or the queries, output and output gradient), dQ added (copied the first time),
dK and dV concatenated for the next hop and added into the buffer, and each later call's own rowsum of
dO x O before its kernel (the first call's is inside the kernel's published rate).
"""

from __future__ import annotations

from meshplan.core.num import Num, where

FWD_Q_ONCE, FWD_KV_ONCE = 2.0, 8.0
"""Once per forward call: the output zeroed (2 bytes per query element); K and V concatenated into the send
buffer (read 2 and write 2 for each of K and V: 8 bytes per K element)."""
FWD_CORRECTION_FULL, FWD_CORRECTION_HALF = 6.0, 3.0
"""Per query element and step, the output correction: read the step's output and the running one, write it
(6); a step on the later half of the queries does half."""
FWD_HALF_Q, FWD_HALF_KV = 2.0, 4.0
"""A later step's contiguous copy: the second half of the queries (read 2, write 2 on half: 2 per element) or
the first half of K and V (4 per K element)."""
BWD_KV_ONCE = 8.0
"""Once per backward call: K and V copied into the send buffer (8 bytes per K element)."""
BWD_HALF_Q, BWD_HALF_KV = 6.0, 4.0
"""A later step's contiguous copies: the second half of the queries, the output and its gradient (3 x 2), or the
first half of K and V (4), per element."""
BWD_DQ_FIRST, BWD_DQ_FULL, BWD_DQ_HALF = 4.0, 6.0, 3.0
"""dQ per query element: copied at the first step (read 2, write 2), added in place at a whole step (read 2 + 2,
write 2), at a half step half of that."""
BWD_DKV_STEP = 8.0 + 10.0
"""Per K element and step: dK and dV concatenated for the next hop (read 2, write 2 each: 8) and added into the
buffer (6 each on a whole step, copied (4 each) at the first: 10 on average)."""
BWD_ROWSUM = 3.0
"""Per query element and later call: the kernel's rowsum of dO x O, read again (4 bytes on a whole call, 2 on a
half one: 3 on average)."""


def te_ring_time(*, q_elements: Num, kv_elements: Num, cp: Num, hbm: float) -> tuple[Num, Num]:
    """(forward, backward) seconds of one layer's ring bookkeeping over ``cp`` ranks (0 without a ring).

    ``q_elements``: this rank's query (and output) elements, tokens x query width / tp; ``kv_elements``: its K
    (or V) elements, tokens x K/V width / tp. Averaged over the ranks: of the cp steps, (cp + 1) / 2 correct the
    whole output and (cp - 1) / 2 its later half; of the cp - 1 later steps, half copy K and V halves, half the
    query half.
    """
    later = cp - 1
    fwd_q = FWD_Q_ONCE + FWD_CORRECTION_FULL * (cp + 1) / 2 + FWD_CORRECTION_HALF * later / 2 + FWD_HALF_Q * later / 2
    fwd_kv = FWD_KV_ONCE + FWD_HALF_KV * later / 2
    bwd_q = BWD_HALF_Q * later / 2 + BWD_DQ_FIRST + (BWD_DQ_FULL + BWD_DQ_HALF) * later / 2 + BWD_ROWSUM * later
    bwd_kv = BWD_KV_ONCE + BWD_HALF_KV * later / 2 + BWD_DKV_STEP * cp
    fwd = fwd_q * q_elements + fwd_kv * kv_elements
    bwd = bwd_q * q_elements + bwd_kv * kv_elements
    return where(cp > 1, fwd / hbm, 0.0), where(cp > 1, bwd / hbm, 0.0)
