"""Every collective one rank issues, with its type, group, phase and bytes.

``CommCounter`` is a ``TorchDispatchMode`` over the ``c10d`` ops (what ``torch.distributed`` calls, DDP's C++
reducer and FSDP2 issue: the reducer's ``ProcessGroup::allreduce`` goes through the ``c10d::allreduce_``
dispatcher op, and on CPU backward runs on the calling thread), the functional collectives
(``_c10d_functional*``, what DTensor issues) and ``_dtensor.shard_dim_alltoall``. It also wraps the Python
``torch.distributed`` calls and records one of them only when the dispatcher saw nothing during it, i.e. a
path that bypasses dispatch; with torch 2.13 on gloo none does (``python_calls`` counts the wrapped calls,
``bypass_calls`` those that bypassed).

Bytes follow the NCCL-tests "size" convention: all-reduce and broadcast the buffer, all-gather the gathered
output, reduce-scatter the full input, all-to-all the local input, send and recv the message.
``CommDebugMode`` is not used: it counts calls only and breaks under pipelining.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _resolve_process_group
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_DESUGARING = (DTensor, AsyncCollectiveTensor)
_NAMESPACES = frozenset({"c10d", "_c10d_functional", "_c10d_functional_autograd", "_dtensor"})
_OPS_BY_KIND = {
    "all_reduce": (
        "allreduce_",
        "allreduce_coalesced_",
        "all_reduce",
        "all_reduce_",
        "all_reduce_coalesced",
        "all_reduce_coalesced_",
    ),
    "all_gather": (
        "_allgather_base_",
        "allgather_",
        "allgather_coalesced_",
        "allgather_into_tensor_coalesced_",
        "all_gather_into_tensor",
        "all_gather_into_tensor_out",
        "all_gather_into_tensor_coalesced",
    ),
    "reduce_scatter": (
        "_reduce_scatter_base_",
        "reduce_scatter_",
        "reduce_scatter_tensor_coalesced_",
        "reduce_scatter_tensor",
        "reduce_scatter_tensor_out",
        "reduce_scatter_tensor_coalesced",
    ),
    "all_to_all": ("alltoall_base_", "alltoall_", "all_to_all_single", "shard_dim_alltoall"),
    "broadcast": ("broadcast_", "broadcast"),
    "send": ("send", "isend"),
    "recv": ("recv_", "irecv", "recv_any_source_"),
    "reduce": ("reduce_",),
    "gather": ("gather_",),
    "scatter": ("scatter_",),
    "barrier": ("barrier", "monitored_barrier_"),
}
# op name without its namespace -> collective kind
_KIND = {op: kind for kind, ops in _OPS_BY_KIND.items() for op in ops}
# the argument holding the bytes that count, per kind (schema argument names)
_SIZE_ARG = {"all_gather": "output", "reduce_scatter": "input", "recv": "output"}
_PYTHON_KIND = {
    "isend": "send",
    "irecv": "recv",
    "all_gather_into_tensor": "all_gather",
    "all_gather_single": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "all_to_all_single": "all_to_all",
}
# batch_isend_irecv is not wrapped: it calls the (wrapped) module-level isend and irecv
_PYTHON_APIS = ("all_reduce", "broadcast", "send", "recv", *_PYTHON_KIND)


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveCall:
    """One collective as issued by this rank."""

    kind: str
    """all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send, recv, barrier, ..."""
    op: str
    """The dispatcher op (``c10d._allgather_base_``) or Python API that issued it."""
    phase: str
    """forward, backward, optimizer (or whatever phase the caller set)."""
    group_size: int
    size_bytes: int
    """Bytes by the NCCL-tests convention (see the module docstring)."""
    input_bytes: int
    output_bytes: int
    dtype: str
    group_ranks: str = ""
    """Global ranks of the group, comma-separated (tells a 2-D mesh's axes apart)."""
    peer: int = -1
    """Group rank of the other side of a send or recv (-1 for collectives)."""


def _group_of(arg: Any) -> dist.ProcessGroup:
    if isinstance(arg, torch.ScriptObject):
        return dist.ProcessGroup.unbox(arg)
    if isinstance(arg, dist.ProcessGroup):
        return arg
    return _resolve_process_group(arg)


def _ranks_of(group: dist.ProcessGroup) -> str:
    return ",".join(str(r) for r in dist.get_process_group_ranks(group))


def _bytes_of(value: Any) -> tuple[int, str]:
    tensors = [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]
    return sum(tensor_bytes(t) for t in tensors), (str(tensors[0].dtype).removeprefix("torch.") if tensors else "")


def call_from_dispatch(
    func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, phase: str
) -> CollectiveCall | None:
    """Describe one dispatcher-level collective, or None for ops that move no data (wait_tensor)."""
    name = func._schema.name.split("::")[1]
    kind = _KIND.get(name)
    if kind is None:
        return None
    bound = dict(zip((a.name for a in func._schema.arguments), args, strict=False)) | kwargs
    group, peer = None, -1
    for key in ("process_group", "group_name"):
        if key in bound:
            group = _group_of(bound[key])
    if kind in ("send", "recv"):
        peer = int(bound.get("dst", bound.get("src", -1)))
    ins = [v for k, v in bound.items() if k in ("input", "input_tensor", "input_tensors", "inputs", "input_list")]
    outs = [v for k, v in bound.items() if k.startswith("output")] or ([out] if func.namespace != "c10d" else [])
    if kind in ("all_reduce", "broadcast", "send", "recv", "reduce", "barrier") and not ins:
        ins = [bound.get("tensors", bound.get("tensor", bound.get("input")))]
        outs = outs or ins
    if kind == "recv":
        ins, outs = [], ins
    in_bytes, dtype = _bytes_of(ins)
    out_bytes, out_dtype = _bytes_of(outs)
    size = out_bytes if _SIZE_ARG.get(kind) == "output" else in_bytes
    return CollectiveCall(
        kind=kind,
        op=str(func).removesuffix(".default"),
        phase=phase,
        group_size=group.size() if group is not None else 0,
        group_ranks=_ranks_of(group) if group is not None else "",
        size_bytes=size,
        input_bytes=in_bytes,
        output_bytes=out_bytes,
        dtype=dtype or out_dtype,
        peer=peer,
    )


class CommCounter(TorchDispatchMode):
    """Records every collective this rank issues while active; set ``phase`` to label them."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.calls: list[CollectiveCall] = []
        self.phase = "forward"
        self.python_calls = 0
        self.bypass_calls = 0
        self._local = threading.local()
        self._patched: list[tuple[Any, str, Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        if any(issubclass(t, _DESUGARING) for t in types):
            # let DTensor and AsyncCollectiveTensor desugar first; their collectives and local ops then come back
            # through this mode as plain tensors (what CommDebugMode does). FakeTensor (DTensor's sharding
            # propagation) must not get NotImplemented.
            return NotImplemented
        out = func(*args, **kwargs)
        if func.namespace in _NAMESPACES:
            call = call_from_dispatch(func, args, kwargs, out, self.phase)
            if call is not None:
                self.calls.append(call)
        return out

    @contextlib.contextmanager
    def in_phase(self, phase: str) -> Iterator[None]:
        previous, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = previous

    def __enter__(self) -> CommCounter:
        super().__enter__()  # type: ignore[no-untyped-call]
        for api in _PYTHON_APIS:
            original = getattr(dist.distributed_c10d, api)
            wrapped = self._wrap(api, original)
            for namespace in (dist, dist.distributed_c10d):
                self._patched.append((namespace, api, getattr(namespace, api)))
                setattr(namespace, api, wrapped)
        return self

    def __exit__(self, *exc: object) -> None:
        for namespace, api, original in reversed(self._patched):
            setattr(namespace, api, original)
        self._patched.clear()
        super().__exit__(*exc)  # type: ignore[no-untyped-call]

    def _wrap(self, api: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._local, "depth", 0)
            before = len(self.calls)
            self._local.depth = depth + 1
            try:
                return original(*args, **kwargs)
            finally:
                self._local.depth = depth
                if depth == 0:
                    self.python_calls += 1
                    if len(self.calls) == before:
                        self.bypass_calls += 1
                        self._record_python(api, args, kwargs)

        return wrapper

    def _record_python(self, api: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        kind = _PYTHON_KIND.get(api, api)
        size = sum(tensor_bytes(t) for t in tensors[:1])
        group = kwargs.get("group") or dist.group.WORLD
        assert group is not None, "collective outside an initialized process group"
        self.calls.append(
            CollectiveCall(
                kind=kind,
                op=f"python.{api}",
                phase=self.phase,
                group_size=group.size(),
                group_ranks=_ranks_of(group),
                size_bytes=size,
                input_bytes=size,
                output_bytes=size,
                dtype=str(tensors[0].dtype) if tensors else "",
            )
        )
