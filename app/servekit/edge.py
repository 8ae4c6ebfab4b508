"""The HTTP listener's edge: timeouts, connection and header limits uvicorn does not enforce.

uvicorn (0.54, httptools) has a keep-alive timeout and ``limit_concurrency``, nothing more: no
deadline for headers or bodies (a slowloris client holds a connection forever), no bound on
header size or count (httptools buffers a 16 MB header), and ``limit_concurrency`` counts
connections and requests as one number, so slow clients that fill it shut out everyone else.
This module's :class:`EdgeProtocol` subclasses uvicorn's httptools protocol and adds, per
connection, only what those gaps need:

- one lazy deadline per connection (a single ``call_at`` timer that re-arms itself when the
  deadline moved later, so the hot path only assigns a float; a deadline set nearer than the
  timer re-arms it at once: the nearer timer wins): the whole header block within
  ``headerTimeoutSeconds`` of its first byte (or of connecting); no pause between body reads
  longer than ``bodyTimeoutSeconds``; and the whole body within ``bodyDeadlineSeconds`` of the
  headers' end, or past that at ``bodyMinBytesPerSecond`` on average (a body dripped a byte at
  a time never pauses long, and is cut here); past one the client gets 408 and the connection
  is closed;
- header bytes (request line included; counted per read while a header block is incomplete,
  so httptools never buffers more than one read past the limit, and exactly once it is
  complete unless it came whole in one read under the limit) and header lines: 431 and close;
- a cap on open connections, lowered to what the open-file limit allows: at the cap a new
  connection displaces the oldest connection with no request in progress (idle, or still
  sending its headers: a slowloris client), as nginx reuses idle connections, then the oldest
  one still sending a body past the read that ended its headers; with none to displace, 503
  and close at once, never an ``accept()`` failing for lack of descriptors;
- when a request's headers end, before it counts or its body is read, on both lanes: a
  ``Host`` header the server does not answer to (app/servekit/config/hosts.py, the
  DNS-rebinding guard): 403 with ``{"error": ...}`` and close, before any routing; then the
  token its route's group needs (app/servekit/rest/access.py ``EdgeGuard``, only when some
  group is guarded): a request without it goes to the application at once, which answers its
  usual 401 (or 403) without reading the body, on a connection then closed;
- a cap on requests in flight (all connections): 503 with Retry-After at once; and a share of
  it per client address (``clientShareOfRequests``: connections with a request in progress,
  counted per address when the headers end and released when its answer completes), so one
  address dripping bodies cannot take every slot from the others;
- a client that closes its connection while its inference request waits for the model
  cancels that request (app/servekit/rest/leaving.py ``WAITING``): queued, it never runs. uvicorn
  itself
  only lets the application see the disconnect if it asks ``receive()``, which would cost a
  task per request on the hot path.

A request the parser refuses (400, or the edge's 431) after a whole request on the same
connection is answered after it: reading stops, and the refusal is written and the connection
closed once the answers before it (computing, or pipelined behind it) are written.

It also makes a response leave in one ``write()`` instead of two. uvicorn's
``RequestResponseCycle.send`` writes the status line and headers on ``http.response.start`` and
the body on ``http.response.body``, and uvloop sends each ``transport.write`` at once: two
syscalls and, with TCP_NODELAY, two TCP segments (and two wake-ups of the client) for every
small answer; a profile of the tiny-model path found the header write alone was 14-17% of the
server's samples. Each connection's cycles therefore write through a :class:`_Coalescer`: it
holds the first write of a response (the header block), joins it to the next write (the first
body write; one ``writev`` through ``writelines`` for a large body, so the body is not copied),
and passes later writes straight through. A held header block never waits for the application:
one ``call_soon`` per response flushes it on the loop's next turn, so a streamed answer's
headers (Server-Sent Events, chunked grps streams) leave even while its first chunk is being
made, and a finished response, a close, or the edge's own answers flush it first, so bytes
always leave in the order they were written. A request with ``Expect: 100-continue`` keeps the
plain transport (its interim ``100 Continue`` is written by the cycle before the headers).

Over TLS (``server.tls``) the handshake is part of the connection, as the limits see it:
:class:`TlsEdgeProtocol` is handed the plain TCP connection at ``accept()`` and makes the
handshake itself (``loop.start_tls``), where an SSL context given to uvicorn would make the
event loop do it before any protocol hears of the connection (uncounted, for uvloop's default
60 s). So the connection cap counts a connection from accept (one still in its handshake is
displaceable, like one still sending headers), and ``headerTimeoutSeconds`` runs from accept
over the handshake and the header block together: a client that never sends a ClientHello is
closed when it passes.

A plain inference request (``POST`` to an inference route, a Content-Length under 1 MiB, no
coding, ``Expect`` or tracing, not pipelined behind an unfinished response) is read without
uvicorn's request machinery (:meth:`EdgeProtocol._read_plainly`): no ASGI scope, no
``RequestResponseCycle`` with its event, no task. The edge keeps a small
:class:`servekit.rest.fast.Request` as the connection's current cycle, gathers its body, and
when the read that completes it ends, runs the answer at once (app/servekit/rest/eager.py): the
tiny model's whole request is then answered inside one ``data_received``, and a task exists
only if the answer waits (the model's thread, a write to drain). Measured in instructions, this
machinery was about 40% of a tiny REST request (docs/performance.md). A request the answer
declines or fails gets the uvicorn cycle it would have had, and the application answers it the
ASGI way. Other requests to an inference route are offered to the same answer in their task
(``fast_answer``); anything else runs the application as uvicorn runs it. uvicorn's
keep-alive timeout runs on the edge's lazy deadline timer (phase ``_IDLE``) instead of a timer
made and cancelled per response.

Everything else (parsing, pipelining, flow control) stays uvicorn's.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import resource
import ssl
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from servekit.config.hosts import HostPolicy
from servekit.config.schema import NetworkLimits
from servekit.observability.access import ACCESS, AccessLine, write_line
from servekit.observability.request_ids import CURRENT, RequestInfo
from servekit.observability.tracing import TRACING
from servekit.rest import eager, large, request_ids, traces
from servekit.rest.access import EdgeGuard
from servekit.rest.fast import FastAnswer, Request
from servekit.rest.leaving import EAGER, WAITING

log = logging.getLogger("servekit.http")

FD_RESERVE = 64
"""Descriptors kept for what is not an HTTP connection: model files, gRPC, logs, pipes."""
ACCEPT_BACKLOG = 128
"""Listen backlog handed to asyncio, which also accepts up to this many connections per
wake-up before any of them reaches :meth:`EdgeProtocol.connection_made`; two such bursts are
kept free below the open-file limit so ``accept()`` never fails with EMFILE."""

JOIN_LIMIT = 64 * 1024
"""A held header block and a body shorter than this are joined into one ``bytes`` (one copy,
one ``write()``); a longer body goes with ``writelines``, which uvloop sends as one ``writev()``
without copying it (and which costs more than a small copy)."""

_HEADER, _BODY, _WAITING, _IDLE = 1, 2, 3, 4
"""Phases of a connection's deadline: reading headers, reading a body (until the request's
last byte: ``cycle.more_body`` false), none to watch, idle between requests (uvicorn's
keep-alive timeout, on the same lazy timer instead of a timer per response)."""


class _Refuse(Exception):
    """Raised inside an httptools callback to answer ``status`` and close the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Arrivals:
    """How many plain inference requests the listener read in this loop pass, and in the last
    pass that read any: what a batching model's lone request needs to know besides the
    requests in progress (``ServerState.requests_in_progress``).

    Requests read in one pass are answered one after the other (app/servekit/rest/eager.py),
    each alone in progress when it reaches the model: the one before it already answered on
    the loop, the next still in its socket's buffer. Counted only by what the listener held,
    every request at 64 in flight ran on the loop by itself and batches never formed (medium
    model, REST binary: 1.6 rows per model run). A pass that reads several says the load is
    there, and so does the next pass that reads any: its requests wait one pass for company.

    The same count tells an unbatched model measured fast to run the pass's requests back to
    back at its end (``ServerState.read_together``, app/servekit/services/execution/executor.py).

    Counting costs one ``call_soon`` per pass that reads any (about 2-3% of a tiny request's
    instructions at one in flight), so it starts only once something asks (``crowded``: a
    request for a model placed on the loop, a pipeline's step); a server whose models all run
    in their threads never pays."""

    __slots__ = ("last", "now", "watched")

    def __init__(self) -> None:
        self.now = 0
        self.last = 0
        self.watched = False

    def arrived(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.watched:
            if not self.now:
                loop.call_soon(self._next_pass)
            self.now += 1

    def _next_pass(self) -> None:
        self.last = self.now
        self.now = 0

    def crowded(self) -> int:
        """1 when this pass or the last that read any read more than one request, else 0
        (added to the count of requests in progress). The first call starts the counting."""
        if self.now > 1 or self.last > 1:
            return 1
        self.watched = True
        return 0


@dataclass
class EdgeState:
    """What all connections of one HTTP listener share."""

    limits: NetworkLimits
    max_connections: int
    hosts: HostPolicy | None = None
    """The ``Host`` names answered (None: any, ``server.allowedHosts: ['*']``)."""
    guard: EdgeGuard | None = None
    """The routes' token check (None: no group is guarded)."""
    waiting: dict[EdgeProtocol, None] = field(default_factory=dict)
    """Connections with no request in progress, oldest first: the ones a new connection may
    displace at the cap."""
    reading: dict[EdgeProtocol, None] = field(default_factory=dict)
    """Connections whose request is still sending its body (past the read that ended its
    headers), oldest first: displaced at the cap when no connection in ``waiting`` is left."""
    held: dict[str, int] = field(default_factory=dict)
    """Connections with a request in progress, by client address (the share of
    ``maxRequestsInFlight`` one address may hold: ``share``)."""
    share: int = 0
    """Requests in progress one client address may hold at once (set from the limits)."""
    body_first: float = 0.0
    """Seconds from a body's start to the first moment it can be late (the nearer of the
    pause and the whole-body deadline)."""

    def __post_init__(self) -> None:
        limits = self.limits
        self.share = max(1, int(limits.max_requests_in_flight * limits.client_share_of_requests))
        self.body_first = min(limits.body_timeout_seconds, limits.body_deadline_seconds)

    arrivals: Arrivals = field(default_factory=Arrivals)
    """Plain inference requests read in this loop pass and the last (company for a batching
    model's request, a pass's calls back to back for an unbatched one's)."""


def connection_cap(configured: int, reserved: int = 0) -> int:
    """``configured``, lowered to what the soft open-file limit leaves (after raising that
    limit to the hard one, as Go and nginx do: descriptors are cheap, running out is not)
    once ``reserved`` descriptors are set aside (shared memory regions hold one each)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return configured
    room = max(16, soft - FD_RESERVE - 2 * ACCEPT_BACKLOG - reserved)
    if room < configured:
        log.warning(
            "server.network.maxConnections lowered from %d to %d: the open-file limit is %d "
            "(raise it with ulimit -n or the container's nofile limit)",
            configured,
            room,
            soft,
        )
    return min(configured, room)


def protocol_class(
    limits: NetworkLimits,
    hosts: HostPolicy | None = None,
    reserved: int = 0,
    tls: ssl.SSLContext | None = None,
    fast: FastAnswer | None = None,
    guard: EdgeGuard | None = None,
) -> type[EdgeProtocol]:
    """The protocol class uvicorn instantiates per connection, bound to these limits (answering
    only the ``Host`` names of ``hosts``, when given; ``reserved``: descriptors the connection
    cap leaves to something else). With ``tls`` it makes the TLS handshake itself
    (:class:`TlsEdgeProtocol`): give uvicorn no SSL context then, or every connection would be
    wrapped twice. ``fast``: the inference routes' answer at the connection
    (app/servekit/rest/fast.py), None: every request through uvicorn's ASGI cycle. ``guard``:
    the routes' token check at the end of the headers (app/servekit/rest/access.py), None when
    no group is guarded."""
    state = EdgeState(limits, connection_cap(limits.max_connections, reserved), hosts, guard)
    if tls is not None:
        context = tls

        class BoundTlsEdgeProtocol(TlsEdgeProtocol):
            edge = state
            tls_context = context
            fast_answer = fast

        return BoundTlsEdgeProtocol

    class BoundEdgeProtocol(EdgeProtocol):
        edge = state
        fast_answer = fast

    return BoundEdgeProtocol


def _answer(status: int, message: str, extra: bytes = b"") -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, in our ``{"error": ...}`` form."""
    body = orjson.dumps({"error": message})
    reason = _REASONS.get(status, b"Error")
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n%s\r\n%s" % (status, reason, len(body), extra, body)
    )


