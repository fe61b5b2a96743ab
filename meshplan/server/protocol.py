"""The HTTP protocol the explorer serves with: uvicorn's h11 protocol plus read timeouts and JSON refusals.

uvicorn closes idle keep-alive connections, but a client that sends half a request and stops holds its
connection (and a file descriptor) forever; a thousand such clients exhaust the server. Here a connection is
closed when, while the server waits for a request, no complete request head arrives within ``HEADER_TIMEOUT_S``,
or when a request's body is still arriving ``BODY_TIMEOUT_S`` after its head (a client trickling its body).
The refusals uvicorn itself makes (503 past the concurrency limit, 400 for a malformed request) are JSON
``{"error": ...}`` here, like every other error of the API.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from meshplan.server.guard import refusal

HEADER_TIMEOUT_S = 10.0
"""Seconds a client has to send a complete request head (browsers send it in one packet)."""
BODY_TIMEOUT_S = 10.0
"""Seconds a client has, after the head, to send the whole body (the largest allowed is 256 KB)."""


class TimedH11Protocol(H11Protocol):
    """H11Protocol that closes connections stuck in the middle of a request, and refuses in JSON."""

    header_timeout_s = HEADER_TIMEOUT_S
    body_timeout_s = BODY_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._requests_seen = 0
        self._head_at = 0.0
        self._watch: asyncio.TimerHandle | None = None
        # uvicorn answers past its concurrency limit with a text/plain 503: take the limit over to answer JSON
        self._concurrency, self.limit_concurrency = self.limit_concurrency, None
        self._app, self.app = self.app, self._admit

    async def _admit(self, scope: Any, receive: Any, send: Any) -> None:
        limit = self._concurrency  # this request's task is already in self.tasks, hence ">"
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) > limit):
            busy = refusal(503, "the server is at its limit of connections; try again shortly")
            busy.headers["connection"] = "close"
            busy.headers["retry-after"] = "1"
            await busy(scope, receive, send)
            return
        await self._app(scope, receive, send)

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
            self._head_at = self.loop.time()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a malformed request, as JSON."""
        body = json.dumps({"error": msg}).encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body)):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.write(self.conn.send(h11.EndOfMessage()) or b"")
        self.transport.close()

    def _arm(self, seen: int) -> None:
        self._watch = self.loop.call_later(min(self.header_timeout_s, self.body_timeout_s), self._check, seen)

    def _check(self, seen: int) -> None:
        cycle = self.cycle
        waiting = cycle is None or cycle.response_complete
        stalled_head = waiting and seen == self._requests_seen  # no complete request head since the last check
        late_body = (
            not waiting
            and cycle is not None
            and cycle.more_body
            and not cycle.response_started
            and self.loop.time() - self._head_at >= self.body_timeout_s
        )
        if (stalled_head or late_body) and not self.transport.is_closing():
            self.transport.close()
            self._watch = None
            return
        self._arm(self._requests_seen)
