"""Where frameworks issue different collectives for the same layout (measured for PyTorch 2.13 by
``meshplan check``, docs/check.md), and the element sizes the strategies share."""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.spec.workload import Framework


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectivePattern:
    """Where frameworks issue different collectives for the same layout."""

    fused_column_inputs: bool
    """TP backward all-reduces one input gradient per column-parallel input (fused QKV, fused gate/up: 2 per
    layer); False: one per column-parallel module (q, k, v, gate, up: 5), each module wrapping its input alone."""
    sp_regathers_inputs: bool
    """Sequence parallelism gathers each sharded input again in backward for the weight gradient."""
    ring_grads_apart: bool
    """Ring CP backward passes K/V n - 1 times and the fp32 dK/dV accumulators n times; False: K/V and their
    gradients travel together n - 1 times."""
    ep_count_exchange: bool
    """An all-to-all of the per-expert token counts precedes each dispatch (8 E bytes)."""
    torch_native: bool
    """The embedding and head TP collectives, Partial norm gradients, FSDP2 units and DDP buckets of
    torch_calls.py (False: per-layer TP traffic and ZeRO's whole-model volumes only)."""


PATTERNS: dict[Framework, CollectivePattern] = {
    Framework.MEGATRON: CollectivePattern(
        fused_column_inputs=True,
        sp_regathers_inputs=True,
        ring_grads_apart=False,
        ep_count_exchange=False,
        torch_native=False,
    ),
    Framework.TORCH: CollectivePattern(
        fused_column_inputs=False,
        sp_regathers_inputs=False,
        ring_grads_apart=True,
        ep_count_exchange=True,
        torch_native=True,
    ),
}


INDEX_BYTES = 8.0
"""int64 token counts per expert."""
