"""Layouts under the PyTorch-native run conditions a CPU can show: gradient accumulation without gradient
sync, and torchtitan's per-op selective activation checkpointing (reshard-after-forward off is
``layouts.fsdp_builder(reshard_after_forward=False)``).

- ``build_fsdp_no_sync``: FSDP2 over all ranks, two micro-batches per step; the first runs with
  ``set_requires_gradient_sync(False)``, so every rank keeps the unsharded gradient (in the reduce dtype) until
  the last micro-batch reduce-scatters it.
- ``build_fsdp_op_sac``: FSDP2 over all ranks, every block wrapped in ``checkpoint_wrapper`` with torchtitan's
  op-level policy (torchtitan/distributed/activation_checkpoint.py, the ``_op_sac_save_list`` version): save
  the outputs of the ops in ``SAC_SAVE_OPS`` except every second matmul of a block's forward, recompute the rest.
  What the policy saves lives in the checkpoint's cache, outside autograd's saved-tensor hooks: ``OpCheckpoint``
  keeps each forward's cache so that the probe can count it.
- ``tp_op_sac_builder``: TP (with or without sequence parallelism) over all ranks, then the same per-op
  checkpointing of every block (torchtitan's order: TP, then activation checkpointing). The collectives whose
  outputs the policy does not save run again in backward.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from meshplan.check.cases import ACCUMULATED_MICRO_BATCHES
from meshplan.check.layouts import Probe, Trainer, adamw, apply_tp, batch, make_trainer, standard_step
from meshplan.check.measure import cached_bytes
from meshplan.check.model import TinyConfig, TinyLlama, cross_entropy

_aten = torch.ops.aten
SAC_SAVE_OPS = {
    _aten.mm.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
    # the CPU's flash kernel stands in for the GPU's: same outputs (attention output, fp32 log-sum-exp)
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    _aten.max.default,
}
"""torchtitan's op-level save list (its GPU attention kernels, the reduce-scatter of async TP, float8's amax)."""


def _op_policy(meta: dict[str, int], ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """torchtitan's ``_custom_policy``: the outputs of the save list, except every second matmul, counted per
    block forward (and separately in its recomputation)."""
    key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
    if func == _aten.mm.default:
        meta[key] += 1
    save = func in SAC_SAVE_OPS and not (func == _aten.mm.default and meta[key] % 2 == 0)
    return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE


class OpCheckpoint:
    """The context of torchtitan's per-op checkpointing, with every cache of the current step kept to count."""

    def __init__(self) -> None:
        self.caches: list[Any] = []

    def context_fn(self) -> Any:
        policy = functools.partial(_op_policy, defaultdict(int))
        caching, cached = create_selective_checkpoint_contexts(policy)  # type: ignore[no-untyped-call]
        self.caches.append(caching.storage)
        return caching, cached

    def held_bytes(self) -> int:
        """Bytes of the tensors the policy saved in this step's forwards, each storage once."""
        return cached_bytes(self.caches)


def build_fsdp_op_sac(cfg: TinyConfig, world_size: int) -> Trainer:
    """torchtitan's order: checkpoint each block, then ``fully_shard`` each block and the root."""
    model, sac = TinyLlama(cfg), OpCheckpoint()
    for name, layer in list(model.layers.items()):
        model.layers[name] = checkpoint_wrapper(layer, context_fn=sac.context_fn)
    for layer in model.layers.values():
        fully_shard(layer)
    fully_shard(model)
    tokens, targets = batch(cfg, seed=dist.get_rank())
    step = standard_step(model, tokens, targets)

    def forward_backward(probe: Probe) -> None:
        sac.caches.clear()  # the warm-up steps' caches are not this step's
        step(probe)

    return Trainer(
        model=model,
        optimizer=adamw(model),
        forward_backward=forward_backward,
        inputs=(tokens, targets),
        held_outside_autograd=sac.held_bytes,
    )


def tp_op_sac_builder(*, sequence_parallel: bool) -> Callable[[TinyConfig, int], Trainer]:
    """TP (with or without sequence parallelism) on every rank, then per-op checkpointing of each block."""
    return functools.partial(_build_tp_op_sac, sequence_parallel=sequence_parallel)


def _build_tp_op_sac(cfg: TinyConfig, world_size: int, *, sequence_parallel: bool) -> Trainer:
    model, sac = TinyLlama(cfg), OpCheckpoint()
    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    apply_tp(model, mesh, sequence_parallel=sequence_parallel)
    for name, layer in list(model.layers.items()):
        model.layers[name] = checkpoint_wrapper(layer, context_fn=sac.context_fn)
    trainer = make_trainer(model, cfg, seed=0)  # every TP rank sees the same batch
    step = trainer.forward_backward

    def forward_backward(probe: Probe) -> None:
        sac.caches.clear()
        step(probe)

    return dataclasses.replace(trainer, forward_backward=forward_backward, held_outside_autograd=sac.held_bytes)


def build_fsdp_no_sync(cfg: TinyConfig, world_size: int) -> Trainer:
    """FSDP2 with gradient accumulation: no gradient sync until the last micro-batch."""
    model = TinyLlama(cfg)
    for layer in model.layers.values():
        fully_shard(layer)
    fsdp = fully_shard(model)
    assert isinstance(fsdp, FSDPModule)
    n = ACCUMULATED_MICRO_BATCHES
    rank = dist.get_rank()
    batches = [batch(cfg, seed=rank * n + i) for i in range(n)]

    def forward_backward(probe: Probe) -> None:
        for i, (tokens, targets) in enumerate(batches):
            fsdp.set_requires_gradient_sync(i == n - 1)
            with probe.in_phase("forward"):
                loss = cross_entropy(model(tokens), targets) / n
            probe.after_forward(model, loss)
            with probe.in_phase("backward"):
                loss.backward()  # type: ignore[no-untyped-call]
            probe.after_backward(model)

    return Trainer(
        model=model,
        optimizer=adamw(model),
        forward_backward=forward_backward,
        inputs=tuple(t for pair in batches for t in pair),
    )
