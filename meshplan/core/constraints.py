"""The rules a layout must meet for a model, a workload and a fleet.

Each rule is written once, as a predicate that broadcasts over arrays of
layouts: the planner counts rejections by reason, and ``check_layout`` turns
the first broken rule of a single layout into a message with both sides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from meshplan.core.num import Num
from meshplan.spec.conditions import StageSplit
from meshplan.spec.finetune import FinetuneMode
from meshplan.spec.layout import Recompute
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """One constraint: a short reason (the planner's rejection key) and a message for one layout."""

    reason: str
    holds: Callable[[ModelSpec, object, Workload, int], Num]
    message: Callable[[ModelSpec, object, Workload, int], str]


def _g(lay: object, name: str) -> Num:
    return getattr(lay, name)


def _dp(lay: object) -> Num:
    return _g(lay, "dp_replicate") * _g(lay, "dp_shard")


def _mesh(lay: object) -> Num:
    return _dp(lay) * _g(lay, "cp") * _g(lay, "tp") * _g(lay, "pp")


def _split_fits(model: ModelSpec, pp: Num, split: StageSplit) -> Num:
    """A stated first/last stage needs pp > 1, and the other stages at least one layer each (none when pp = 2
    and both ends are stated: then f + l = L)."""
    if split.stated == 0:
        return True
    rest_layers, rest_stages = model.num_layers - split.stated_layers, pp - split.stated
    return (pp > 1) & (rest_layers >= np.maximum(rest_stages, 0)) & ((rest_stages > 0) | (rest_layers == 0))


def _split_message(model: ModelSpec, pp: Num, split: StageSplit) -> str:
    stated = " and ".join(
        f"{name}_stage_layers={value}"
        for name, value in (("first", split.first), ("last", split.last))
        if value is not None
    )
    rest = model.num_layers - split.stated_layers
    return (
        f"{stated} leave {rest} of num_layers={model.num_layers} for the other {pp - split.stated} of pp={pp} "
        "stages: needs pp > 1 and at least one layer on every other stage (all of them used when pp = 2 and "
        "both ends are stated)"
    )


def _offload_fits(model: ModelSpec, lay: object, layers: int) -> Num:
    """Megatron-Core's TransformerConfig refuses CPU offloading with pipeline parallelism or recompute, and of
    num_layers or more layers."""
    if not layers:
        return True
    return (_g(lay, "pp") == 1) & (_g(lay, "recompute") == Recompute.NONE) & (layers < model.num_layers)


RULES: tuple[Rule, ...] = (
    Rule(
        reason="mesh does not multiply to the GPU count",
        holds=lambda m, lay, w, n: _mesh(lay) == n,
        message=lambda m, lay, w, n: (
            f"tp*pp*cp*dp = {_g(lay, 'tp')}*{_g(lay, 'pp')}*{_g(lay, 'cp')}*{_dp(lay)} = {_mesh(lay)} != gpus = {n}"
        ),
    ),
    Rule(
        reason="tp does not divide num_kv_heads",
        holds=lambda m, lay, w, n: m.num_kv_heads % _g(lay, "tp") == 0,
        message=lambda m, lay, w, n: f"tp={_g(lay, 'tp')} must divide num_kv_heads={m.num_kv_heads}",
    ),
    Rule(
        reason="tp does not divide ffn_hidden",
        holds=lambda m, lay, w, n: (
            (m.ffn_hidden % _g(lay, "tp") == 0) & ((m.moe is None) or (m.moe.expert_ffn_hidden % _g(lay, "etp") == 0))
        ),
        message=lambda m, lay, w, n: (
            f"tp={_g(lay, 'tp')} must divide ffn_hidden={m.ffn_hidden}"
            + ("" if m.moe is None else f", and expert_tp={_g(lay, 'etp')} expert_ffn_hidden={m.moe.expert_ffn_hidden}")
        ),
    ),
    Rule(
        reason="more pipeline stages than layers",
        holds=lambda m, lay, w, n: _g(lay, "pp") <= m.num_layers,
        message=lambda m, lay, w, n: f"pp={_g(lay, 'pp')} exceeds num_layers={m.num_layers}",
    ),
    Rule(
        reason="stated first/last stage layers do not fit the pipeline",
        holds=lambda m, lay, w, n: _split_fits(m, _g(lay, "pp"), w.conditions.stage_split),
        message=lambda m, lay, w, n: _split_message(m, _g(lay, "pp"), w.conditions.stage_split),
    ),
    Rule(
        reason="activation offload needs pp 1, no recompute and a layer left on the GPU",
        holds=lambda m, lay, w, n: _offload_fits(m, lay, w.conditions.offload_layers or 0),
        message=lambda m, lay, w, n: (
            f"offload_layers={w.conditions.offload_layers} with pp={_g(lay, 'pp')}, recompute="
            f"{Recompute(int(_g(lay, 'recompute'))).name.lower()}, num_layers={m.num_layers}: Megatron offloads "
            "activations only without pipeline parallelism or recompute, and fewer layers than the model has"
        ),
    ),
    Rule(
        reason="more virtual stages than layers per stage",
        holds=lambda m, lay, w, n: _g(lay, "vpp") <= -(-m.num_layers // _g(lay, "pp")),
        message=lambda m, lay, w, n: (
            f"vpp={_g(lay, 'vpp')} exceeds the {-(-m.num_layers // _g(lay, 'pp'))} layers of the fullest of "
            f"pp={_g(lay, 'pp')} stages (num_layers={m.num_layers})"
        ),
    ),
    Rule(
        reason="ep does not divide num_experts",
        holds=lambda m, lay, w, n: (
            ((m.moe.num_experts if m.moe else 1) % _g(lay, "ep") == 0)
            & ((m.moe is not None) | (_g(lay, "etp") == _g(lay, "tp")))
        ),
        message=lambda m, lay, w, n: (
            f"ep={_g(lay, 'ep')} must divide num_experts={m.moe.num_experts}"
            if m.moe
            else f"ep={_g(lay, 'ep')}, expert_tp={_g(lay, 'etp')} need a mixture-of-experts model; {m.name} has no "
            "experts"
        ),
    ),
    Rule(
        reason="cp does not split the sequence evenly",
        holds=lambda m, lay, w, n: (_g(lay, "cp") == 1) | (w.seq_len % (2 * _g(lay, "cp")) == 0),
        message=lambda m, lay, w, n: (
            f"seq_len={w.seq_len} must be divisible by 2*cp = {2 * _g(lay, 'cp')} "
            "(load-balanced context parallelism cuts each sequence into 2*cp chunks)"
        ),
    ),
    Rule(
        reason="QLoRA's 4-bit base cannot be split by TP",
        holds=lambda m, lay, w, n: (_g(lay, "tp") == 1) | (w.finetune.mode != FinetuneMode.QLORA),
        message=lambda m, lay, w, n: (
            f"qlora keeps the base in bitsandbytes' 4-bit blocks, which tensor parallelism cannot split: "
            f"tp={_g(lay, 'tp')} (use FSDP / ZeRO-3 to shard the base instead)"
        ),
    ),
    Rule(
        reason="global batch not divisible by micro_batch*dp",
        holds=lambda m, lay, w, n: w.global_batch % (_g(lay, "micro_batch") * _dp(lay)) == 0,
        message=lambda m, lay, w, n: (
            f"global_batch={w.global_batch} must be divisible by micro_batch*dp = "
            f"{_g(lay, 'micro_batch')}*{_dp(lay)} = {_g(lay, 'micro_batch') * _dp(lay)}"
        ),
    ),
)


def failed_rules(model: ModelSpec, layout: object, workload: Workload, num_gpus: int) -> list[str]:
    """Messages of every rule a single layout breaks (empty when it is valid)."""
    return [
        rule.message(model, layout, workload, num_gpus)
        for rule in RULES
        if not bool(np.all(rule.holds(model, layout, workload, num_gpus)))
    ]


def check_layout(model: ModelSpec, layout: object, workload: Workload, num_gpus: int) -> None:
    """Raise ValueError naming the first rule a single layout breaks."""
    broken = failed_rules(model, layout, workload, num_gpus)
    if broken:
        raise ValueError(broken[0])
