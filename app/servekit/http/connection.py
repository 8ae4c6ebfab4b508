"""The HTTP listener's connection: uvicorn's httptools protocol with the edge's limits.

:class:`EdgeProtocol` subclasses uvicorn's protocol (through the deadlines' base,
app/servekit/http/deadlines.py) and adds, per connection, the limits of
app/servekit/http/limits.py: header bytes (request line included; counted per read while a
header block is incomplete, so httptools never buffers more than one read past the limit, and
exactly once it is complete unless it came whole in one read under the limit) and header lines
(431 and close); the connection cap with displacement; the ``Host`` check and the token check
when the headers end; the cap on requests in flight and each address's share of it.

A client that closes its connection while its inference request waits for the model cancels
that request (app/servekit/http/client_left.py ``WAITING``): queued, it never runs. uvicorn
itself only lets the application see the disconnect if it asks ``receive()``, which would cost
a task per request on the hot path.

A request the parser refuses (400, or the edge's 431) after a whole request on the same
connection is answered after it: reading stops, and the refusal is written and the connection
closed once the answers before it (computing, or pipelined behind it) are written.

Responses are written through the connection's coalescing writer (app/servekit/http/writes.py): one
``write()`` per small response. A plain inference request is read and answered by the inference lane
(app/servekit/http/inference_lane.py) without uvicorn's request machinery; every other request runs
the application as uvicorn runs it (Litestar's routes, its inference route included). With the
access log on, the edge counts each request itself (bytes in at ``on_body``, status and bytes out in
the counting writer, the line at ``on_response_complete``, 499 at ``connection_lost``).

Everything else (parsing, pipelining, flow control) stays uvicorn's.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, ClassVar

import httptools

from servekit.http import request_ids, taskless, traces
from servekit.http.client_left import TASKLESS, WAITING
from servekit.http.deadlines import BODY, HEADER, IDLE, UNWATCHED, Deadlines
from servekit.http.inference_lane import (
    InferenceLane,
    Pending,
    PlainRequest,
    read_plainly,
    write_answered,
)
from servekit.http.limits import BUSY, CROWDED, PROBES, Refuse, answer, host_refusal
from servekit.http.private_apis import HttpToolsProtocol
from servekit.http.writes import Coalescer, CountingCoalescer
from servekit.observability.access import ACCESS
from servekit.observability.request_ids import CURRENT, RequestInfo


class EdgeProtocol(Deadlines):
    """uvicorn's httptools protocol with deadlines, header limits and connection caps."""

    lane: ClassVar[InferenceLane | None] = None
    """The inference routes' answer at the connection (None: every request the ASGI way)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
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
        self._out = CountingCoalescer(self.loop) if self._counting else Coalescer(self.loop)
        self._peer: str | None = None
        """The client's ``host:port`` as the access log writes it (made once)."""
        self._access: tuple[Any, RequestInfo, float] | None = None
        """The running request's cycle, request and start, while the edge counts it."""
        self._pending: Pending | None = None
        """The inference answer of the request whose headers this read ended (its coroutine,
        context and request), run at once when its body ends in the same read, else started
        as a task when the read is done (app/servekit/http/taskless.py)."""

    # -- connections --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        edge = self.edge
        if len(self.connections) >= edge.max_connections and not self._displace_one():
            self._refused = self._ignored = True
            self.transport = transport
            transport.write(answer(503, "too many connections; retry later", b"retry-after: 1\r\n"))
            transport.close()
            return
        super().connection_made(transport)
        self._out.transport = transport
        client = self.client
        self._address = client[0] if client else ""
        edge.waiting[self] = None
        self._watch(HEADER, edge.limits.header_timeout_seconds)

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
            if task is not None and task is not TASKLESS:  # waiting for the model: drop it
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
        if self._phase == BODY and not self._reading and self.cycle.more_body:
            self._reading = True  # a body beyond this read: displaceable at the cap
            self.edge.reading[self] = None
        if self._phase == HEADER and not self._began_in_chunk and self.parser is not None:
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
        if isinstance(refusal, Refuse):
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
            self._phase = UNWATCHED
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
        if self._phase != HEADER:  # a later request on a kept-alive connection
            # _watch inlined: this and on_headers_complete run on every request
            self._phase = HEADER
            deadline = self._deadline = self.loop.time() + self.edge.limits.header_timeout_seconds
            if self._timer is None or deadline < self._timer_at:
                self._arm(deadline)

    def on_headers_complete(self) -> None:
        edge = self.edge
        limits = edge.limits
        if len(self.headers) > limits.max_header_count:
            raise Refuse(431, f"more than {limits.max_header_count} header lines")
        if not self._began_in_chunk or self._chunk_size > limits.max_header_bytes:
            # Not the usual small request read at once: count its header bytes exactly.
            size = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
            if size > limits.max_header_bytes:
                raise Refuse(431, self._too_large())
        edge.waiting.pop(self, None)
        self._phase = BODY
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
            refusal = host_refusal(self.headers, edge.hosts)
        guard = edge.guard
        unauthorized = (
            refusal is None
            and guard is not None
            and guard.refuses(self.parser.get_method(), self.url, self.headers)
        )
        if refusal is None and not unauthorized and self.url not in PROBES:
            if len(self.tasks) >= limits.max_requests_in_flight:
                refusal = BUSY
            elif not self._held:  # (a pipelined request: its connection is counted already)
                held = edge.held
                address = self._address
                count = held.get(address, 0)
                if count >= edge.share:
                    refusal = CROWDED
                else:
                    held[address] = count + 1
                    self._held = True
        lane = self.lane
        if refusal is None and lane is not None and not unauthorized and read_plainly(self, lane):
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

    def on_body(self, body: bytes) -> None:
        self._deadline = self.loop.time() + self.edge.limits.body_timeout_seconds
        self._body_in += len(body)
        cycle: Any = self.cycle
        if self._counting:
            cycle.servekit_in += len(body)
        if type(cycle) is PlainRequest:  # read whole (its length is bounded): no flow control
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
        if type(cycle) is PlainRequest:
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
                resumed = taskless.run(self.loop, coroutine, context)
            finally:
                tasks.discard(cycle)
            if resumed is not None:  # it waits (a batch, the model's thread, a write to drain)
                resumed.add_done_callback(tasks.discard)
                tasks.add(resumed)  # type: ignore[arg-type]  # cancelled as a task would be
                scope = cycle.scope
                if scope.get(WAITING) is TASKLESS:  # waiting for the model: the edge's to cancel
                    scope[WAITING] = resumed

    def _drop_pending(self) -> None:
        """Forget an answer that will not run (the request turned out malformed)."""
        pending = self._pending
        if pending is not None:
            self._pending = None
            pending[0].close()
            self.tasks.discard(pending[2])

    def on_response_complete(self) -> None:
        out = self._out
        if out.held is not None:  # a response with no body write (HEAD): its headers go now
            out.flush()
        out.armed = True  # the next response's first write is its header block
        access = self._access
        if access is not None:  # its access-log line, before a pipelined request starts
            self._access = None
            cycle, info, started = access
            if type(cycle) is PlainRequest and ACCESS.write is not None:  # answered here
                write_answered(self, cycle, info, started)
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
            self._phase = IDLE
            deadline = self._deadline = self.loop.time() + self.timeout_keep_alive
            if self._timer is None or deadline < self._timer_at:
                self._arm(deadline)
        self.edge.waiting[self] = None  # idle until the next request: displaceable

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        """The request's task starts knowing its request (ID on the answer, access log:
        app/servekit/http/request_ids.py); its log records carry the ID (``CURRENT`` is set only
        while the task is created, which copies it)."""
        counted = self._counting and not cycle.waiting_for_100_continue
        token = request_ids.begin(cycle, counted)
        if counted:  # written at on_response_complete (or connection_lost)
            self._access = (cycle, CURRENT.get(), time.monotonic())  # type: ignore[assignment]
        super()._start_asgi_task(cycle, app)
        CURRENT.reset(token)

    # -- refusing -----------------------------------------------------------------------------
    def _too_large(self) -> str:
        return f"request headers larger than {self.edge.limits.max_header_bytes} bytes"

    def send_400_response(self, msg: str) -> None:
        self._out.flush()  # what a response already wrote goes first
        super().send_400_response(msg)

    def _close_with(self, status: int, message: str) -> None:
        """Answer ``status`` (unless a response already started) and close the connection."""
        self._phase = UNWATCHED
        self._out.flush()  # what a response already wrote goes first
        cycle = self.cycle
        if cycle is None or cycle.response_complete or not cycle.response_started:
            if cycle is not None and not cycle.response_complete:
                # The application is waiting for the body: it now reads a disconnect, and
                # whatever it answers is dropped (this answer is the one sent).
                cycle.disconnected = True
                cycle.message_event.set()
            self.transport.write(answer(status, message))
        self.transport.close()
