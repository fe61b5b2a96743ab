"""How long a search may run, how it is cancelled, and whom it tells of its progress.

Both are context variables, so a server's threads and the CLI each set their own: ``time_limit`` around a
search stops it with SearchTimeout between chunks of candidates, ``progress`` hands it a reporter.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Iterator

_DEADLINE: contextvars.ContextVar[tuple[float, threading.Event | None] | None] = contextvars.ContextVar(
    "search_deadline", default=None
)


class SearchTimeout(Exception):
    """A search ran past the time limit set with ``time_limit``, or was cancelled (the HTTP API answers 503)."""


@contextlib.contextmanager
def time_limit(seconds: float, *, cancel: threading.Event | None = None) -> Iterator[None]:
    """Searches started inside stop with SearchTimeout once ``seconds`` have passed or ``cancel`` is set
    (checked between chunks of candidates, so within a fraction of a second)."""
    token = _DEADLINE.set((time.monotonic() + seconds, cancel))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def check_deadline() -> None:
    """SearchTimeout if the time limit of the current context has passed or its search was cancelled."""
    limit = _DEADLINE.get()
    if limit is None:
        return
    deadline, cancel = limit
    if cancel is not None and cancel.is_set():
        raise SearchTimeout("the search was cancelled (the client left)")
    if time.monotonic() > deadline:
        raise SearchTimeout("the search ran past its time limit; ask for fewer GPUs or a narrower search")


_PROGRESS: contextvars.ContextVar[Callable[[int, float, float], None] | None] = contextvars.ContextVar(
    "search_progress", default=None
)


@contextlib.contextmanager
def progress(report: Callable[[int, float, float], None]) -> Iterator[None]:
    """Searches started inside call ``report(layouts evaluated, share of the search done, seconds elapsed)``
    after each chunk."""
    token = _PROGRESS.set(report)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def progress_report() -> Callable[[int, float, float], None] | None:
    """The reporter ``progress`` set in the current context, if any."""
    return _PROGRESS.get()
