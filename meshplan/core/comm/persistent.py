"""DeepSpeed 0.3's ZeRO-3 persistent parameters: the biases and norms below the persistence threshold stay whole
on every rank in forward and backward, are released after each backward and gathered again at the end of each
optimizer step, through a list all_gather whose result is unflattened one parameter and one rank at a time on the
host (``Zero3Unit.PARAMETER`` only)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.core.comm.patterns import PATTERNS
from meshplan.core.num import Num
from meshplan.core.params import head_tensors, layer_tensors
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Framework

PERSISTENCE_THRESHOLD = 100_000
"""Elements below which ZeRO-3 keeps a parameter whole (ds_persist): stage3_param_persistence_threshold's default
(DeepSpeed 0.3.14 zero/constants.py ZERO_OPTIMIZATION_PARAM_PERSISTENCE_THRESHOLD_DEFAULT; stage3.py
persistent_parameters)."""
OPS_PER_PARAMETER_AND_RANK = 4
"""Tensor operations the host issues from Python per persistent parameter and per rank whose slice holds some of it,
unflattening the gathered buffer: ``partitions[i].narrow``, ``replicated_tensor.view(-1)``, ``.narrow`` and
``.copy_``, a launch of its own (DeepSpeed 0.3.14 partition_parameters.py _allgather_params, called from stage3.py
_post_step at the end of every optimizer step)."""
OPS_PER_PARAMETER = 6
"""The same once per persistent parameter: in _allgather_params its own partition's ``narrow`` and ``copy_`` into the
flat buffer and ``torch.empty`` of the whole parameter; after backward its release, ``torch.ones(1).half().to(
device)`` (stage3.py _partition_all_parameters -> partition_parameters.py _partition_param)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PersistentRegather:
    """What one GPU's end-of-step regather of its stage's persistent parameters issues."""

    elements: Num
    """Elements of the gathered flat buffer: every parameter's partition, padded to the group, times the group."""
    host_ops: Num
    """Host tensor operations of the unflattening and the releases (each one launch gap)."""


FUSED = (("attention.wq", "attention.wk", "attention.wv"), ("feed_forward.w1", "feed_forward.w3"))
"""Column-parallel inputs Megatron's modules hold as one parameter each (weight and bias): QKV, and gate/up."""


def persistent_sizes(model: ModelSpec, framework: Framework, *, moe_layer: bool) -> tuple[int, ...]:
    """Elements of each persistent parameter of one layer, as the framework's modules hold them (Megatron's fused
    QKV and gate/up as one); routed experts are left out."""
    sizes = {t.name: t.numel for t in layer_tensors(model, moe_layer=moe_layer) if not t.expert}
    if PATTERNS[framework].fused_column_inputs:
        for group in FUSED:
            for suffix in (".weight", ".bias"):
                names = [name + suffix for name in group if name + suffix in sizes]
                if len(names) > 1:
                    sizes[names[0]] = sum(sizes.pop(name) for name in names)
    return tuple(n for n in sizes.values() if n < PERSISTENCE_THRESHOLD)


def persistent_regather(
    model: ModelSpec, framework: Framework, *, dense_layers: Num, moe_layers: Num, head: bool, group: Num
) -> PersistentRegather:
    """The stage's persistent parameters over a shard group of ``group`` ranks: each of N elements is split in
    ceil(N / group) per rank (padded), so ceil(N / that) ranks hold some of it and are copied out one by one."""
    kinds = [(persistent_sizes(model, framework, moe_layer=False), dense_layers)]
    kinds.append((persistent_sizes(model, framework, moe_layer=True), moe_layers))
    if head:
        kinds.append((tuple(t.numel for t in head_tensors(model) if t.numel < PERSISTENCE_THRESHOLD), 1))
    elements: Num = 0.0
    ops: Num = 0.0
    for sizes, count in kinds:
        for n in sizes:
            share = np.ceil(n / group)
            elements = elements + count * share * group
            ops = ops + count * (OPS_PER_PARAMETER + OPS_PER_PARAMETER_AND_RANK * np.ceil(n / share))
    return PersistentRegather(elements=elements, host_ops=ops)
