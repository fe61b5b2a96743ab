"""What one rank holds: training-state bytes and the tensors autograd saves for backward.

- ``state_bytes``: parameters, gradients, optimizer state and buffers, from the local shards (a ``DTensor``
  contributes its local tensor) and from ``optimizer.state``. Each comes twice: logical bytes (numel x element
  size of every local tensor) and storage bytes (each storage once); they differ where a framework pads (FSDP2
  pads dim 0 of every shard to a multiple of the group size).
- ``SavedTensorTracker``: ``torch.autograd.graph.saved_tensors_hooks`` around a step. Each storage counts once,
  keyed by its StorageImpl rather than its data pointer: FSDP2 frees unsharded parameters with ``resize_(0)``
  and the allocator may hand the same address to the next activation. Saved parameters (sharded or gathered),
  buffers and the batch's own tensors are kept apart from activations. It reports the total packed during the
  step and the peak held at once (a token releases its bytes when autograd frees the saved variable), which is
  what pipeline schedules differ in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from meshplan.check.comms import tensor_bytes

_SAVED_KINDS = ("activation", "param", "buffer", "input")


def _inner_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """Plain tensors under a tensor subclass (DTensor -> its local shard, AsyncCollectiveTensor -> elem)."""
    if not hasattr(t, "__tensor_flatten__"):
        return [t]
    names, _ = t.__tensor_flatten__()
    inner = [getattr(t, name) for name in names]
    # DTensor also lists its device mesh, an opaque non-tensor
    return [x for value in inner if isinstance(value, torch.Tensor) for x in _inner_tensors(value)]


def _storage_key(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


@dataclass(slots=True)
class SavedTensorTracker:
    """Bytes autograd saves for backward, by kind: activation, param, buffer or input.

    ``param`` covers sharded and gathered parameters, ``buffer`` the module buffers (rotary tables), ``input``
    the step's batch tensors and their views (token ids, targets): none of them is allocated by the forward.
    """

    module: nn.Module
    inputs: tuple[torch.Tensor, ...] = ()
    saved_bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_SAVED_KINDS, 0))
    """Storages packed during the step, each once, by kind."""
    peak_activation_bytes: int = 0
    """Most activation bytes held at one moment (differs from the total under pipelining)."""
    live_activation_bytes: int = 0
    _live: dict[int, list[int]] = field(default_factory=dict)
    _seen: set[int] = field(default_factory=set)

    def _classify(self, storage_key: int) -> str:
        for kind, tensors in (
            ("param", self.module.parameters()),
            ("buffer", self.module.buffers()),
            ("input", self.inputs),
        ):
            if any(_storage_key(t) == storage_key for x in tensors for t in _inner_tensors(x)):
                return kind
        return "activation"

    def _pack(self, t: torch.Tensor) -> Any:
        keys = []
        for inner in _inner_tensors(t):
            key = _storage_key(inner)
            if key not in self._seen:
                self._seen.add(key)
                kind, nbytes = self._classify(key), inner.untyped_storage().nbytes()
                self.saved_bytes[kind] += nbytes
                if kind == "activation":
                    self._live[key] = [nbytes, 0]
            if key in self._live:
                self._live[key][1] += 1
                if self._live[key][1] == 1:
                    self.live_activation_bytes += self._live[key][0]
                    self.peak_activation_bytes = max(self.peak_activation_bytes, self.live_activation_bytes)
                keys.append(key)
        return _Token(t, keys, self)

    def _release(self, keys: list[int]) -> None:
        for key in keys:
            entry = self._live[key]
            entry[1] -= 1
            if entry[1] == 0:
                # the storage may die now and its StorageImpl address be reused by a new activation
                self.live_activation_bytes -= entry[0]
                del self._live[key]
                self._seen.discard(key)

    def live_activation_storages(self) -> list[int]:
        """The bytes of each activation storage autograd holds now."""
        return [nbytes for nbytes, _ in self._live.values()]

    @contextlib.contextmanager
    def track(self) -> Iterator[SavedTensorTracker]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack):
            yield self


class _Token:
    """What autograd stores instead of the tensor; frees its bytes from the live count when dropped."""

    __slots__ = ("keys", "tensor", "tracker")

    def __init__(self, tensor: torch.Tensor, keys: list[int], tracker: SavedTensorTracker) -> None:
        self.tensor, self.keys, self.tracker = tensor, keys, tracker

    def __del__(self) -> None:
        self.tracker._release(self.keys)


def _unpack(token: _Token) -> torch.Tensor:
    return token.tensor


def _local_bytes(tensors: Sequence[torch.Tensor]) -> tuple[int, int]:
    """(logical bytes of the local shards, bytes of their storages counted once)."""
    inner = [x for t in tensors for x in _inner_tensors(t)]
    storages = {_storage_key(x): x.untyped_storage().nbytes() for x in inner}
    return sum(tensor_bytes(x) for x in inner), sum(storages.values())


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Training state this rank holds now, by term (call between backward and ``zero_grad``)."""
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    out: dict[str, int] = {}
    out["params_bytes"], out["params_storage_bytes"] = _local_bytes(params)
    out["grads_bytes"], out["grads_storage_bytes"] = _local_bytes(grads)
    out["buffers_bytes"], _ = _local_bytes(list(model.buffers()))
    out["param_tensors"] = len(params)
    if optimizer is not None:
        state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        out["optimizer_bytes"], _ = _local_bytes(state)
        out["optimizer_step_bytes"], _ = _local_bytes([v for v in state if v.dim() == 0])
    return out