_REASONS = {
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


class _Coalescer:
    """The transport a connection's response cycles write to: a response's first write (its
    header block) is held until the next write joins it, or until the loop's next turn.

    One per connection, re-armed by :meth:`EdgeProtocol.on_response_complete` for the next
    response (uvicorn runs a connection's responses one after another, pipelined ones too, so
    no two responses share it at once). uvicorn's cycle calls ``write``, ``close`` and
    ``is_closing`` on its transport, and nothing else (no ``__getattr__`` passing the rest on:
    a class with one loses CPython's fast attribute access, which costs every call here)."""

    __slots__ = ("_call_soon", "armed", "held", "transport")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set on connect
        self.held: bytes | None = None
        self.armed = True
        """The next write is a response's first: hold it."""
        self._call_soon = loop.call_soon

    def write(self, data: bytes) -> None:
        held = self.held
        if held is not None:
            self.held = None
            if len(data) < JOIN_LIMIT:
                self.transport.write(held + data)
            else:
                self.transport.writelines((held, data))
        elif self.armed:
            # uvicorn's header block (always bytes): held for the body, or the next turn
            self.armed = False
            self.held = data
            self._call_soon(self.flush)  # (not bound once here: that would be a ref cycle)
        else:
            self.transport.write(data)

    def flush(self) -> None:
        """Write what is held now (unless the connection is closing: nobody would read it)."""
        held = self.held
        if held is not None:
            self.held = None
            if not self.transport.is_closing():
                self.transport.write(held)

    def close(self) -> None:
        if self.held is not None:
            self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()


class _CountingCoalescer(_Coalescer):
    """A :class:`_Coalescer` that also counts, for the access log: a response's header block
    (its status) and the bytes written. Used only when the access log is on, so the plain one
    stays as it was for everyone else."""

    __slots__ = ("head", "sent")
    counting = True

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.head: bytes | None = None
        self.sent = 0

    def write(self, data: bytes) -> None:
        if self.armed and self.held is None:  # the response's header block
            self.head = data
        self.sent += len(data)
        _Coalescer.write(self, data)

    def answered(self, status_line: bytes, body_bytes: int) -> None:
        """A response written to the connection past this writer (app/servekit/rest/fast.py):
        its status line and body size, counted as if written here."""
        self.head = status_line
        self.sent = len(status_line) + body_bytes

    def taken(self) -> tuple[int, int]:
        """The finished response's status and body bytes, the counts reset for the next."""
        head, sent = self.head, self.sent
        self.head, self.sent = None, 0
        if head is None:
            return 0, sent
        return int(head[9:12]), sent - len(head)


PROBES = frozenset(
    {b"/v2/health/live", b"/v2/health/ready", b"/grps/v1/health/live", b"/grps/v1/health/ready"}
)
"""Health probes pass the cap on requests in flight: a server busy with slow requests is alive
and says so, rather than failing the orchestrator's liveness probe and being restarted."""


_PERCENT, _QUERY = ord("%"), ord("?")


class EdgeProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with deadlines, header limits and connection caps."""

    edge: ClassVar[EdgeState]
    fast_answer: ClassVar[FastAnswer | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase = _HEADER
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        """When the timer fires (a deadline set earlier than this re-arms it: the nearer wins)."""
        self._body_began = 0.0
        self._body_in = 0
        """When the current request's headers ended, and its body bytes read since."""
        self._reading = False
        """In ``edge.reading``: its body still coming after the read that ended its headers."""
        self._address = ""
        """The client's address (its host), for the share of requests in flight."""
        self._held = False
        """A request of this connection counts in ``edge.held`` for its address."""
        self._ignored = False
        """Input is no longer read: the connection was refused, or a malformed request waits
        for the answers before it (``_malformed``)."""
        self._malformed: tuple[int, str] | None = None
        """The 400 of a malformed request, written once the answers before it are."""
        self._raw_header_bytes = 0
        """Bytes of reads that held only header bytes (what httptools may be buffering)."""
        self._chunk_size = 0
        self._began_in_chunk = False
        self._refused = False
        self._counting = ACCESS.mode != "off"
        """The access log is on: this connection's requests are counted here (bytes in at
        ``on_body``, status and bytes out by the coalescer), with no wrapper around the
        application's ``receive`` and ``send``."""
        self._out = _CountingCoalescer(self.loop) if self._counting else _Coalescer(self.loop)
        self._peer: str | None = None
        """The client's ``host:port`` as the access log writes it (made once)."""
        self._access: tuple[Any, RequestInfo, float] | None = None
        """The running request's cycle, request and start, while the edge counts it."""
        self._pending: tuple[Any, contextvars.Context, Any] | None = None
        """The inference answer of the request whose headers this read ended (its coroutine,
        context and cycle), run at once when its body ends in the same read, else started as
        a task when the read is done (app/servekit/rest/eager.py)."""

    # -- connections --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        edge = self.edge
        if len(self.connections) >= edge.max_connections and not self._displace_one():
            self._refused = self._ignored = True
            self.transport = transport
            transport.write(
                _answer(503, "too many connections; retry later", b"retry-after: 1\r\n")
            )
            transport.close()
            return
        super().connection_made(transport)
        self._out.transport = transport
        client = self.client
        self._address = client[0] if client else ""
        edge.waiting[self] = None
        self._watch(_HEADER, edge.limits.header_timeout_seconds)

    def _displace_one(self) -> bool:
        """Close the connection that has waited longest without a request in progress, or, with
        none, the one that has been sending a request body longest (a slow body holds a
        connection as a slow header block does)."""
        edge = self.edge
        waiting = edge.waiting
        if not waiting:
            waiting = edge.reading
            if not waiting:
                return False
        victim = next(iter(waiting))
        edge.waiting.pop(victim, None)
        if victim._reading:  # (answered early, its body still coming: in both)
            victim._reading = False
            edge.reading.pop(victim, None)
        self.connections.discard(victim)  # counted free now; its descriptor closes this turn
        victim.transport.close()
        return True

    def _unhold(self) -> None:
        """This connection's request no longer holds a share of its address's slots."""
        self._held = False
        held = self.edge.held
        left = held[self._address] - 1
        if left:
            held[self._address] = left
        else:
            del held[self._address]

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self._drop_pending()  # a request whose body never came whole
        edge = self.edge
        edge.waiting.pop(self, None)
        if self._reading:
            self._reading = False
            edge.reading.pop(self, None)
        if self._held:
            self._unhold()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        access = self._access
        if access is not None:  # the client left before the answer ended: 499, as nginx
            self._access = None
            _, sent = self._out.taken()  # type: ignore[attr-defined]
            counted, info, started = access
            request_ids.write_access(
                counted.scope, info, started, status=499, bytes_in=counted.servekit_in,
                bytes_out=sent,
            )  # fmt: skip
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            scope: dict[str, Any] = cycle.scope  # type: ignore[assignment]
            left = scope.get(traces.LEFT)
            if left is not None:  # a traced request: its span ends now, "client left"
                left(True)
            task = scope.get(WAITING)
            if task is not None and task is not EAGER:  # waiting for the model: drop it
                scope[WAITING] = None
                task.cancel()
        super().connection_lost(exc)

    # -- reading ------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._ignored:
            return
        self._began_in_chunk = False
        self._chunk_size = len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._drop_pending()
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as exc:
            self._malformed_request(exc)
            return
        pending = self._pending
        if pending is not None and type(pending[2]) is not Request:
            # its body is still coming: the answer reads it in a task
            self._pending = None
            self._start_task(pending[0], pending[1])
        if self._phase == _BODY and not self._reading and self.cycle.more_body:
            self._reading = True  # a body beyond this read: displaceable at the cap
            self.edge.reading[self] = None
        if self._phase == _HEADER and not self._began_in_chunk and self.parser is not None:
            # Still inside a header block that began in an earlier read: all of this read is
            # header bytes, held by httptools until the header line ends.
            self._raw_header_bytes += len(data)
            if self._raw_header_bytes > self.edge.limits.max_header_bytes:
                self._close_with(431, self._too_large())

    def _malformed_request(self, exc: httptools.HttpParserError) -> None:
        """Answer what the parser refused: 400 (or the edge's own refusal raised in a callback:
        431), and close. A whole request read before it on this connection is answered first
        (its answer may still be computing, or pipelined requests queued behind it): reading
        stops, and the refusal is written when the last of them is (``on_response_complete``)."""
        self._drop_pending()  # (a request pending here is the malformed one: its body is not whole)
        refusal = exc.__context__
        if isinstance(refusal, _Refuse):
            status, message = refusal.status, refusal.message
        else:
            status, message = 400, "Invalid HTTP request received."
            self.logger.warning(message)
        cycle = self.cycle
        pipeline = self.pipeline
        if pipeline and pipeline[0][0] is cycle and cycle.more_body:
            # Refused once its header block had ended (a Transfer-Encoding the parser does not
            # take), after uvicorn queued it behind an unfinished answer: it never runs. (A
            # queued request whose body is whole is one before it, answered first.)
            pipeline.popleft()
            before = True
        else:
            before = cycle is not None and not cycle.response_complete and not cycle.more_body
        if before:
            self._ignored = True  # the request before it is whole: its answer goes first
            self._malformed = (status, message)
            self._phase = _WAITING
            if self.flow is not None:
                self.flow.pause_reading()
            return
        if status == 400:
            self.send_400_response(message)
        else:
            self._close_with(status, message)

    def _refuse_malformed(self) -> None:
        """Write the refusal :meth:`_malformed_request` kept for after the answers before it."""
        kept, self._malformed = self._malformed, None
        assert kept is not None
        status, message = kept
        if status == 400:
            self.send_400_response(message)
        else:
            self._close_with(status, message)

    def on_message_begin(self) -> None:
        # uvicorn's, but its scope is made once the headers say the request needs one
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self._began_in_chunk = True
        self._raw_header_bytes = 0
        if self._phase != _HEADER:  # a later request on a kept-alive connection
            # _watch inlined: this and on_headers_complete run on every request
            self._phase = _HEADER
            deadline = self._deadline = self.loop.time() + self.edge.limits.header_timeout_seconds
            if self._timer is None or deadline < self._timer_at:
                self._arm(deadline)

    def on_headers_complete(self) -> None:
        edge = self.edge
        limits = edge.limits
        if len(self.headers) > limits.max_header_count:
            raise _Refuse(431, f"more than {limits.max_header_count} header lines")
        if not self._began_in_chunk or self._chunk_size > limits.max_header_bytes:
            # Not the usual small request read at once: count its header bytes exactly.
            size = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
            if size > limits.max_header_bytes:
                raise _Refuse(431, self._too_large())
        edge.waiting.pop(self, None)
        self._phase = _BODY
        now = self._body_began = self.loop.time()
        self._body_in = 0
        self._deadline = now + limits.body_timeout_seconds
        first = now + edge.body_first  # (the nearer of the pause and whole-body deadlines)
        if self._timer is None or first < self._timer_at:
            self._arm(first)
        previous = self.cycle
        refusal: Any = None
        # Who may ask, before anything is counted or read: the Host, then the token (the
        # application's own answer, on a connection that then closes: its body is not read).
        if edge.hosts is not None:
            refusal = self._check_host(edge.hosts)
        guard = edge.guard
        unauthorized = (
            refusal is None
            and guard is not None
            and guard.refuses(self.parser.get_method(), self.url, self.headers)
        )
        if refusal is None and not unauthorized and self.url not in PROBES:
            if len(self.tasks) >= limits.max_requests_in_flight:
                refusal = _busy
            elif not self._held:  # (a pipelined request: its connection is counted already)
                held = edge.held
                address = self._address
                count = held.get(address, 0)
                if count >= edge.share:
                    refusal = _crowded
                else:
                    held[address] = count + 1
                    self._held = True
        fast = self.fast_answer
        if refusal is None and fast is not None and not unauthorized and self._read_plainly(fast):
            return
        # the ASGI way: uvicorn's scope (made by its own code, for the headers read), its cycle
        url, headers, expect = self.url, self.headers, self.expect_100_continue
        HttpToolsProtocol.on_message_begin(self)
        self.url, self.headers, self.expect_100_continue = url, headers, expect
        self.scope["headers"] = headers
        if refusal is not None:
            self.app = refusal
            try:
                super().on_headers_complete()
            finally:
                self.app = self.config.loaded_app
        else:
            super().on_headers_complete()
        cycle = self.cycle
        if unauthorized and cycle is not previous:
            cycle.keep_alive = False  # answered, then closed: its body is never read
        if cycle is not previous and not self.expect_100_continue:
            # Its task is created, not started: every write of this response coalesces.
            cycle.transport = self._out  # type: ignore[assignment]  # what the cycle calls
        if self._counting and cycle is not previous:
            cycle.servekit_in = 0  # type: ignore[attr-defined]  # its body bytes (on_body)

    def _read_plainly(self, fast: FastAnswer) -> bool:
        """Whether the request whose headers just ended is a plain inference request, then
        read as a :class:`servekit.rest.fast.Request` (no uvicorn scope, cycle or task): a
        ``POST`` to an inference route with a Content-Length under ``large.OFF_LOOP_BYTES``
        and no coding, no ``Expect``, no tracing, not behind an unfinished response."""
        if self.expect_100_continue or TRACING.on or self.root_path:
            return False
        parser = self.parser
        if parser.get_method() != b"POST":
            return False
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            return False  # pipelined behind an unfinished response: uvicorn queues it
        url = self.url
        # (ints, not b"%": bytes' ``in`` tries its operand as an int first, and a TypeError
        # raised and cleared costs more than the search)
        if _PERCENT in url or _QUERY in url or parser.should_upgrade():
            return False
        try:
            path = url.decode("ascii")
        except UnicodeDecodeError:
            return False
        route = fast.app.route_of(path)
        if route is None:
            return False
        length = None
        for name, value in self.headers:
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
            "headers": self.headers,
            "client": self.client,
            "path_params": params,
            "http_version": version,
        }
        keep_alive = version != "1.0" and parser.should_keep_alive()
        request = Request(scope, url, limit, keep_alive, self.server_state.default_headers)
        self.cycle = request  # type: ignore[assignment]
        self.tasks.add(request)  # type: ignore[arg-type]  # in flight, as its task would be
        counted = self._counting
        token = request_ids.begin(request, counted)
        if counted:  # written at on_response_complete (or connection_lost)
            self._access = (request, CURRENT.get(), time.monotonic())  # type: ignore[assignment]
        self.edge.arrivals.arrived(self.loop)
        self._pending = (fast.answer_request(request, self), contextvars.copy_context(), request)
        CURRENT.reset(token)
        return True

    def asgi_cycle(self, request: Request) -> RequestResponseCycle:
        """The uvicorn cycle of ``request`` (read whole by :meth:`_read_plainly`), for the
        application to answer it the ASGI way: what uvicorn would have made."""
        scope: Any = {
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "server": self.server,
            "scheme": self.scheme,
            "root_path": self.root_path,
            "state": self.app_state.copy(),
            "raw_path": request.raw_path,
            "query_string": b"",
        }
        scope.update(request.scope)
        cycle = RequestResponseCycle(
            scope=scope,
            transport=self._out,  # type: ignore[arg-type]
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=request.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=False,
            keep_alive=request.keep_alive,
            on_response=self.on_response_complete,
        )
        body = request.body
        cycle.body = bytearray() if body is None else body  # type: ignore[assignment]
        cycle.more_body = False
        cycle.disconnected = request.disconnected
        cycle.message_event.set()
        cycle.servekit_in = request.servekit_in  # type: ignore[attr-defined]
        if self.cycle is request:  # type: ignore[comparison-overlap]
            self.cycle = cycle
        access = self._access
        if access is not None and access[0] is request:
            self._access = (cycle, access[1], access[2])
        return cycle

    def _check_host(self, hosts: HostPolicy) -> Any:
        """None when the request's ``Host`` is one this server answers (app/servekit/config/
        hosts.py), else the application answering 403: the DNS-rebinding guard, here so that
        it runs before routing and covers every route, the inference fast path included.
        Clients send ``Host`` first, so the scan usually stops at the first header, and an
        allowed value seen before costs one dictionary lookup."""
        for name, value in self.headers:
            if name == b"host":
                if value in hosts.remembered or hosts.allows(value):
                    return None
                return _refusing(403, hosts.refusal(value))
        return None  # no Host (HTTP/1.0): not a browser

    def on_body(self, body: bytes) -> None:
        self._deadline = self.loop.time() + self.edge.limits.body_timeout_seconds
        self._body_in += len(body)
        cycle: Any = self.cycle
        if self._counting:
            cycle.servekit_in += len(body)
        if type(cycle) is Request:  # read whole (its length is bounded): no flow control
            held: Any = cycle.body
            if not held:
                cycle.body = body
            elif type(held) is bytes:
                cycle.body = bytearray(held) + body
            else:
                held += body
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._reading:  # its body is whole: no longer displaceable
            self._reading = False
            self.edge.reading.pop(self, None)
        cycle: Any = self.cycle
        if type(cycle) is Request:
            cycle.more_body = False
            if type(cycle.body) is bytearray:
                cycle.body = bytes(cycle.body)
        else:
            super().on_message_complete()
        pending = self._pending
        if pending is not None:  # the whole request came in this read: answer it now
            self._pending = None
            coroutine, context, cycle = pending
            tasks = self.tasks
            tasks.add(cycle)  # in progress meanwhile, as its task would be (a lone request's
            # batching decision counts them: ModelExecutor.run_now)
            try:
                resumed = eager.run(self.loop, coroutine, context)
            finally:
                tasks.discard(cycle)
            if resumed is not None:  # it waits (a batch, the model's thread, a write to drain)
                resumed.add_done_callback(tasks.discard)
                tasks.add(resumed)  # type: ignore[arg-type]  # cancelled as a task would be
                scope = cycle.scope
                if scope.get(WAITING) is EAGER:  # waiting for the model: the edge's to cancel
                    scope[WAITING] = resumed

    def _drop_pending(self) -> None:
        """Forget an answer that will not run (the request turned out malformed)."""
        pending = self._pending
        if pending is not None:
            self._pending = None
            pending[0].close()
            self.tasks.discard(pending[2])

    def _start_task(self, coroutine: Any, context: contextvars.Context | None = None) -> None:
        """uvicorn's ``_start_asgi_task``, for a coroutine other than ``cycle.run_asgi``."""
        task = self.loop.create_task(coroutine, context=context)
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def on_response_complete(self) -> None:
        out = self._out
        if out.held is not None:  # a response with no body write (HEAD): its headers go now
            out.flush()
        out.armed = True  # the next response's first write is its header block
        access = self._access
        if access is not None:  # its access-log line, before a pipelined request starts
            self._access = None
            cycle, info, started = access
            if type(cycle) is Request and ACCESS.write is not None:  # answered at the connection
                self._write_answered(cycle, info, started)
            else:
                status, sent = out.taken()  # type: ignore[attr-defined]
                request_ids.write_access(
                    cycle.scope, info, started, status=status, bytes_in=cycle.servekit_in,
                    bytes_out=sent,
                )  # fmt: skip
        if self._held and not self.pipeline:  # (a pipelined request keeps the count)
            self._unhold()
        # uvicorn's, with its keep-alive timeout on the edge's lazy timer
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        if self._malformed is not None and not self.pipeline:  # the requests before it are
            self._refuse_malformed()  # answered: now its 400, and close
            return
        flow = self.flow
        if flow.read_paused and self._malformed is None:
            flow.resume_reading()
        if self.pipeline:  # the next request starts now: still busy
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        if not self.cycle.more_body:  # (else the body deadline goes on: a body nobody read)
            self._phase = _IDLE
            deadline = self._deadline = self.loop.time() + self.timeout_keep_alive
            if self._timer is None or deadline < self._timer_at:
                self._arm(deadline)
        self.edge.waiting[self] = None  # idle until the next request: displaceable

    def _write_answered(self, request: Request, info: RequestInfo, started: float) -> None:
        """The access line of a request answered at the connection: what
        ``request_ids.write_access`` writes, from what the request and the connection know
        (its route's model and version, the client's text made once per connection)."""
        if info.model is None:
            params = request.scope["path_params"]
            info.model = params["model"]
            info.version = params.get("version")
        peer = self._peer
        if peer is None and self.client:
            peer = self._peer = request_ids.client_text(self.client)
        scope = request.scope
        write_line(
            AccessLine(  # (positional: a class called with keywords builds a dict first)
                "HTTP", "POST", scope["path"], 200, time.monotonic() - started,
                request.servekit_in, request.sent, peer, info,
            )
        )  # fmt: skip

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        """The request's task starts knowing its request (ID on the answer, access log:
        app/servekit/rest/request_ids.py); its log records carry the ID (``CURRENT`` is set only
        while the task is created, which copies it)."""
        counted = self._counting and not cycle.waiting_for_100_continue
        token = request_ids.begin(cycle, counted)
        if counted:  # written at on_response_complete (or connection_lost)
            self._access = (cycle, CURRENT.get(), time.monotonic())  # type: ignore[assignment]
        fast = self.fast_answer
        answering = None
        if fast is not None and app is self.config.loaded_app:  # (not the edge's refusal)
            answering = fast.take(cycle, app, self.transport)  # the inference routes' answer
        if answering is None:
            super()._start_asgi_task(cycle, app)
        elif cycle.more_body:  # its headers just ended: run at its body's end, or as a task
            self._pending = (answering, contextvars.copy_context(), cycle)
        else:  # a pipelined request, started as the one before it ends: a task of its own
            self._start_task(answering)
        CURRENT.reset(token)

    # -- deadlines ----------------------------------------------------------------------------
    def _watch(self, phase: int, seconds: float) -> None:
        """Enter ``phase`` with a deadline ``seconds`` from now (one timer, re-armed lazily)."""
        self._phase = phase
        deadline = self._deadline = self.loop.time() + seconds
        if self._timer is None or deadline < self._timer_at:
            self._arm(deadline)

    def _arm(self, at: float) -> None:
        """Make the timer fire at ``at``: the first, or a deadline nearer than the one it was
        set for (a later one needs nothing: the timer re-arms itself when it fires early)."""
        timer = self._timer
        if timer is not None:
            timer.cancel()
        self._timer = self.loop.call_at(at, self._on_deadline)
        self._timer_at = at

    def _on_deadline(self) -> None:
        self._timer = None
        if self._phase == _WAITING or self.transport is None or self.transport.is_closing():
            return
        if self._phase == _BODY and not self.cycle.more_body:
            return  # the whole request arrived: the application's time is not the client's
        now = self.loop.time()
        if self._phase == _IDLE:  # uvicorn's keep-alive timeout
            if now < self._deadline:
                self._arm(self._deadline)
            else:
                self.transport.close()
            return
        limits = self.edge.limits
        if self._phase == _BODY:
            if self.flow is not None and self.flow.read_paused:
                # The application has not asked for more yet: not the client's delay.
                self._deadline = now + limits.body_timeout_seconds
                self._body_began = max(self._body_began, now - limits.body_deadline_seconds)
            elif now >= self._deadline:
                seconds = limits.body_timeout_seconds
                self._close_with(408, f"request body not received within {seconds:g} s")
                return
            # The whole body: within bodyDeadlineSeconds, or past it at the minimum rate. The
            # next look is when the average would fall below that rate if nothing more came.
            rate = limits.body_min_bytes_per_second
            due = max(
                self._body_began + limits.body_deadline_seconds,
                self._body_began + self._body_in / rate,
            )
            if now >= due:
                self._close_with(
                    408,
                    f"request body not received within {limits.body_deadline_seconds:g} s "
                    f"(nor at {rate} bytes/s)",
                )
                return
            self._arm(min(self._deadline, due))
            return
        if now < self._deadline:
            self._arm(self._deadline)
            return
        seconds = limits.header_timeout_seconds
        self._close_with(408, f"request headers not received within {seconds:g} s")

    # -- refusing -----------------------------------------------------------------------------
    def _too_large(self) -> str:
        return f"request headers larger than {self.edge.limits.max_header_bytes} bytes"

    def send_400_response(self, msg: str) -> None:
        self._out.flush()  # what a response already wrote goes first
        super().send_400_response(msg)

    def _close_with(self, status: int, message: str) -> None:
        """Answer ``status`` (unless a response already started) and close the connection."""
        self._phase = _WAITING
        self._out.flush()  # what a response already wrote goes first
        cycle = self.cycle
        if cycle is None or cycle.response_complete or not cycle.response_started:
            if cycle is not None and not cycle.response_complete:
                # The application is waiting for the body: it now reads a disconnect, and
                # whatever it answers is dropped (this answer is the one sent).
                cycle.disconnected = True
                cycle.message_event.set()
            self.transport.write(_answer(status, message))
        self.transport.close()


