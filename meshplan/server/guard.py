"""Who may use the server: the address it listens on, the Host a request names, the page (Origin) that sent it.

Any page the user opens can make the browser send requests to 127.0.0.1. Three checks keep other sites out:

- DNS rebinding: a site's own name, re-pointed at 127.0.0.1, reaches the server with that name in ``Host``.
  Only the names the server is bound to are served (loopback names on the bound port; with ``--allow-remote``
  the bound address too); any other ``Host`` gets 421.
- Cross-site requests: a page elsewhere may send a ``text/plain`` or form body without asking first. A request
  whose ``Origin`` is not this server's own is refused (403), and a request body must be declared
  ``application/json`` unless its ``Origin`` is this server's (415): a browser sends a JSON body to another
  site only after a CORS preflight, which this server never grants.
- Listening beyond this machine: ``meshplan ui`` binds a non-loopback address only with ``--allow-remote``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
from functools import cache

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from meshplan.io import bounded_message

WILDCARDS = ("", "0.0.0.0", "::")
"""Addresses that bind every interface."""
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower().rstrip(".") == "localhost"


def check_bind(host: str, *, allow_remote: bool) -> None:
    """ValueError (one line) for a non-loopback address unless ``allow_remote``: other machines could use it."""
    if allow_remote or is_loopback(host):
        return
    where = "every interface" if host.strip() in WILDCARDS else "an address other machines can reach"
    raise ValueError(
        f"--host {host!r} listens on {where}, so anyone on the network could use the explorer; "
        "pass --allow-remote to do that on purpose (default: 127.0.0.1, this machine only)"
    )


@dataclasses.dataclass(frozen=True)
class Binding:
    """Where the server listens: ``host`` and ``port`` (None: not bound yet, any port), and whether a
    non-loopback address was allowed on purpose."""

    host: str = "127.0.0.1"
    port: int | None = None
    allow_remote: bool = False

    def accepts(self, host_header: str) -> bool:
        """Whether a request naming ``host_header`` (``name[:port]``) is meant for this server."""
        split = _split_host(host_header)
        if split is None:
            return False
        name, port = split
        if self.port is not None and (port or 80) != self.port:
            return False
        if is_loopback(name):
            return True
        if not self.allow_remote:
            return False
        if self.host.strip() in WILDCARDS:  # any address of this machine: an IP, or its own host name
            return _is_ip(name) or name in _own_names()
        return name == self.host.lower().rstrip(".").strip("[]")


def _split_host(value: str) -> tuple[str, int | None] | None:
    """(name, port) of a Host header, the name lower-cased without brackets or a final dot; None if malformed."""
    text = value.strip().lower()
    if text.startswith("["):  # [v6]:port
        name, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":") if rest.startswith(":") else ("" if not rest else None)
    else:
        name, _, port = text.rpartition(":") if ":" in text else (text, "", "")
    if not name or port is None or (port and not (port.isdigit() and len(port) <= 5)):
        return None
    return name.rstrip("."), int(port) if port else None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@cache
def _own_names() -> frozenset[str]:
    """This machine's host name, its first label, and that label under .local (mDNS)."""
    full = socket.gethostname().lower().rstrip(".")
    short = full.split(".")[0]
    return frozenset(n for n in (full, short, f"{short}.local") if n)


def refusal(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The JSON error every refusal answers with: ``{"error": message}``, the message bounded."""
    return JSONResponse({"error": bounded_message(message)}, status_code=status, headers=headers)


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class RequestGuard:
    """Refuse a request whose Host is not this server's (421), whose Origin is another site (403), or whose
    body is not declared JSON while its Origin is not this server's (415), before any endpoint runs."""

    def __init__(self, app: ASGIApp, binding: Binding | None = None) -> None:
        self.app = app
        self.binding = binding or Binding()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        answer = self.refusal(scope)
        await (answer or self.app)(scope, receive, send)

    def refusal(self, scope: Scope) -> JSONResponse | None:
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if not self.binding.accepts(host):
            return refusal(421, f"this server does not answer for Host {host!r}: open it at its own address")
        origin = headers.get("origin")
        own = origin is not None and origin.strip().lower() == f"{scope.get('scheme', 'http')}://{host}".lower()
        if origin is not None and not own:
            return refusal(403, f"requests from another site ({origin!r}) are refused")
        has_body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
        declared = _is_json(headers.get("content-type", ""))
        if scope["method"] not in SAFE_METHODS and has_body and not own and not declared:
            return refusal(415, "send the request body as JSON, with Content-Type: application/json")
        return None