def fsdp_gathered_bytes(model: nn.Module) -> int:
    """Bytes of FSDP2's unsharded (all-gathered, padded) parameters held right now."""
    total = 0
    for module in model.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        if get_state is None:
            continue
        for group in get_state()._fsdp_param_groups:
            for fsdp_param in group.fsdp_params:
                if fsdp_param.sharded_state.name == "UNSHARDED":
                    total += sum(t.untyped_storage().nbytes() for t in fsdp_param.all_gather_outputs)
    return total


def ddp_bucket_bytes(model: nn.Module) -> int:
    """Bytes of DDP's gradient buckets: a second copy of the gradients unless ``gradient_as_bucket_view``."""
    logging_data = getattr(model, "_get_ddp_logging_data", None)
    if logging_data is None:
        return 0
    data = logging_data()
    if data.get("gradient_as_bucket_view"):
        return 0
    sizes = str(data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or "")
    return sum(int(x) for x in sizes.replace(",", " ").split())


def held_grads_bytes(model: nn.Module) -> int:
    """Bytes of every gradient this rank holds now, each storage once: the parameters' own, and FSDP2's
    unsharded gradients kept between micro-batches without gradient sync (in the parameter dtype, or the
    reduce dtype once upcast to accumulate)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    for module in model.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        if get_state is None:
            continue
        for group in get_state()._fsdp_param_groups:
            for fsdp_param in group.fsdp_params:
                unsharded = getattr(fsdp_param, "_unsharded_param", None)
                held = [fsdp_param.unsharded_accumulated_grad, None if unsharded is None else unsharded.grad]
                grads += [g for g in held if g is not None]
    return _local_bytes(grads)[1]


def cached_bytes(caches: Sequence[Any]) -> int:
    """Bytes of the tensors in selective-checkpoint caches (``{op: {index: outputs}}``), each storage once."""
    storages: dict[int, int] = {}

    def visit(value: Any) -> None:
        if isinstance(value, dict | list | tuple):
            for v in value.values() if isinstance(value, dict) else value:
                visit(v)
        elif isinstance(getattr(value, "val", None), torch.Tensor):  # checkpoint's _VersionWrapper
            visit(value.val)
        elif isinstance(value, torch.Tensor):
            for inner in _inner_tensors(value):
                storages[_storage_key(inner)] = inner.untyped_storage().nbytes()

    visit(list(caches))
    return sum(storages.values())
