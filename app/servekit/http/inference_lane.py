"""The inference lane: V2 inference requests read and answered at the connection.

Every HTTP request reaches the application through uvicorn's ``RequestResponseCycle``: an ASGI
scope, the proxy-headers middleware, ``run_asgi``, a ``receive()`` coroutine that waits on an
event and builds a message dict, two ``send()`` calls that build message dicts and check every
response header with two regular expressions, and a task. For a tiny model that machinery was
about 40% of a request's instructions (docs/performance.md). So a plain inference request
(``POST`` to an inference route, a Content-Length under 1 MiB, no coding, ``Expect`` or
tracing, not pipelined behind an unfinished response) is read without it
(:func:`read_plainly`): the edge (app/servekit/http/connection.py) keeps a small
:class:`PlainRequest` as the connection's current cycle, gathers its body, and when the read
that completes it ends, runs :meth:`InferenceLane.answer_request` at once with no task
(app/servekit/http/taskless.py): the tiny model's whole request is then answered inside one
``data_received``. The answer is the inference route's own (app/servekit/rest/infer.py
``respond``, given to the lane by the application, app/servekit/rest/front.py), written as one
status line, header block and body in one ``write()``.

It is one of exactly two ways into inference over HTTP; the other is Litestar's inference route
(app/servekit/rest/infer.py ``serve_infer``), which answers every inference request the lane
does not read: a body over 1 MiB, chunked or content-coded, ``Expect: 100-continue``, tracing
on, a request pipelined behind an unfinished answer, ``SERVEKIT_HTTP_FAST=0``. A request the
lane's answer declines (``X-Forwarded-*`` headers, which uvicorn's proxy-headers middleware
reads; a ``Host`` Litestar refuses) or fails gets the uvicorn cycle it would have had
(:func:`asgi_cycle`) and goes to that route: a failure is raised again there (:data:`PENDING`),
so every error answer is Litestar's, byte for byte, and no request is answered twice.

With the access log on, the lane tells the edge's counting writer what it wrote (the edge
writes the line when the response completes). ``SERVEKIT_HTTP_FAST=0`` in the environment turns
the lane off (every request the ASGI way), to compare the two or to rule it out.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from servekit.http import large, request_ids
from servekit.http.private_apis import STATUS_LINE, RequestResponseCycle
from servekit.http.writes import JOIN_LIMIT  # (joined to the headers below it, as there)
from servekit.observability.access import AccessLine, write_line
from servekit.observability.request_ids import CURRENT, RequestInfo
from servekit.observability.tracing import TRACING

if TYPE_CHECKING:
    from servekit.http.connection import EdgeProtocol

log = logging.getLogger("uvicorn.error")  # where uvicorn's cycle logs an application's failure

SWITCH = "SERVEKIT_HTTP_FAST"
"""Environment variable: ``0`` sends every request the ASGI way."""

PENDING = "servekit.pending_error"
"""Scope key of the exception the lane's answer raised: Litestar routes the request to the
inference route (app/servekit/rest/infer.py ``serve_infer``), which raises it inside
Litestar's exception handling."""

Headers = tuple[tuple[bytes, bytes], ...]
Answer = tuple[Headers, bytes, bool]
"""A 200 answer: its headers (shared: never change them in place), its body, and whether it
was a large one (then ``large.release()`` once it is written)."""
Route = tuple[dict[str, Any], float, str]
"""What a path routes to: its path parameters, the route's body size limit, the normalised
path (Litestar's router puts it in the scope)."""


class InferenceRoutes(Protocol):
    """Where a ``POST`` goes when it is an inference route, and what the answer reads
    (app/servekit/rest/front.py ``InferenceApp``)."""

    @property
    def fast_path(self) -> Any:
        """The application's state the inference answer reads (opaque to the transport)."""
        ...

    def route_of(self, path: str) -> Route | None:
        """The route of ``path``, or None: not an inference route (Litestar answers)."""
        ...


