"""The HTTP API and the web explorer: ``create_app()`` builds it, ``serve()`` runs it (``meshplan ui``).

The API only parses inputs and calls the report functions the CLI prints, so
every number a page shows is the engine's. Errors are JSON ``{"error": ...}``
with a 4xx status: 422 for malformed inputs, 400 for inputs the engine
refuses, 404 for unknown names in paths, 413/414 for oversized requests, 429
when a search waited too long for the one running, 503 when the search queue
is full or a search ran past its time limit; 421/403/415 for requests from
other sites (guard.py). The pages (static/) are plain files that work
offline; the schema is at /openapi.json.
"""

from __future__ import annotations

import socket
import threading
import webbrowser
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from meshplan.render import to_json
from meshplan.search.limits import SearchTimeout
from meshplan.server import api, configs, explorer, exports, parse, planner
from meshplan.server.guard import Binding, RequestGuard, check_bind, is_loopback, refusal
from meshplan.server.uploads import ModelStore
from meshplan.server.worker import SEARCHES

STATIC = Path(__file__).resolve().parent / "static"
SECURITY_HEADERS = {
    # Everything the pages need comes from this server: no CDN, no outside request.
    "content-security-policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


def _error(status: int, message: str) -> JSONResponse:
    return refusal(status, message)  # {"error": message}, the message bounded (io.bounded_message)


class RequestLimits:
    """Refuse oversized requests before any endpoint runs: long query strings (414) and bodies (413)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        query = scope.get("query_string", b"")
        if len(query) > parse.MAX_QUERY_CHARS:
            message = f"query string of {len(query)} characters; the limit is {parse.MAX_QUERY_CHARS}"
            await _error(414, message)(scope, receive, send)
            return
        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > parse.MAX_BODY_BYTES):
            message = f"request body of {length.decode(errors='replace')} bytes; the limit is {parse.MAX_BODY_BYTES}"
            await _error(413, message)(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _install_errors(app: FastAPI) -> None:
    async def invalid(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return _error(422, parse.validation_message(exc.errors()))

    async def http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        detail = exc.detail if isinstance(exc.detail, str) else "request refused"
        response = _error(exc.status_code, detail)
        response.headers.update(exc.headers or {})  # 405 carries Allow
        return response

    async def refused(_: Request, exc: Exception) -> JSONResponse:
        message = exc.args[0] if exc.args else type(exc).__name__
        return _error(400, str(message))

    async def too_large(_: Request, exc: Exception) -> JSONResponse:
        return _error(413, str(exc))

    async def timed_out(_: Request, exc: Exception) -> JSONResponse:
        return _error(503, str(exc))

    async def left(_: Request, exc: Exception) -> JSONResponse:  # nobody reads it: the client is gone
        return _error(400, "the client disconnected before sending the whole request")

    async def internal(_: Request, exc: Exception) -> JSONResponse:
        return _error(500, f"internal error ({type(exc).__name__}); please report it with the request")

    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http)
    app.add_exception_handler(ValueError, refused)
    app.add_exception_handler(SearchTimeout, timed_out)
    app.add_exception_handler(explorer.BodyTooLarge, too_large)
    app.add_exception_handler(ClientDisconnect, left)
    app.add_exception_handler(Exception, internal)


class ReportResponse(JSONResponse):
    """The CLI's JSON text (``render.to_json``): the same request answers byte for byte what ``--json`` prints."""

    def render(self, content: Any) -> bytes:
        return to_json(content).encode("utf-8")


def create_app(binding: Binding | None = None) -> FastAPI:
    """The API under /api, the schema at /openapi.json, the explorer at /; requests are served only for the
    Host names of ``binding`` (default: loopback names, any port)."""
    app = FastAPI(
        default_response_class=ReportResponse,
        title="meshplan",
        version=_version(),
        summary="Memory, collectives, step time and layouts of transformers split over GPUs.",
        docs_url=None,  # the interactive docs load their scripts from a CDN; the explorer lists the endpoints itself
        redoc_url=None,
        responses={
            code: {"description": text, "content": {"application/json": {"schema": ERROR_SCHEMA}}}
            for code, text in ERROR_RESPONSES.items()
        },
    )
    app.state.models = ModelStore()
    app.state.searches = planner.SearchGate()
    app.include_router(api.router)
    app.include_router(explorer.router)
    app.include_router(planner.router)
    app.include_router(exports.router)
    app.include_router(configs.router)
    _install_errors(app)

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.add_middleware(RequestGuard, binding=binding)
    app.add_middleware(RequestLimits)
    return app


ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"error": {"type": "string"}},
    "required": ["error"],
}
ERROR_RESPONSES = {
    400: "The engine refused the inputs (e.g. degrees that do not divide the GPUs)",
    403: "A request from another site (its Origin is not this server's)",
    404: "Unknown path or recipe",
    413: "Request body too large",
    414: "Query string too long",
    415: "A request body not declared application/json",
    421: "A Host this server does not answer for (DNS rebinding)",
    422: "A malformed or out-of-range input",
    429: "A search waited too long for the one running",
    503: "The search queue is full, a search ran past its time limit, or the server is at its connection limit",
}


