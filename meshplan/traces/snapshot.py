"""A CUDA memory snapshot (``torch.cuda.memory._snapshot()``, pickled by ``torch.cuda.memory._dump_snapshot``)
read without running anything it names.

The snapshot is plain data: a dict of ``segments`` (each with its ``total_size`` and its ``blocks``: ``size``,
``state`` and, when the history was recorded, the ``frames`` that allocated it) and ``device_traces`` (the
allocator's recent actions). Its opcodes are read first, without building anything (``pickletools.genops``):
only those that build plain data are admitted (``PLAIN_OPCODES``), so a pickle that names any class or function
(``os.system``, ``builtins.eval``, even ``collections.OrderedDict``), calls anything, or uses out-of-band buffers is
refused with one line, as is one whose memo indices run past its own length (a memo slot a billion places out
would make the unpickler allocate for it). It is then built by an unpickler whose ``find_class`` refuses every
global all the same, and what it holds is walked within fixed bounds.

Each live block is given to a term by its stack frames, where the history was recorded (the first rule that any
frame meets, in this order): the optimizer's state (``torch/optim``), communication buffers (a collective in
``torch/distributed``), parameters (a module's ``_apply``, ``reset_parameters``, FSDP's sharding at init),
gradients (autograd's backward), activations (a module's forward). A block without frames, or whose frames meet
no rule, is unattributed.
"""

from __future__ import annotations

import io
import pickle
import pickletools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from meshplan.files import read_bytes_file

MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024
MAX_BLOCKS = 2_000_000
MAX_FRAMES = 256
"""Frames read per block (innermost first): a Python stack is rarely deeper."""
TERMS = ("optimizer_state", "comm_buffers", "parameters", "gradients", "activations")
_RULES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    # term, a filename holding any of, or a function name holding any of
    ("optimizer_state", ("torch/optim/",), ("_init_group",)),
    ("comm_buffers", ("_fsdp_collectives", "distributed_c10d"), ("all_gather", "reduce_scatter", "all_to_all")),
    ("parameters", (), ("_apply", "reset_parameters", "_init_sharded_param", "init_weights", "lazy_init")),
    ("gradients", ("torch/autograd/",), ("backward", "accumulate_grad")),
    ("activations", (), ("forward", "_call_impl")),
)


PLAIN_OPCODES = frozenset(
    [
        "PROTO",
        "FRAME",
        "STOP",
        "MARK",
        "POP",
        "POP_MARK",
        "DUP",
        "NONE",
        "NEWTRUE",
        "NEWFALSE",
        "INT",
        "BININT",
        "BININT1",
        "BININT2",
        "LONG",
        "LONG1",
        "LONG4",
        "FLOAT",
        "BINFLOAT",
        "STRING",
        "BINSTRING",
        "SHORT_BINSTRING",
        "UNICODE",
        "BINUNICODE",
        "SHORT_BINUNICODE",
        "BINUNICODE8",
        "BINBYTES",
        "SHORT_BINBYTES",
        "BINBYTES8",
        "EMPTY_LIST",
        "APPEND",
        "APPENDS",
        "LIST",
        "EMPTY_TUPLE",
        "TUPLE",
        "TUPLE1",
        "TUPLE2",
        "TUPLE3",
        "EMPTY_DICT",
        "DICT",
        "SETITEM",
        "SETITEMS",
        "EMPTY_SET",
        "ADDITEMS",
        "FROZENSET",
        "PUT",
        "BINPUT",
        "LONG_BINPUT",
        "MEMOIZE",
        "GET",
        "BINGET",
        "LONG_BINGET",
    ]
)
"""The pickle opcodes that build dicts, lists, tuples, sets, strings, bytes, numbers, booleans and None."""
_MEMO = frozenset({"PUT", "BINPUT", "LONG_BINPUT", "GET", "BINGET", "LONG_BINGET"})


