"""PyTorch's ring attention (torch.distributed.tensor.experimental context_parallel): the eager fp32 work around
each block's fused attention call, at HBM speed.

Forward, every block after the first: the block's bf16 output upcast, then ``out - sigmoid(lse_b - lse) *
(out - out_b)`` on the fp32 running output (``_SDPAMerger._merge_one``); the causal load balancing gives each rank
half its blocks as a full call merged into the whole output and half as a call on its later half of the queries,
merged into that half and copied back into the whole (``_partial_update``: ``torch.cat``). Backward, every block
after the first: the bf16 dQ, dK, dV added into fp32 accumulators (or into one half, then the ``torch.cat``), and
the fp32 dK/dV concatenated for the next hop. Once per call: K and V made contiguous and concatenated for the
all-gather (forward and backward), the fp32 accumulators zeroed, the first block's output upcast and the result
cast back. Source: pytorch/pytorch torch/distributed/tensor/experimental/_attention.py (_templated_ring_attention,
_templated_ring_attention_backward, _SDPAMerger, _partial_update).
"""

from __future__ import annotations

from meshplan.core.num import Num, maximum, where

MERGE_BYTES = (38.0 + 27.0) / 2
"""Bytes per output element of one merged block, forward, averaged over the ranks' two kinds of block. Whole:
upcast (read 2, write 4), out - out_b (4 + 4, 4), the product with the sigmoid (4, 4), the difference (4 + 4, 4):
38. Later half: half of that, 19, plus the fp32 output copied back by torch.cat (read 4, write 4): 27."""
GRAD_Q_BYTES = (10.0 + 13.0) / 2
"""Per query element and block, backward: dQ += dQ_b in fp32 (read 4 + 2, write 4: 10), or on one half and the
torch.cat (5 + 8: 13), averaged over the ranks."""
GRAD_KV_BYTES = (10.0 + 13.0) / 2 + 8.0
"""Per K or V element and block, backward: the fp32 accumulation as for dQ, then torch.cat of dK and dV for the
next hop (read 4, write 4)."""
FIXED_FWD_Q, FIXED_FWD_KV = 12.0, 16.0
"""Once per forward call: the first block's output upcast (2 + 4) and the result cast back (4 + 2) per output
element; K and V made contiguous (2 + 2) and concatenated for the all-gather (2 + 2) per K or V element."""
FIXED_BWD_Q, FIXED_BWD_KV = 20.0, 72.0
"""Once per backward call, per query element: dQ zeroed (4), the first block's dQ added (10), the result cast
back (6); per K or V element: zeroed (4), the first block added (10), concatenated (8), cast back (6), and
K and V made contiguous and concatenated again (8)."""


STEP_CAT_KV_BYTES = 8.0
"""Per K or V element, each ring step but the last after the first: the loop concatenates the block in hand into
one flat buffer (``next_kv = torch.cat([key.flatten(), value.flatten()])``, read 2 and write 2 bytes for each of
K and V) at every step i < cp - 1, forward and backward, whether the rotater sends it or, all-gathering once,
drops it; ``FIXED_FWD_KV`` and ``FIXED_BWD_KV`` count the first."""


def ring_merge_time(*, q_elements: Num, kv_elements: Num, cp: Num, hbm: float) -> tuple[Num, Num]:
    """(forward, backward) seconds of one layer's ring merging over ``cp`` ranks (0 without CP).

    ``q_elements``: this rank's query (and output) elements, tokens x query width / tp; ``kv_elements``: its K
    or V elements as the attention gets them (repeated to the query heads or not).
    """
    later = cp - 1
    cats = maximum(cp - 2, 0.0) * STEP_CAT_KV_BYTES * kv_elements
    fwd = later * MERGE_BYTES * q_elements + FIXED_FWD_Q * q_elements + FIXED_FWD_KV * kv_elements + cats
    bwd = later * (GRAD_Q_BYTES * q_elements + 2 * GRAD_KV_BYTES * kv_elements)
    bwd = bwd + FIXED_BWD_Q * q_elements + FIXED_BWD_KV * kv_elements + cats
    return where(cp > 1, fwd / hbm, 0.0), where(cp > 1, bwd / hbm, 0.0)