def free_socket(host: str, port: int | None) -> socket.socket:
    """A listening socket on ``host``: ``port``, or a free one when port is None or 0."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on accepted sockets that say so; without it a response
    # written in two pieces waits out the client's 40 ms delayed ACK on every keep-alive request
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port or 0))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port or 0}: {exc.strerror or exc}") from None
    return sock


def serve(
    host: str = "127.0.0.1", port: int | None = None, open_browser: bool = False, *, allow_remote: bool = False
) -> None:
    """Run the explorer until Ctrl-C: bound to ``host`` (loopback by default; any other address only with
    ``allow_remote``), on ``port`` or a free one."""
    check_bind(host, allow_remote=allow_remote)
    try:
        import uvicorn
    except ImportError:
        raise ValueError("the web explorer needs the [web] extra: pip install 'meshplan[web]'") from None
    sock = free_socket(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}/"
    if not is_loopback(host):
        print(f"meshplan: warning: listening on {host}, reachable from other machines", flush=True)
    print(f"meshplan explorer at {url}  (Ctrl-C to stop)", flush=True)
    if open_browser:
        threading.Timer(0.5, webbrowser.open, args=(url,)).start()
    SEARCHES.start()  # the search process imports the engine while the server starts
    server = uvicorn.Server(server_config(create_app(Binding(host, bound, allow_remote))))
    server.run(sockets=[sock])


def server_config(app: ASGIApp, *, header_timeout_s: float | None = None, body_timeout_s: float | None = None) -> Any:
    """The uvicorn configuration ``serve`` runs: header and body read timeouts, keep-alive of 5 s, bounded
    connections (the timeouts can be shortened for tests)."""
    import uvicorn

    from meshplan.server.protocol import TimedH11Protocol

    protocol = TimedH11Protocol
    if header_timeout_s is not None or body_timeout_s is not None:
        head = header_timeout_s or TimedH11Protocol.header_timeout_s
        body = body_timeout_s or TimedH11Protocol.body_timeout_s

        class Impatient(TimedH11Protocol):
            header_timeout_s = head
            body_timeout_s = body

        protocol = Impatient
    files = _raise_fd_limit()
    return uvicorn.Config(
        app,
        log_level="warning",
        lifespan="off",
        http=protocol,
        timeout_keep_alive=5,
        limit_concurrency=max(64, min(files, MAX_CONNECTIONS) - 100),  # below the open-file limit
        h11_max_incomplete_event_size=16 * 1024,
    )


MAX_CONNECTIONS = 4_096
"""Connections and requests in flight at most (and always 100 below the open-file limit); past it, 503 at once."""


def _raise_fd_limit() -> int:
    """Lift the soft limit on open files toward the hard one (up to MAX_CONNECTIONS); the limit now in force."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = MAX_CONNECTIONS if hard == resource.RLIM_INFINITY else min(hard, MAX_CONNECTIONS)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        return MAX_CONNECTIONS if soft == resource.RLIM_INFINITY else int(soft)
    except (ImportError, ValueError, OSError):
        return 1024


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("meshplan")
    except PackageNotFoundError:
        return "0+unknown"
