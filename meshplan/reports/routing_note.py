"""What a MoE layout's report says of its routing: the default is perfect balance, and what a capacity factor of
1.25 would change.

``routing_imbalance`` (the busiest expert-parallel rank's routed tokens over the mean) defaults to 1. No published
measure of that per-rank share, per router, is solid enough to be a default: DeepSeek's auxiliary-loss-free
balancing (Wang et al. 2024) reports each expert's load violation over a batch, not an expert-parallel rank's over
a micro-batch, and Megatron-Core's default is dropless routing with no capacity at all. So the default stays, and a
report of an expert-parallel MoE layout says it is assumed, with the memory a capacity factor of 1.25 adds (the
busiest rank receiving 1.25 times the mean, which ``--routing-imbalance 1.25`` prices): the common capacity of
Switch Transformer-style routers (Fedus et al. 2022 compare capacity factors of 1.0, 1.25 and 2.0). The step time
models no imbalance: the busiest rank's expert GEMMs at 1.25 would run on a quarter more tokens.
"""

from __future__ import annotations

import dataclasses

from meshplan.core.plan import Plan, evaluate
from meshplan.render import gb

CAPACITY_FACTOR = 1.25
"""The common capacity factor: an expert takes up to 1.25 times its even share of a batch's tokens."""


def routing_note(plan: Plan) -> list[str]:
    """The note of an expert-parallel MoE layout whose routing is taken as perfectly balanced (nothing else)."""
    conditions = plan.workload.conditions
    if plan.model.moe is None or int(plan.layout.ep) <= 1 or conditions.routing_imbalance != 1.0:
        return []
    work = dataclasses.replace(
        plan.workload, conditions=dataclasses.replace(conditions, routing_imbalance=CAPACITY_FACTOR)
    )
    skewed = evaluate(plan.model, plan.cluster, plan.layout, work, order=plan.order).memory
    extra = float(skewed.per_gpu.total_bytes) - float(plan.memory.per_gpu.total_bytes)
    fits = "" if skewed.fits or not plan.memory.fits else ", more than the GPU holds"
    return [
        "routing is assumed perfectly balanced (routing_imbalance 1: every expert-parallel rank receives the mean "
        f"of the routed tokens); with a capacity factor of {CAPACITY_FACTOR} (the busiest rank receiving "
        f"{CAPACITY_FACTOR}x the mean: --routing-imbalance {CAPACITY_FACTOR}) the busiest rank holds {gb(extra)} more "
        f"activations, {gb(float(skewed.per_gpu.total_bytes))} per GPU{fits}, and its expert GEMMs run on up to "
        f"{CAPACITY_FACTOR - 1:.0%} more tokens, which the step time does not include"
    ]
