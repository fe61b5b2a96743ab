"""Apply a layout to the tiny model with PyTorch's own distributed APIs, ready for one measured step.

Every builder runs inside an initialized gloo process group and returns a ``Trainer``: this rank's module, its
optimizer (AdamW, fp32 moments) and a ``forward_backward`` that labels its phases for the collective counter.
The parallel plans follow torchtitan's Llama plan (colwise wq/wk/wv/w1/w3, rowwise wo/w2, rowwise embedding,
colwise output gathered to replicated logits, no loss parallelism).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel

from meshplan.check.experts import shard_experts
from meshplan.check.model import Attention, MoE, TinyConfig, TinyLlama, cross_entropy
from meshplan.check.ring import ring_attention


class Probe(Protocol):
    """What a step reports to the instruments."""

    def in_phase(self, phase: str) -> contextlib.AbstractContextManager[None]: ...

    def after_forward(self, model: nn.Module, loss: torch.Tensor) -> None: ...

    def after_backward(self, model: nn.Module) -> None: ...


@dataclass(slots=True, kw_only=True)
class Trainer:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    forward_backward: Callable[[Probe], None]
    inputs: tuple[torch.Tensor, ...] = ()
    """The batch tensors (token ids, targets): saved views of them are inputs, not activations."""
    warmup_steps: int = 1
    """Unmeasured steps first: lazy init, optimizer state, DDP's bucket rebuild in its second iteration."""
    held_outside_autograd: Callable[[], int] = lambda: 0
    """Bytes kept for backward outside autograd's saved-tensor hooks (a selective checkpoint's cache)."""


Builder = Callable[[TinyConfig, int], Trainer]


def batch(cfg: TinyConfig, *, seed: int, size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token targets, both (size, s); equal seeds give equal data."""
    gen = torch.Generator().manual_seed(1000 + seed)
    ids = torch.randint(0, cfg.vocab_size, (size or cfg.micro_batch, cfg.seq_len + 1), generator=gen)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def _world() -> dist.ProcessGroup:
    group = dist.group.WORLD
    assert group is not None, "no default process group"
    return group


def adamw(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def standard_step(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> Callable[[Probe], None]:
    def forward_backward(probe: Probe) -> None:
        with probe.in_phase("forward"):
            loss = cross_entropy(model(tokens), targets)
        probe.after_forward(model, loss)
        with probe.in_phase("backward"):
            loss.backward()  # type: ignore[no-untyped-call]
        probe.after_backward(model)

    return forward_backward


def make_trainer(model: nn.Module, cfg: TinyConfig, *, seed: int, warmup_steps: int = 1) -> Trainer:
    tokens, targets = batch(cfg, seed=seed)
    return Trainer(
        model=model,
        optimizer=adamw(model),
        forward_backward=standard_step(model, tokens, targets),
        inputs=(tokens, targets),
        warmup_steps=warmup_steps,
    )


def build_ddp(cfg: TinyConfig, world_size: int) -> Trainer:
    # DDP broadcasts buffers every forward and rebuilds its buckets in the second iteration: warm up twice
    return make_trainer(DistributedDataParallel(TinyLlama(cfg)), cfg, seed=dist.get_rank(), warmup_steps=2)


def fsdp_builder(
    *, reshard_after_forward: bool | None = None, mp_policy: MixedPrecisionPolicy | None = None
) -> Builder:
    """FSDP2: one ``fully_shard`` per block, then one on the root (embedding, final norm, output).

    ``reshard_after_forward=None`` is fully_shard's default: True for every block, False for the root. An
    explicit True also reshards the root, which backward then gathers again.
    """

    def build(cfg: TinyConfig, world_size: int) -> Trainer:
        model = TinyLlama(cfg)
        policy = mp_policy or MixedPrecisionPolicy()
        for layer in model.layers.values():
            fully_shard(layer, reshard_after_forward=reshard_after_forward, mp_policy=policy)
        fully_shard(model, reshard_after_forward=reshard_after_forward, mp_policy=policy)
        return make_trainer(model, cfg, seed=dist.get_rank())

    return build


def tp_plan(*, sequence_parallel: bool) -> tuple[dict[str, ParallelStyle], dict[str, ParallelStyle]]:
    """torchtitan's Llama plan: (plan of the root modules, plan of one block)."""
    seq = Shard(1) if sequence_parallel else Replicate()
    root: dict[str, ParallelStyle] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
        "output": ColwiseParallel(input_layouts=seq, output_layouts=Replicate()),
    }
    block: dict[str, ParallelStyle] = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=seq),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=seq),
    }
    if sequence_parallel:
        root["norm"] = SequenceParallel()
        block |= {
            "attention_norm": SequenceParallel(),
            "ffn_norm": SequenceParallel(),
            "attention": PrepareModuleInput(
                input_layouts=(Shard(1), None, None), desired_input_layouts=(Replicate(), None, None)
            ),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        }
    return root, block