class Respond(Protocol):
    """The inference route's answer, not sent yet (app/servekit/rest/infer.py ``respond``):
    None when it declines, nothing read."""

    def __call__(
        self,
        state: Any,
        limit: float,
        scope: Any,
        receive: Any,
        check_host: bool,
        ready: bytes | None = None,
        at_connection: bool = False,
        no_task: bool = False,
        /,
    ) -> Awaitable[Answer | None]: ...


Pending = tuple[Coroutine[Any, Any, None], contextvars.Context, "PlainRequest"]
"""An answer the edge runs when its request's body has arrived: the coroutine, the request's
context, and the request."""

_OK = STATUS_LINE[200]
_CLOSE = b"connection: close\r\n"
_BLOCKS: dict[Any, bytes] = {}
"""Encoded header lines of an answer's own headers (the answer shares its header tuples per
body length, so there are few)."""
_MAX_BLOCKS = 4096
_PERCENT, _QUERY = ord("%"), ord("?")


def _nothing() -> None:
    """A finished cycle's ``on_response`` (as uvicorn's ``run_asgi`` leaves it)."""


class _NoEvent:
    """The ``message_event`` of a :class:`PlainRequest`: nothing waits for its body (uvicorn's
    ``connection_lost`` sets its cycle's)."""

    __slots__ = ()

    def set(self) -> None:
        """Nothing to wake."""


_NO_EVENT = _NoEvent()


class InferenceLane:
    """The connection-level answer of one application's inference routes."""

    def __init__(self, routes: InferenceRoutes, respond: Respond) -> None:
        self.routes = routes
        self.respond = respond

    async def answer_request(self, request: PlainRequest, protocol: EdgeProtocol) -> None:
        """Answer ``request`` (the edge's, body whole), or hand it to the application the ASGI
        way in the cycle uvicorn would have made; fail as uvicorn's ``run_asgi`` fails."""
        scope: Any = request.scope
        body: Any = request.body  # (bytes: made whole at the request's end, by the edge)
        try:
            answered = await self.respond(
                self.routes.fast_path, request.limit, scope, request.receive, True, body, True,
                True,
            )  # fmt: skip
        except Exception as exc:  # answered by Litestar's exception handling
            scope[PENDING] = exc
            answered = None
        if answered is None:
            cycle = asgi_cycle(protocol, request)
            try:
                await cycle.run_asgi(protocol.config.loaded_app)
            finally:
                cycle.on_response = _nothing
            return
        try:
            flow = protocol.flow
            if flow.write_paused and not request.disconnected:  # as uvicorn's send waits
                await flow.drain()
            _finish(request, answered, protocol)
            if answered[2]:
                del answered
                await large.release()
        except BaseException as exc:  # what run_asgi does with an application's failure
            log.error("Exception in ASGI application\n", exc_info=exc)
            protocol.transport.close()


def _finish(request: PlainRequest, answered: Answer, protocol: EdgeProtocol) -> None:
    """Write the answer of ``request`` and finish it as uvicorn's ``send`` finishes a
    response."""
    headers, content, _ = answered
    if request.disconnected:  # (dropped, as uvicorn's send drops it)
        return
    transport = protocol.transport
    _send(transport, request.default_headers, headers, content, request.keep_alive)
    request.sent = len(content)  # (the access log's count: a 200, this many bytes)
    request.response_complete = True
    if not request.keep_alive:
        transport.close()
    protocol.on_response_complete()


