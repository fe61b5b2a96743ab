"""The process the API's searches run in, off the server's interpreter: one search at a time, kept warm.

A search holds Python's GIL for long stretches (millions of small objects made, sorted and freed: 0.3-0.6 s at
a time in a disaggregated serve-plan on 256 GPUs), and a server that runs it in a thread answers nothing else
meanwhile. Here the search runs in a child process (spawned at the first search, then reused); the server's
thread only waits on a pipe. The time limit and a cancellation reach the child, which stops at its next check
(``search.rank.check_deadline``); a child that has not answered ``GRACE_S`` after that is killed, and a new one
is spawned for the next search, so no search outlives its limit by more than that. After each search the child
hands the memory it freed back to the system.
"""

from __future__ import annotations

import functools
import gc
import multiprocessing
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from typing import Any, cast

from meshplan.search.limits import SearchTimeout, time_limit

GRACE_S = 2.0
"""Seconds a child has to stop once its time limit has passed or its search was cancelled; then it is killed."""
POLL_S = 0.1
"""How often the server's thread looks at the clock and the cancel flag while the child works."""


class SearchProcess:
    """A child process that runs one search at a time: ``run(compute, seconds=..., cancel=...)``."""

    def __init__(self, grace_s: float = GRACE_S) -> None:
        self.grace_s = grace_s
        self._lock = threading.Lock()
        self._context = multiprocessing.get_context("spawn")  # never fork a threaded server
        self._child: tuple[BaseProcess, Connection, Event] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._child is None else self._child[0].pid

    def start(self) -> None:
        """Spawn the child now (it is otherwise spawned at the first search)."""
        with self._lock:
            self._started()

    def _started(self) -> tuple[BaseProcess, Connection, Event]:
        if self._child is not None and self._child[0].is_alive():
            return self._child
        self._discard()
        ours, theirs = self._context.Pipe()
        cancel = self._context.Event()
        child = self._context.Process(target=_serve, args=(theirs, cancel), name="meshplan-search", daemon=True)
        child.start()
        theirs.close()
        self._child = (child, ours, cancel)
        return self._child

    def _discard(self) -> None:
        """Kill the child (if any); the next search spawns a new one."""
        if self._child is None:
            return
        child, conn, _ = self._child
        self._child = None
        if child.is_alive():
            child.kill()
        child.join(5)
        conn.close()

    def run(self, compute: Callable[[], Any], *, seconds: float, cancel: threading.Event) -> Any:
        """``compute()`` (picklable: a module-level function or a partial of one, picklable arguments) in the
        child, as JSON data; its exception re-raised here; SearchTimeout past ``seconds`` or once ``cancel`` is
        set."""
        with self._lock:
            if cancel.is_set():
                raise SearchTimeout("the search was cancelled (the client left)")
            child, conn, stop = self._started()
            stop.clear()
            conn.send((functools.partial(_as_json, compute), seconds))
            deadline = time.monotonic() + seconds
            while not conn.poll(POLL_S):
                if not child.is_alive():  # killed from outside: most likely out of memory
                    raise self._ended(child)
                if cancel.is_set() or time.monotonic() > deadline:
                    stop.set()
                    if not conn.poll(self.grace_s):  # stuck between checks: kill it
                        self._discard()
                        why = "was cancelled (the client left)" if cancel.is_set() else "ran past its time limit"
                        raise SearchTimeout(f"the search {why}; ask for fewer GPUs or a narrower search")
                    break
            try:
                ok, value = conn.recv()
            except (EOFError, OSError):
                raise self._ended(child) from None
        if not ok:
            raise value
        return value

    def _ended(self, child: BaseProcess) -> SearchTimeout:
        """The child died in a search (killed from outside: most likely out of memory); a new one will start."""
        self._discard()
        return SearchTimeout(
            f"the search process ended (exit code {child.exitcode}) before answering; "
            "ask for fewer GPUs or a narrower search"
        )

    def close(self) -> None:
        with self._lock:
            self._discard()


SEARCHES = SearchProcess()
"""The server's search process (one per server process: the search gate lets one search run at a time)."""


def _as_json(compute: Callable[[], Any]) -> Any:
    from meshplan.render import jsonable

    return jsonable(compute())


def _serve(conn: Connection, cancel: Event) -> None:
    """The child: run each search sent, answer (True, result) or (False, exception)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the server, which ends this process
    while True:
        try:
            compute, seconds = conn.recv()
        except (EOFError, OSError):  # the server is gone
            return
        try:
            with time_limit(seconds, cancel=cast(threading.Event, cancel)):  # an Event of another process
                answer: tuple[bool, Any] = (True, compute())
        except Exception as exc:
            answer = (False, exc)
        give_memory_back()
        try:
            conn.send(answer)
        except (EOFError, OSError):
            return
        except Exception as exc:  # an exception that does not pickle: say what it was
            conn.send((False, RuntimeError(f"{type(answer[1]).__name__}: {answer[1]} ({exc})")))


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        import ctypes

        trim: Callable[[int], int] = ctypes.CDLL("libc.so.6").malloc_trim
        return trim
    except (OSError, AttributeError):  # not glibc
        return None


def give_memory_back() -> None:
    """Return the heap a search freed to the system: collect the cycles it left, then have glibc hand its free
    pages back (it keeps them otherwise: 300 MB after a 4,096-GPU DeepSeek-V3 search, 33 MB after the trim).
    Where malloc_trim is not available (not glibc) only the collection runs."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