def apply_tp(model: TinyLlama, mesh: DeviceMesh, *, sequence_parallel: bool) -> None:
    root, block = tp_plan(sequence_parallel=sequence_parallel)
    parallelize_module(model, mesh, root)
    for layer in model.layers.values():
        parallelize_module(layer, mesh, block)


def tp_builder(*, sequence_parallel: bool) -> Builder:
    def build(cfg: TinyConfig, world_size: int) -> Trainer:
        model = TinyLlama(cfg)
        apply_tp(
            model, init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",)), sequence_parallel=sequence_parallel
        )
        return make_trainer(model, cfg, seed=0)  # every TP rank sees the same batch

    return build


def build_fsdp_tp(cfg: TinyConfig, world_size: int) -> Trainer:
    """2-D mesh (dp_shard = n/2, tp = 2), TP with sequence parallelism inside, FSDP2 across (torchtitan's 2-D)."""
    if world_size % 2:
        raise ValueError(f"fsdp_tp needs an even world size, got {world_size}")
    mesh = init_device_mesh("cpu", (world_size // 2, 2), mesh_dim_names=("dp", "tp"))
    model = TinyLlama(cfg)
    apply_tp(model, mesh["tp"], sequence_parallel=True)
    for layer in model.layers.values():
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return make_trainer(model, cfg, seed=mesh.get_local_rank("dp"))


def build_ep(cfg: TinyConfig, world_size: int) -> Trainer:
    """Expert parallelism over all ranks (one expert group = the world); DDP averages the dense gradients."""
    if not cfg.num_experts:
        raise ValueError("the ep layout needs a model with num_experts > 0")
    model = TinyLlama(cfg)
    group = _world()
    expert_names = []
    for layer_name, layer in model.layers.items():
        moe = layer.feed_forward
        assert isinstance(moe, MoE)
        expert_names += [f"layers.{layer_name}.feed_forward.{p}" for p in shard_experts(moe, group)]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(  # type: ignore[no-untyped-call]
        model, expert_names
    )
    return make_trainer(
        DistributedDataParallel(model, forward_sync_buffers=False), cfg, seed=dist.get_rank(), warmup_steps=2
    )


def build_cp(cfg: TinyConfig, world_size: int) -> Trainer:
    """Context parallelism over all ranks: rank r keeps tokens [r s/n, (r+1) s/n) of every sequence."""
    if cfg.seq_len % world_size:
        raise ValueError(f"seq_len={cfg.seq_len} must be divisible by the context-parallel degree {world_size}")
    rank, chunk = dist.get_rank(), cfg.seq_len // world_size
    model = TinyLlama(cfg)
    for layer in model.layers.values():
        attention = layer.get_submodule("attention")
        assert isinstance(attention, Attention)
        attention.attention_fn = ring_attention(_world())
    tokens, targets = (t[:, rank * chunk : (rank + 1) * chunk].contiguous() for t in batch(cfg, seed=0))
    ddp = DistributedDataParallel(model, forward_sync_buffers=False)
    model.set_positions(torch.arange(rank * chunk, (rank + 1) * chunk))  # after DDP's init sync of the buffers
    return Trainer(
        model=ddp,
        optimizer=adamw(ddp),
        forward_backward=standard_step(ddp, tokens, targets),
        inputs=(tokens, targets),
        warmup_steps=2,
    )
