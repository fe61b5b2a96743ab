"""A PyTorch profiler trace (Kineto's Chrome trace JSON, as ``torch.profiler``'s ``export_chrome_trace`` writes it)
read into spans, in bounded memory.

The file is read by ``meshplan.files.read_text_file`` (a regular file of at most ``MAX_TRACE_BYTES``); its
``traceEvents`` array is decoded one event at a time, each reduced at once to a ``Span`` of the complete events
(``ph`` "X") the comparison uses, so memory holds the text and the kept spans, never the whole parsed tree. A trace
of more than ``MAX_TRACE_EVENTS`` events is refused: at once when its text holds more ``"ph":`` keys than that
(every event has one; a key is the only place that sequence can stand in JSON), else at the first event past the
limit: profile fewer steps. A
truncated file, a number that is not finite and nesting deeper than Python's parser allows are each one
``ValueError`` line naming the file.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshplan.files import read_text_file

MAX_TRACE_BYTES = 256 * 1024 * 1024
"""Largest trace read: a few profiled steps of a large model on one rank are tens of MB."""
MAX_TRACE_EVENTS = 500_000
"""Most events read: one step of a 70B model on one GPU is of the order of 10^4 kernels and 10^4 CPU ops."""
KEPT_CATEGORIES = frozenset(
    {"kernel", "gpu_memcpy", "gpu_memset", "cpu_op", "user_annotation", "gpu_user_annotation", "cuda_runtime"}
)
"""The complete events a comparison reads (python_function, Trace and the flow arrows are dropped as read)."""
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class Span:
    """One complete event: what ran, on which lane (process and thread, or device and stream), from when to when."""

    name: str
    cat: str
    lane: str
    start_us: float
    end_us: float
    collective: str = ""
    """The collective a CPU op names in its arguments (``record_param_comms``' "Collective name"), if any."""


@dataclass(frozen=True, slots=True)
class Trace:
    spans: tuple[Span, ...]
    events: int
    """Events in the file, of every kind."""
    rank: int | None = None
    world_size: int | None = None
    """From the trace's ``distributedInfo`` where the profiler wrote it."""

    @property
    def on_device(self) -> bool:
        """Whether the trace holds GPU kernels (else it is a CPU-only trace, as a gloo run writes)."""
        return any(s.cat in ("kernel", "gpu_memcpy", "gpu_memset") for s in self.spans)


def read_trace(path: Path | str, *, max_events: int = MAX_TRACE_EVENTS) -> Trace:
    """The spans of a trace file; ValueError (one line) for anything but a Chrome trace within the limits."""
    label = f"trace {path}"
    text = read_text_file(path, what="trace", limit=MAX_TRACE_BYTES)
    if text.count('"ph":') > max_events:  # each event has one "ph" key: refused before any decoding
        raise ValueError(
            f"{label} holds over {max_events:,} events; profile fewer steps (a schedule with active=1 or 2)"
        )
    spans: list[Span] = []
    meta: dict[str, Any] = {}
    count = 0
    try:
        for event in _events(text, label, meta):
            count += 1
            if count > max_events:
                raise ValueError(
                    f"{label} holds over {max_events:,} events; profile fewer steps (a schedule with active=1 or 2)"
                )
            span = _span(event)
            if span is not None:
                spans.append(span)
    except RecursionError:
        raise ValueError(f"{label} nests arrays or objects too deeply") from None
    info = meta.get("distributedInfo")
    rank = _int(info.get("rank")) if isinstance(info, dict) else None
    world = _int(info.get("world_size")) if isinstance(info, dict) else None
    if not spans:
        raise ValueError(f"{label} holds no complete events (ph 'X'): not a profiler trace")
    return Trace(spans=tuple(spans), events=count, rank=rank, world_size=world)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31 else None


def _number(value: Any) -> float | None:
    """A finite float, or None (strings, booleans, NaN, infinities and integers beyond a float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        out = float(value)
    except OverflowError:
        return None
    return out if math.isfinite(out) else None


def _span(event: Any) -> Span | None:
    if not isinstance(event, dict) or event.get("ph") != "X" or event.get("cat") not in KEPT_CATEGORIES:
        return None
    name, ts, dur = event.get("name"), _number(event.get("ts")), _number(event.get("dur"))
    if not isinstance(name, str) or ts is None or dur is None or dur < 0:
        return None
    args = event.get("args")
    collective = args.get("Collective name", "") if isinstance(args, dict) else ""
    lane = f"{event.get('pid')}:{event.get('tid')}"
    return Span(  # interned: a trace repeats a few hundred names over its spans
        name=sys.intern(name[:200]),
        cat=sys.intern(event["cat"]),
        lane=sys.intern(lane[:80]),
        start_us=ts,
        end_us=ts + dur,
        collective=collective[:40] if isinstance(collective, str) else "",
    )


def _skip(text: str, i: int) -> int:
    match = _WHITESPACE.match(text, i)
    return match.end() if match else i


def _decode(text: str, i: int, label: str) -> tuple[Any, int]:
    try:
        return _DECODER.raw_decode(text, i)
    except json.JSONDecodeError as exc:
        where = "ends early (a truncated file?)" if exc.pos >= len(text.rstrip()) else "is malformed"
        raise ValueError(f"{label} {where}: {exc.msg} at character {exc.pos:,}") from None


def _expect(text: str, i: int, chars: str, label: str, what: str) -> int:
    i = _skip(text, i)
    if i >= len(text):
        raise ValueError(f"{label} ends early (a truncated file?): expected {what}")
    if text[i] not in chars:
        raise ValueError(f"{label} is malformed at character {i:,}: expected {what}")
    return i


def _events(text: str, label: str, meta: dict[str, Any]) -> Iterator[Any]:
    """Each item of the trace's event array: a bare array, or an object's ``traceEvents`` (its other keys, small
    ones such as ``distributedInfo``, go to ``meta``)."""
    i = _expect(text, 0, "[{", label, "a JSON object or array")
    if text[i] == "[":
        yield from _array(text, i, label)
        return
    i = _skip(text, i + 1)
    if text.startswith("}", i):
        return
    while True:
        i = _expect(text, i, '"', label, "a key")
        key, i = _decode(text, i, label)
        i = _expect(text, i, ":", label, "':'")
        i = _skip(text, i + 1)
        if key == "traceEvents":
            i = _expect(text, i, "[", label, "the traceEvents array")
            end = [i]
            yield from _array(text, i, label, end)
            i = end[0]
        else:
            meta[key], i = _decode(text, i, label)
        i = _expect(text, i, ",}", label, "',' or '}'")
        if text[i] == "}":
            break
        i += 1
    if _skip(text, i + 1) != len(text):
        raise ValueError(f"{label} is malformed: text after the closing brace")


def _array(text: str, i: int, label: str, end: list[int] | None = None) -> Iterator[Any]:
    """The items of the array opening at ``i``; ``end`` receives the index of its closing bracket."""
    i = _skip(text, i + 1)
    if text.startswith("]", i):
        if end is not None:
            end[0] = i + 1
        return
    while True:
        item, i = _decode(text, i, label)
        yield item
        i = _expect(text, i, ",]", label, "',' or ']' in the event array")
        if text[i] == "]":
            break
        i = _skip(text, i + 1)
    if end is not None:
        end[0] = i + 1
    elif _skip(text, i + 1) != len(text):
        raise ValueError(f"{label} is malformed: text after the closing bracket")


__all__ = ["MAX_TRACE_BYTES", "MAX_TRACE_EVENTS", "Span", "Trace", "read_trace"]