class PlainRequest:
    """A plain inference request read by the edge without uvicorn's request cycle
    (:func:`read_plainly`): what its answer needs, and what the edge and uvicorn's connection
    code ask of a connection's current ``cycle`` (``response_complete``, ``disconnected``,
    ``keep_alive``, ``more_body``, ``scope``, ``message_event``). Its body is whole
    (Content-Length under ``large.OFF_LOOP_BYTES``, no transfer or content coding), so it is
    answered once it has arrived, never read in parts.

    If the answer declines or fails, the edge makes the uvicorn cycle it would have made
    (:func:`asgi_cycle`) and the application answers the ASGI way."""

    __slots__ = (
        "body",
        "default_headers",
        "disconnected",
        "keep_alive",
        "limit",
        "more_body",
        "raw_path",
        "response_complete",
        "scope",
        "sent",
        "servekit_in",
    )
    message_event = _NO_EVENT
    waiting_for_100_continue = False
    response_started = False

    def __init__(
        self, scope: dict[str, Any], raw_path: bytes, limit: float, keep_alive: bool,
        default_headers: list[tuple[bytes, bytes]],
    ) -> None:  # fmt: skip
        self.scope = scope
        self.raw_path = raw_path
        self.limit = limit
        self.keep_alive = keep_alive
        self.default_headers = default_headers
        self.body: bytes | bytearray | None = b""
        """What arrived (a bytearray while it grows over several reads; None once read by
        :meth:`receive`)."""
        self.more_body = True
        self.disconnected = False
        self.response_complete = False
        self.servekit_in = 0
        self.sent = 0
        """Bytes of the answer's body written (the access log's ``bytes_out``)."""

    def cancel(self, msg: Any = None) -> bool:
        """What uvicorn's shutdown calls on what it counts as in flight, past its grace
        period: a request still waiting for its body has no task to cancel (its connection is
        closed with the others)."""
        return False

    async def receive(self) -> dict[str, Any]:
        """The whole body in one message (the answer asks only when it reads a coded body),
        then a disconnect, as uvicorn's cycle says once its response is complete."""
        if self.body is None:
            return {"type": "http.disconnect"}
        body, self.body = self.body, None
        return {"type": "http.request", "body": body, "more_body": False}


def read_plainly(protocol: EdgeProtocol, lane: InferenceLane) -> bool:
    """Whether the request whose headers just ended on ``protocol`` is a plain inference
    request, then read as a :class:`PlainRequest` (no uvicorn scope, cycle or task): a ``POST``
    to an inference route with a Content-Length under ``large.OFF_LOOP_BYTES`` and no coding,
    no ``Expect``, no tracing, not behind an unfinished response."""
    if protocol.expect_100_continue or TRACING.on or protocol.root_path:
        return False
    parser = protocol.parser
    if parser.get_method() != b"POST":
        return False
    cycle = protocol.cycle
    if cycle is not None and not cycle.response_complete:
        return False  # pipelined behind an unfinished response: uvicorn queues it
    url = protocol.url
    # (ints, not b"%": bytes' ``in`` tries its operand as an int first, and a TypeError
    # raised and cleared costs more than the search)
    if _PERCENT in url or _QUERY in url or parser.should_upgrade():
        return False
    try:
        path = url.decode("ascii")
    except UnicodeDecodeError:
        return False
    route = lane.routes.route_of(path)
    if route is None:
        return False
    length = None
    for name, value in protocol.headers:
        if name == b"content-length":  # (the parser refuses a second one: 400, RFC 9112)
            if length is None:  # the first, as the answer reads it (app/servekit/rest/infer.py)
                length = value
        elif name == b"transfer-encoding" or name == b"content-encoding":
            return False
    params, limit, normalized = route
    if length is None or not length.isdigit():
        return False
    size = int(length)
    if size >= large.OFF_LOOP_BYTES or size > limit:  # (refused before it is read)
        return False
    version = parser.get_http_version()
    scope = {
        "method": "POST",
        "path": normalized,
        "headers": protocol.headers,
        "client": protocol.client,
        "path_params": params,
        "http_version": version,
    }
    keep_alive = version != "1.0" and parser.should_keep_alive()
    request = PlainRequest(scope, url, limit, keep_alive, protocol.server_state.default_headers)
    protocol.cycle = request  # type: ignore[assignment]
    protocol.tasks.add(request)  # type: ignore[arg-type]  # in flight, as its task would be
    counted = protocol._counting
    token = request_ids.begin(request, counted)
    if counted:  # written at on_response_complete (or connection_lost)
        protocol._access = (request, CURRENT.get(), time.monotonic())  # type: ignore[assignment]
    protocol.edge.note_read(protocol.loop)  # the load signal (services/execution/load.py)
    answering = lane.answer_request(request, protocol)
    protocol._pending = (answering, contextvars.copy_context(), request)
    CURRENT.reset(token)
    return True