def _refusing(status: int, message: str) -> Any:
    """An application answering ``status`` with ``{"error": message}`` and closing."""
    body = orjson.dumps({"error": message})

    async def refuse(scope: Any, receive: Any, send: Any) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return refuse


def _unavailable(message: str) -> Any:
    """An application answering 503 with Retry-After and ``{"error": message}``, and closing."""
    body = orjson.dumps({"error": message})
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", b"1"),
        (b"connection", b"close"),
    ]

    async def unavailable(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return unavailable


_busy = _unavailable("too many requests in progress; retry later")
"""The answer to a request over ``maxRequestsInFlight``."""
_crowded = _unavailable("too many requests in progress from this client address; retry later")
"""The answer to a request over its address's share of ``maxRequestsInFlight``."""


class TlsEdgeProtocol(EdgeProtocol):
    """:class:`EdgeProtocol` over TLS whose handshake it makes itself, so the handshake counts
    against the connection cap from ``accept()`` and against ``headerTimeoutSeconds``.

    Until the handshake completes, ``transport`` is the TCP connection (what displacement and
    uvicorn's shutdown close) and the protocol is in ``connections`` and ``waiting`` like a
    connection still sending its headers; then it becomes the TLS transport and the connection
    goes on as any other. Nothing is ever written in the clear: a connection refused or timed
    out before its handshake is closed without an HTTP answer."""

    tls_context: ClassVar[ssl.SSLContext]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._early: list[bytes] | None = None
        """While the handshake is under way: what the TLS layer delivered before the handshake
        task resumed (a client sends its request right after its Finished message)."""
        self._hello: list[bytes] | None = None
        """From accept until the task puts the TLS layer in place: bytes the event loop read
        meanwhile (uvloop starts reading once ``connection_made`` returns), the ClientHello."""
        self._lost = False
        self._handshake: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        edge = self.edge
        self.transport = transport
        if len(self.connections) >= edge.max_connections and not self._displace_one():
            self._refused = self._ignored = True
            transport.abort()  # nothing is encrypted yet: no answer can be read
            return
        self.connections.add(self)
        edge.waiting[self] = None
        self._early = []
        self._hello = []
        self._watch(_HEADER, edge.limits.header_timeout_seconds)
        self._handshake = self.loop.create_task(self._secure(transport))

    async def _secure(self, raw: asyncio.Transport) -> None:
        """Make the handshake (within ``headerTimeoutSeconds`` of accept), then serve HTTP."""
        limits = self.edge.limits
        hello, self._hello = self._hello or [], None
        if hello:  # read before the TLS layer was in place: it gets them first (see _feed)
            self.loop.call_soon(_feed, raw, b"".join(hello))
        try:
            secured = await self.loop.start_tls(
                raw,
                self,
                self.tls_context,
                server_side=True,
                ssl_handshake_timeout=limits.header_timeout_seconds,
            )
        except Exception:  # refused certificate, timeout, a client gone: nothing to answer
            raw.close()
            self._release()
            return
        if self._lost or secured is None or raw.is_closing():
            if secured is not None:
                secured.close()
            self._release()
            return
        early, self._early = self._early, None
        HttpToolsProtocol.connection_made(self, secured)
        self._out.transport = secured
        client = self.client
        self._address = client[0] if client else ""
        for data in early or ():
            self.data_received(data)

    def _release(self) -> None:
        """Forget a connection that ends before its handshake did (idempotent)."""
        self._early = self._hello = None
        self._phase = _WAITING
        self.connections.discard(self)
        self.edge.waiting.pop(self, None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def data_received(self, data: bytes) -> None:
        if self._early is not None:  # the handshake is not done
            if self._hello is not None:  # TLS bytes, read before the TLS layer was in place
                self._hello.append(data)
                self.transport.pause_reading()  # start_tls resumes it
            else:  # the first request, decrypted before the handshake task resumed
                self._early.append(data)
            return
        super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if self._early is not None:  # before the handshake finished: no request, no cycle
            self._release()
            return
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        if self.flow is not None:
            super().pause_writing()

    def resume_writing(self) -> None:
        if self.flow is not None:
            super().resume_writing()

    def _close_with(self, status: int, message: str) -> None:
        if self._early is not None:  # the handshake is not done: close, say nothing
            self._phase = _WAITING
            self.transport.close()
            return
        super()._close_with(status, message)


def _feed(transport: asyncio.Transport, data: bytes) -> None:
    """Hand ``data`` to the TLS layer ``start_tls`` just put on ``transport``: it runs before
    that layer's ``connection_made`` and before reading resumes (both are scheduled after it),
    so the bytes keep their order. Before ``connection_made`` the TLS layer only stores them in
    its incoming buffer (asyncio's and uvloop's alike), where the handshake reads them."""
    protocol: Any = transport.get_protocol()
    if transport.is_closing() or isinstance(protocol, EdgeProtocol):  # start_tls failed
        return
    if hasattr(protocol, "buffer_updated"):  # both TLS layers are buffered protocols
        view = memoryview(data)
        while view:
            buffer = protocol.get_buffer(len(view))
            size = min(len(buffer), len(view))
            buffer[:size] = view[:size]
            protocol.buffer_updated(size)
            view = view[size:]
    else:
        protocol.data_received(data)
