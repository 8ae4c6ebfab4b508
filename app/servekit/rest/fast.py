"""The V2 inference answer written at the connection, without uvicorn's ASGI cycle around it.

Every HTTP request reaches the application through uvicorn's ``RequestResponseCycle``: the
proxy-headers middleware, ``run_asgi``, a ``receive()`` coroutine that waits on an event and
builds a message dict, and two ``send()`` calls that build message dicts and check every
response header with two regular expressions. For a tiny model that was about a tenth of a
request's instructions (callgrind, issue 28's third round). The edge
(app/servekit/edge.py) therefore offers each request's cycle to :meth:`FastAnswer.take` before
it starts the request's task: a ``POST`` that the front (app/servekit/rest/front.py) would
answer runs :meth:`FastAnswer.run` instead of ``cycle.run_asgi(app)``, which calls the same
inference answer (:func:`servekit.rest.infer.respond`) with the body the cycle already holds
and writes the status line, headers and body to the connection in one ``write()``.

Everything around the answer is uvicorn's and the edge's, unchanged: the request's cycle is
still made by uvicorn (pipelining order, keep-alive, ``Connection: close``, flow control, the
deadlines and client-left cancel of the edge see the same object), the edge's checks (Host,
limits, request ID) ran before, and the bookkeeping a finished response does in uvicorn's
``send()`` is done here the same way. A request that is not plainly the common case goes the
ASGI way: ``Expect: 100-continue``, tracing on (it wraps the cycle's ``send``),
``X-Forwarded-For``/``-Proto`` headers (the proxy-headers middleware reads them), a body still
arriving or content-coded (read through ``receive`` as the ASGI answer would), a ``Host``
Litestar refuses. A failure of the answer goes to Litestar with the exception pending, exactly
as the front hands over its own (so error answers are Litestar's, byte for byte).

The plain request itself (a ``POST`` to an inference route with a whole, small, uncoded body,
the common case) does not even get a uvicorn cycle: the edge reads it as a :class:`Request`
and runs :meth:`FastAnswer.answer_request` at once when its body is complete
(app/servekit/edge.py, app/servekit/rest/eager.py); the ASGI way, if the answer declines or
fails, starts from the cycle the edge then makes (``EdgeProtocol.asgi_cycle``).

With the access log on, the answer tells the edge's counting writer what it wrote (the edge
writes the line when the response completes, app/servekit/edge.py).

``SERVEKIT_HTTP_FAST=0`` in the environment turns it off (every request the ASGI way), to
compare the two or to rule it out when chasing a problem.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from servekit.observability.access import ACCESS
from servekit.observability.tracing import TRACING
from servekit.rest import large
from servekit.rest.front import InferenceApp
from servekit.rest.infer import PENDING, respond

log = logging.getLogger("uvicorn.error")  # where uvicorn's cycle logs an application's failure

SWITCH = "SERVEKIT_HTTP_FAST"
"""Environment variable: ``0`` sends every request the ASGI way."""

_OK = STATUS_LINE[200]
_CLOSE = b"connection: close\r\n"
_BLOCKS: dict[Any, bytes] = {}
"""Encoded header lines of an answer's own headers (the answer shares its header tuples per
body length, so there are few)."""
_MAX_BLOCKS = 4096
JOIN_LIMIT = 64 * 1024
"""A body shorter than this is joined to its headers (one copy, one ``write()``); a longer one
goes with ``writelines`` (one ``writev()``, no copy), as the edge's coalescer does."""


def _nothing() -> None:
    """A finished cycle's ``on_response`` (as uvicorn's ``run_asgi`` leaves it)."""


class _NoEvent:
    """The ``message_event`` of a :class:`Request`: nothing waits for its body (uvicorn's
    ``connection_lost`` sets its cycle's)."""

    __slots__ = ()

    def set(self) -> None:
        """Nothing to wake."""


_NO_EVENT = _NoEvent()