def asgi_cycle(protocol: EdgeProtocol, request: PlainRequest) -> RequestResponseCycle:
    """The uvicorn cycle of ``request`` (read whole by :func:`read_plainly`), for the
    application to answer it the ASGI way: what uvicorn would have made."""
    scope: Any = {
        "type": "http",
        "asgi": {"version": protocol.asgi_version, "spec_version": "2.3"},
        "server": protocol.server,
        "scheme": protocol.scheme,
        "root_path": protocol.root_path,
        "state": protocol.app_state.copy(),
        "raw_path": request.raw_path,
        "query_string": b"",
    }
    scope.update(request.scope)
    cycle = RequestResponseCycle(
        scope=scope,
        transport=protocol._out,  # type: ignore[arg-type]
        flow=protocol.flow,
        logger=protocol.logger,
        access_logger=protocol.access_logger,
        access_log=protocol.access_log,
        default_headers=request.default_headers,
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=request.keep_alive,
        on_response=protocol.on_response_complete,
    )
    body = request.body
    cycle.body = bytearray() if body is None else body  # type: ignore[assignment]
    cycle.more_body = False
    cycle.disconnected = request.disconnected
    cycle.message_event.set()
    cycle.servekit_in = request.servekit_in  # type: ignore[attr-defined]
    if protocol.cycle is request:  # type: ignore[comparison-overlap]
        protocol.cycle = cycle
    access = protocol._access
    if access is not None and access[0] is request:
        protocol._access = (cycle, access[1], access[2])
    return cycle


def write_answered(
    protocol: EdgeProtocol, request: PlainRequest, info: RequestInfo, started: float
) -> None:
    """The access line of a request answered at the connection: what
    ``request_ids.write_access`` writes, from what the request and the connection know (its
    route's model and version, the client's text made once per connection)."""
    if info.model is None:
        params = request.scope["path_params"]
        info.model = params["model"]
        info.version = params.get("version")
    peer = protocol._peer
    if peer is None and protocol.client:
        peer = protocol._peer = request_ids.client_text(protocol.client)
    write_line(
        AccessLine(  # (positional: a class called with keywords builds a dict first)
            "HTTP", "POST", request.scope["path"], 200, time.monotonic() - started,
            request.servekit_in, request.sent, peer, info,
        )
    )  # fmt: skip


def _send(
    transport: Any, defaults: list[tuple[bytes, bytes]], headers: Headers, content: bytes,
    keep_alive: bool,
) -> None:  # fmt: skip
    """A 200 answer in one write: the status line, the connection's headers (``defaults``:
    Date, X-Request-ID, values already checked), the answer's own, ``connection: close`` when
    it closes, and the body (a short one joined to the headers, one copy; a long one with
    ``writelines``, one ``writev()`` and no copy)."""
    block = _BLOCKS.get(headers)
    if block is None:
        block = _block(headers)
    parts = [_OK]
    for name, value in defaults:
        parts += (name, b": ", value, b"\r\n")
    parts.append(block)
    if not keep_alive:
        parts.append(_CLOSE)
    parts.append(b"\r\n")
    if len(content) < JOIN_LIMIT:
        parts.append(content)
        transport.write(b"".join(parts))
    else:
        transport.writelines((b"".join(parts), content))


def _block(headers: Headers) -> bytes:
    """The header lines of ``headers`` (names lower-case, values made by the answer)."""
    block = b"".join(b"%s: %s\r\n" % (name, value) for name, value in headers)
    if len(_BLOCKS) >= _MAX_BLOCKS:
        _BLOCKS.clear()
    _BLOCKS[headers] = block
    return block
