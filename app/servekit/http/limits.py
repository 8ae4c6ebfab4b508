"""The HTTP listener's limits: what uvicorn does not enforce, and the answers that refuse.

uvicorn (0.54, httptools) has a keep-alive timeout and ``limit_concurrency``, nothing more: no
deadline for headers or bodies (a slowloris client holds a connection forever), no bound on
header size or count (httptools buffers a 16 MB header), and ``limit_concurrency`` counts
connections and requests as one number, so slow clients that fill it shut out everyone else.
The edge's protocol (app/servekit/http/connection.py) adds, per connection, only what those
gaps need; this module holds what its connections share (:class:`EdgeState`), the caps, and
the canned answers of a refusal:

- a cap on open connections, lowered to what the open-file limit allows
  (:func:`connection_cap`): at the cap a new connection displaces the oldest connection with
  no request in progress (idle, or still sending its headers: a slowloris client), as nginx
  reuses idle connections, then the oldest one still sending a body past the read that ended
  its headers; with none to displace, 503 and close at once, never an ``accept()`` failing for
  lack of descriptors;
- header bytes and header lines (:class:`Refuse` raised in a parser callback: 431 and close);
- when a request's headers end, before it counts or its body is read: a ``Host`` header the
  server does not answer to (app/servekit/config/hosts.py, the DNS-rebinding guard): 403 with
  ``{"error": ...}`` and close, before any routing; then the token its route's group needs
  (:class:`Guard`, app/servekit/rest/access.py ``EdgeGuard``, only when some group is
  guarded): a request without it goes to the application at once, which answers its usual
  401 (or 403) without reading the body, on a connection then closed;
- a cap on requests in flight (all connections): 503 with Retry-After at once; and a share of
  it per client address (``clientShareOfRequests``: connections with a request in progress,
  counted per address when the headers end and released when its answer completes), so one
  address dripping bodies cannot take every slot from the others (health probes pass:
  :data:`PROBES`).

The deadlines are app/servekit/http/deadlines.py's.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from servekit.config.hosts import HostPolicy
from servekit.config.schema import NetworkLimits

if TYPE_CHECKING:
    from servekit.http.connection import EdgeProtocol

log = logging.getLogger("servekit.http")

FD_RESERVE = 64
"""Descriptors kept for what is not an HTTP connection: model files, gRPC, logs, pipes."""
ACCEPT_BACKLOG = 128
"""Listen backlog handed to asyncio, which also accepts up to this many connections per
wake-up before any of them reaches :meth:`EdgeProtocol.connection_made`; two such bursts are
kept free below the open-file limit so ``accept()`` never fails with EMFILE."""


class Refuse(Exception):
    """Raised inside an httptools callback to answer ``status`` and close the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Guard(Protocol):
    """The routes' token check at the end of a request's headers (app/servekit/rest/access.py
    ``EdgeGuard``): whether the application refuses this request for its token."""

    def refuses(self, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]]) -> bool:
        """True: the application answers 401 or 403 without reading the body."""
        ...


def _not_counted(loop: asyncio.AbstractEventLoop) -> None:
    """``EdgeState.note_read`` with no load signal to feed (a listener made in a test)."""


@dataclass
class EdgeState:
    """What all connections of one HTTP listener share."""

    limits: NetworkLimits
    max_connections: int
    hosts: HostPolicy | None = None
    """The ``Host`` names answered (None: any, ``server.allowedHosts: ['*']``)."""
    guard: Guard | None = None
    """The routes' token check (None: no group is guarded)."""
    note_read: Callable[[asyncio.AbstractEventLoop], None] = _not_counted
    """The load signal's count of plain inference requests read a loop pass
    (app/servekit/services/execution/load.py ``Load.note_read``, given by the server)."""
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


def answer(status: int, message: str, extra: bytes = b"") -> bytes:
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


PROBES = frozenset(
    {b"/v2/health/live", b"/v2/health/ready", b"/grps/v1/health/live", b"/grps/v1/health/ready"}
)
"""Health probes pass the cap on requests in flight: a server busy with slow requests is alive
and says so, rather than failing the orchestrator's liveness probe and being restarted."""


def refusing(status: int, message: str) -> Any:
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


def unavailable(message: str) -> Any:
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


BUSY = unavailable("too many requests in progress; retry later")
"""The answer to a request over ``maxRequestsInFlight``."""
CROWDED = unavailable("too many requests in progress from this client address; retry later")
"""The answer to a request over its address's share of ``maxRequestsInFlight``."""


def host_refusal(headers: list[tuple[bytes, bytes]], hosts: HostPolicy) -> Any:
    """None when the request's ``Host`` is one this server answers (app/servekit/config/
    hosts.py), else the application answering 403: the DNS-rebinding guard, at the edge so
    that it runs before routing and covers every route, the inference lane included. Clients
    send ``Host`` first, so the scan usually stops at the first header, and an allowed value
    seen before costs one dictionary lookup."""
    for name, value in headers:
        if name == b"host":
            if value in hosts.remembered or hosts.allows(value):
                return None
            return refusing(403, hosts.refusal(value))
    return None  # no Host (HTTP/1.0): not a browser