class FastAnswer:
    """The connection-level answer of one application's inference routes."""

    def __init__(self, app: InferenceApp) -> None:
        self.app = app

    def take(self, cycle: Any, app: Any, transport: Any) -> Any:
        """The coroutine answering ``cycle``'s request at the connection, or None: run
        ``app`` the ASGI way. ``transport``: the connection's own (not the edge's coalescing
        writer: the answer is one write already)."""
        scope = cycle.scope
        if (
            scope["method"] != "POST"
            or cycle.waiting_for_100_continue
            or TRACING.on
            or scope["root_path"]
        ):
            return None
        route = self.app.route_of(scope["path"])
        if route is None:
            return None
        return self.run(cycle, route, app, transport)

    async def run(self, cycle: Any, route: Any, app: Any, transport: Any) -> None:
        """Answer the request, or hand it to ``app`` as uvicorn would; fail as uvicorn's
        ``run_asgi`` fails."""
        try:
            if not await self._answer(cycle, route, transport):
                await cycle.run_asgi(app)  # (it fails as run_asgi fails, by itself)
        except BaseException as exc:  # what run_asgi does with an application's failure
            log.error("Exception in ASGI application\n", exc_info=exc)
            if not cycle.response_started:
                await cycle.send_500_response()
            else:
                transport.close()
        finally:
            cycle.on_response = _nothing

    async def answer_request(self, request: Request, protocol: Any) -> None:
        """Answer ``request`` (the edge's, body whole), or hand it to the application the ASGI
        way in the cycle uvicorn would have made; fail as uvicorn's ``run_asgi`` fails."""
        scope: Any = request.scope
        receive: Any = request.receive
        body: Any = request.body  # (bytes: made whole at the request's end, by the edge)
        try:
            answered = await respond(
                self.app.fast_path, request.limit, scope, receive, True, body, True, True
            )
        except Exception as exc:  # answered by Litestar's exception handling
            scope[PENDING] = exc
            answered = None
        if answered is None:
            cycle = protocol.asgi_cycle(request)
            try:
                await cycle.run_asgi(protocol.config.loaded_app)
            finally:
                cycle.on_response = _nothing
            return
        try:
            flow = protocol.flow
            if flow.write_paused and not request.disconnected:  # as uvicorn's send waits
                await flow.drain()
            self._write(request, answered, protocol.transport, protocol)
            if answered[2]:
                del answered
                await large.release()
        except BaseException as exc:  # what run_asgi does with an application's failure
            log.error("Exception in ASGI application\n", exc_info=exc)
            protocol.transport.close()

    def _write(self, request: Request, answered: Any, transport: Any, protocol: Any) -> None:
        """Write the answer of ``request`` and finish it as uvicorn's ``send`` finishes a
        response."""
        headers, content, _ = answered
        if request.disconnected:  # (dropped, as uvicorn's send drops it)
            return
        _send(transport, request.default_headers, headers, content, request.keep_alive)
        request.sent = len(content)  # (the access log's count: a 200, this many bytes)
        request.response_complete = True
        if not request.keep_alive:
            transport.close()
        protocol.on_response_complete()

    async def _answer(self, cycle: Any, route: Any, transport: Any) -> bool:
        """Answer, or say no (False: the application answers, the request's body unread)."""
        scope = cycle.scope
        scope["path_params"], limit, scope["path"] = route
        body = cycle.body  # all of it, once the request is complete (uvicorn's on_body)
        ready = None
        if not cycle.more_body and not cycle.disconnected and len(body) < large.OFF_LOOP_BYTES:
            ready = bytes(body)  # (a copy, as uvicorn's receive makes)
        try:
            answered = await respond(
                self.app.fast_path, limit, scope, cycle.receive, True, ready, True
            )
        except Exception as exc:  # answered by Litestar's exception handling
            scope[PENDING] = exc
            return False
        if answered is None:
            return False
        headers, content, is_large = answered
        counting = ACCESS.mode != "off"
        flow = cycle.flow
        if flow.write_paused and not cycle.disconnected:
            await flow.drain()
        if not cycle.disconnected:  # (else: dropped, as uvicorn's send drops it)
            cycle.response_started = True
            cycle.waiting_for_100_continue = False
            _send(transport, cycle.default_headers, headers, content, cycle.keep_alive)
            if counting:  # the edge's access log counts the cycle's writes: tell it this one
                cycle.transport.answered(_OK, len(content))
            cycle.response_complete = True
            cycle.message_event.set()
            if not cycle.keep_alive:
                cycle.transport.close()
            cycle.on_response()
        if is_large:
            del content, answered
            await large.release()
        return True


class Request:
    """A plain inference request read by the edge without uvicorn's request cycle
    (app/servekit/edge.py, ``EdgeProtocol.on_headers_complete``): what its answer needs, and
    what the edge and uvicorn's connection code ask of a connection's current ``cycle``
    (``response_complete``, ``disconnected``, ``keep_alive``, ``more_body``, ``scope``,
    ``message_event``). Its body is whole (Content-Length under ``large.OFF_LOOP_BYTES``, no
    transfer or content coding), so it is answered once it has arrived, never read in parts.

    If the answer declines or fails, the edge makes the uvicorn cycle it would have made
    (``EdgeProtocol.asgi_cycle``) and the application answers the ASGI way, as it does for a
    cycle the answer declines (:meth:`FastAnswer.run`)."""

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


def _send(
    transport: Any, defaults: list[tuple[bytes, bytes]], headers: Any, content: bytes,
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


def _block(headers: Any) -> bytes:
    """The header lines of ``headers`` (names lower-case, values made by the answer)."""
    block = b"".join(b"%s: %s\r\n" % (name, value) for name, value in headers)
    if len(_BLOCKS) >= _MAX_BLOCKS:
        _BLOCKS.clear()
    _BLOCKS[headers] = block
    return block


def fast_answer(app: Any) -> FastAnswer | None:
    """The connection-level answer of ``app`` (None when it is not the inference front, or
    when ``SERVEKIT_HTTP_FAST=0``)."""
    if not isinstance(app, InferenceApp) or os.environ.get(SWITCH, "1") == "0":
        return None
    return FastAnswer(app)
