"""HTTP request IDs and access-log lines, at the edge (app/servekit/http/connection.py calls
:func:`begin` once per request, before the request's task starts).

Done there rather than as ASGI middleware, on purpose: every answer passes through uvicorn's
cycle (routes, Litestar's errors, the inference fast path, streams, the edge's 503), and the
cycle already writes its ``default_headers`` into each response, so the ID is one more entry
of that list and costs no layer of calls per request. The access log, when on, wraps the
cycle's ``send`` and ``receive`` (counting bytes, seeing the status and the last body write);
off, nothing is wrapped.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from contextvars import Token
from typing import Any

from servekit.http import traces
from servekit.observability.access import ACCESS, AccessLine, write_line
from servekit.observability.request_ids import (
    CURRENT,
    HEADER_BYTES,
    PREFIX,
    RequestInfo,
    accepted,
    counter,
)
from servekit.observability.tracing import TRACING

Message = dict[str, Any]


def begin(cycle: Any, counted: bool = False) -> Token[RequestInfo | None]:
    """The request of uvicorn's ``cycle``: its ID (the client's ``X-Request-ID`` when valid,
    else a new one) put on the answer's headers, made :data:`CURRENT` (the caller resets it once
    the request's task is created), and the access log hooked in when on and the edge does
    not count the request itself (``counted``: it then calls :func:`write_access`).

    Written flat (no helper calls when no ID is sent): it runs for every HTTP request."""
    info = _new(RequestInfo)
    scope = cycle.scope
    info.client = scope["client"]  # (host, port): a client's share of sequence slots
    info.sent_headers = given = scope["headers"]  # lower-case names (uvicorn)
    for name, value in given:
        if name == HEADER_BYTES:
            sent = accepted(value)
            if sent is not None:
                info.id = sent
                info.sent = True
                encoded = value
            break
    if not info.sent:
        info.id = made = PREFIX + str(next(counter))
        encoded = made.encode()
    headers = [*cycle.default_headers, (HEADER_BYTES, encoded)]
    info.headers = headers
    cycle.default_headers = headers
    if ACCESS.mode != "off" and not counted:
        _log_access(cycle, info)
    if TRACING.on:
        traces.begin(cycle, info)
    return CURRENT.set(info)


_new = object.__new__


def _log_access(cycle: Any, info: RequestInfo) -> None:
    """Wrap the cycle's ``receive`` and ``send`` to count bytes and write one line when the
    response's last body write goes out (a stream's: when it ends)."""
    receive: Callable[[], Awaitable[Message]] = cycle.receive
    send: Callable[[Message], Awaitable[None]] = cycle.send
    scope = cycle.scope
    started = time.monotonic()
    counts = [0, 0, 0]  # bytes in, bytes out, status

    async def counted_receive() -> Message:
        message = await receive()
        if message["type"] == "http.request":
            counts[0] += len(message.get("body", b""))
        return message

    async def logged_send(message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            counts[2] = int(message["status"])
        elif kind == "http.response.body":
            counts[1] += len(message.get("body", b""))
            if not message.get("more_body", False):
                try:
                    await send(message)
                finally:
                    write_access(
                        scope, info, started, status=counts[2], bytes_in=counts[0],
                        bytes_out=counts[1],
                    )  # fmt: skip
                return
        await send(message)

    cycle.receive = counted_receive
    cycle.send = logged_send


def write_access(
    scope: Any, info: RequestInfo, started: float, *, status: int, bytes_in: int, bytes_out: int
) -> None:
    """The access line of a finished request (``status`` 499: its client left first): the
    model and version its route names, the client's ``host:port`` made once per connection
    (uvicorn's scope shares the connection's tuple)."""
    if info.model is None:
        params = scope.get("path_params")
        if params:
            model = params.get("model") or params.get("name")
            if model is not None:
                info.model = str(model)
                version = params.get("version")
                if version is not None:
                    info.version = str(version)
    client = scope["client"]
    try:
        peer = _CLIENTS.get(client)
    except TypeError:  # (a list: not uvicorn's)
        peer = None
    if peer is None and client:
        peer = client_text(client)
    write_line(
        AccessLine(  # (positional: a class called with keywords builds a dict first)
            "HTTP", scope.get("method", "-"), scope.get("path", "-"), status,
            time.monotonic() - started, bytes_in, bytes_out, peer, info,
        )
    )  # fmt: skip


_CLIENTS: dict[Any, str] = {}
"""``(host, port)`` -> ``host:port``, for the connections seen lately (bounded)."""
_MAX_CLIENTS = 4096


def client_text(client: Any) -> str:
    """A client's ``host:port`` as the access log writes it (kept for the connections seen
    lately)."""
    text = f"{client[0]}:{client[1]}"
    if type(client) is tuple:
        if len(_CLIENTS) >= _MAX_CLIENTS:
            _CLIENTS.clear()
        _CLIENTS[client] = text
    return text