def _plain(data: bytes, label: str) -> None:
    """ValueError unless every opcode of the pickle builds plain data and every memo index is within its length."""
    strings: list[str] = []
    try:
        for count, (op, arg, _pos) in enumerate(pickletools.genops(data)):
            if op.name not in PLAIN_OPCODES:
                if op.name == "GLOBAL":
                    named = str(arg).replace(" ", ".")
                elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                    named = f"{strings[-2]}.{strings[-1]}"
                else:
                    named = f"the opcode {op.name}"
                _refuse(label, f"refused: the pickle names {named[:120]}; a memory snapshot holds only plain data")
            if op.name in _MEMO and isinstance(arg, int) and arg > count:
                _refuse(label, f"not a readable pickle (memo index {arg:,} past its {count:,} opcodes)")
            if isinstance(arg, str):
                strings = [*strings[-1:], arg[:60]]
    except ValueError as exc:
        if str(exc).startswith(label):
            raise
        _refuse(label, f"not a readable pickle ({str(exc)[:120] or 'malformed'})")


class _Refused(pickle.UnpicklingError):
    """A global or persistent id the snapshot's unpickler will not build."""


class _NoClasses(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings, numbers, booleans and None; refuses every global and persistent id."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise _Refused(f"{module[:60]}.{name[:60]}")

    def persistent_load(self, pid: Any) -> NoReturn:
        raise _Refused("a persistent id")


@dataclass(frozen=True, slots=True)
class MemorySnapshot:
    """What the allocator held when the snapshot was taken, and the peaks its recorded history shows."""

    reserved_bytes: int
    """Every segment's size: what the caching allocator holds from the driver (``memory_reserved``)."""
    allocated_bytes: int
    """Blocks in use (``active_allocated``): ``memory_allocated``."""
    segments: int
    largest_free_block_bytes: int
    by_term: dict[str, int]
    """Allocated bytes by term (``TERMS``, and ``unattributed``)."""
    framed_blocks: int
    """Live blocks that carry stack frames (0: the history was not recorded, and no block has a term)."""
    peak_allocated_bytes: int
    """The most allocated at once in the recorded history (at least ``allocated_bytes``)."""
    peak_reserved_bytes: int

    @property
    def allocator_reserve_bytes(self) -> int:
        """Reserved but not allocated: cached free blocks and fragmentation."""
        return self.reserved_bytes - self.allocated_bytes


def _refuse(label: str, why: str) -> NoReturn:
    raise ValueError(f"{label}: {why}")


def read_snapshot(path: Path | str) -> MemorySnapshot:
    """The snapshot in a pickle file; ValueError (one line) for a pickle that names any class, a truncated or
    malformed one, or data not shaped as ``torch.cuda.memory._snapshot()`` writes it."""
    label = f"snapshot {path}"
    data = read_bytes_file(path, what="snapshot", limit=MAX_SNAPSHOT_BYTES)
    _plain(data, label)
    try:
        raw = _NoClasses(io.BytesIO(data)).load()
    except _Refused as exc:
        _refuse(label, f"refused: the pickle names {exc}; a memory snapshot holds only plain data")
    except pickle.UnpicklingError as exc:
        _refuse(label, f"not a readable pickle ({str(exc)[:120] or 'malformed'})")
    except (EOFError, ValueError, IndexError, KeyError, TypeError, AttributeError, OverflowError) as exc:
        _refuse(label, f"not a readable pickle ({type(exc).__name__}: {str(exc)[:100] or 'truncated'})")
    except (MemoryError, RecursionError):
        _refuse(label, "the pickle builds more than can be read")
    return summarize(raw, label)


def summarize(raw: Any, label: str = "snapshot") -> MemorySnapshot:
    """A snapshot's plain data (as ``torch.cuda.memory._snapshot()`` returns it) summed by term."""
    if not isinstance(raw, dict) or not isinstance(raw.get("segments"), list):
        _refuse(label, "not a CUDA memory snapshot (expected a dict with a 'segments' list)")
    by_term = dict.fromkeys([*TERMS, "unattributed"], 0)
    reserved = allocated = framed = blocks = largest_free = 0
    for i, segment in enumerate(raw["segments"]):
        if not isinstance(segment, dict):
            _refuse(label, f"segment {i} is not a dict")
        reserved += _size(segment, "total_size", label, f"segment {i}")
        seg_blocks = segment.get("blocks", [])
        if not isinstance(seg_blocks, list):
            _refuse(label, f"segment {i}'s blocks are not a list")
        blocks += len(seg_blocks)
        if blocks > MAX_BLOCKS:
            _refuse(label, f"over {MAX_BLOCKS:,} blocks")
        for j, block in enumerate(seg_blocks):
            if not isinstance(block, dict):
                _refuse(label, f"segment {i} block {j} is not a dict")
            size = _size(block, "size", label, f"segment {i} block {j}")
            if block.get("state") != "active_allocated":
                if block.get("state") == "inactive":
                    largest_free = max(largest_free, size)
                continue
            allocated += size
            frames = block.get("frames")
            term = _term(frames) if isinstance(frames, list) else None
            framed += bool(frames)
            by_term[term or "unattributed"] += size
    if allocated > reserved:
        _refuse(label, f"allocated blocks ({allocated:,} B) exceed the segments ({reserved:,} B)")
    peak_allocated, peak_reserved = _peaks(raw.get("device_traces"), allocated, reserved, label)
    return MemorySnapshot(
        reserved_bytes=reserved,
        allocated_bytes=allocated,
        segments=len(raw["segments"]),
        largest_free_block_bytes=largest_free,
        by_term=by_term,
        framed_blocks=framed,
        peak_allocated_bytes=peak_allocated,
        peak_reserved_bytes=peak_reserved,
    )


def _size(item: dict[str, Any], key: str, label: str, where: str) -> int:
    value = item.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**50:
        _refuse(label, f"{where}: '{key}' must be a byte count, got {str(value)[:40]}")
    return value


def _term(frames: list[Any]) -> str | None:
    names = [
        (str(f.get("filename", ""))[:300], str(f.get("name", ""))[:200])
        for f in frames[:MAX_FRAMES]
        if isinstance(f, dict)
    ]
    for term, files, functions in _RULES:
        for filename, name in names:
            if any(x in filename for x in files) or any(x in name for x in functions):
                return term
    return None


def _peaks(traces: Any, allocated: int, reserved: int, label: str) -> tuple[int, int]:
    """The most allocated and reserved at once in the recorded actions, replayed back from the snapshot's state."""
    if not isinstance(traces, list):
        return allocated, reserved
    events = [e for device in traces if isinstance(device, list) for e in device[:MAX_BLOCKS] if isinstance(e, dict)]
    steps_a, steps_r = [], []
    for e in events[:MAX_BLOCKS]:
        size, action = e.get("size"), e.get("action")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size < 2**50:
            continue
        delta_a = size if action == "alloc" else -size if action == "free_completed" else 0
        delta_r = (
            size
            if action in ("segment_alloc", "segment_map")
            else -size
            if action in ("segment_free", "segment_unmap")
            else 0
        )
        steps_a.append(delta_a)
        steps_r.append(delta_r)
    level_a, level_r = allocated - sum(steps_a), reserved - sum(steps_r)
    peak_a, peak_r = max(level_a, allocated), max(level_r, reserved)
    for da, dr in zip(steps_a, steps_r, strict=True):
        level_a += da
        level_r += dr
        peak_a, peak_r = max(peak_a, level_a), max(peak_r, level_r)
    return peak_a, peak_r


__all__ = ["MAX_SNAPSHOT_BYTES", "TERMS", "MemorySnapshot", "read_snapshot", "summarize"]
