"""The HTTP protocol the explorer serves with: uvicorn's h11 protocol plus a header-read timeout.

uvicorn closes idle keep-alive connections, but a client that sends half a request and stops holds its
connection (and a file descriptor) forever; a thousand such clients exhaust the server. Here a connection
that has not completed a request within ``HEADER_TIMEOUT_S`` while the server waits for one is closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0
"""Seconds a client has to send a complete request head (browsers send it in one packet)."""


class TimedH11Protocol(H11Protocol):
    """H11Protocol that closes connections stuck in the middle of a request head."""

    header_timeout_s = HEADER_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._requests_seen = 0
        self._watch: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self._requests_seen)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        super().connection_lost(exc)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request head was parsed: the client made progress
            self._requests_seen += 1

    def _arm(self, seen: int) -> None:
        self._watch = self.loop.call_later(self.header_timeout_s, self._check, seen)

    def _check(self, seen: int) -> None:
        waiting = self.cycle is None or self.cycle.response_complete
        if waiting and seen == self._requests_seen and not self.transport.is_closing():
            self.transport.close()  # no complete request head since the last check
            self._watch = None
            return
        self._arm(self._requests_seen)
