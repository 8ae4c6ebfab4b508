"""Request IDs: what every transport shares (app/servekit/observability/).

A request's ID comes from the client when it sends one (HTTP ``X-Request-ID``, gRPC metadata
``x-request-id``; at most :data:`MAX_LENGTH` printable ASCII characters, else it is replaced),
else from the V2 request's own ``id`` (when the adapter reads one before answering), else it is
made here. The adapters put a :class:`RequestInfo` in :data:`CURRENT` for the request's task,
so every log record written while it runs (the DataPlane's, a model's) carries its ID, model and
version (app/servekit/observability/logs.py reads it), and write the ID back on the answer.

A made ID is this process's random prefix and a counter (``3f9c1a2b7d4e-26``): unique across
processes and restarts without a system call per request, which a UUID would cost.
"""

from __future__ import annotations

import itertools
import os
import urllib.parse
from contextvars import ContextVar
from typing import Any

HEADER = "x-request-id"
"""The HTTP header (any case) and the gRPC metadata key (lower case, as gRPC requires)."""
HEADER_BYTES = HEADER.encode()
MAX_LENGTH = 128
"""Longest ID taken from a client (Heroku's and nginx's IDs are 36 and 32 characters)."""

PREFIX = os.urandom(6).hex() + "-"
"""This process's part of every ID it makes (the counter follows)."""
counter = itertools.count(1)


class RequestInfo:
    """One request as the log knows it. Mutable: the adapter fills in the model and version
    once routed, and may adopt the V2 body's ``id`` before the answer is written.

    No ``__slots__`` and class-level defaults, on purpose: the HTTP edge makes one per request
    with ``object.__new__`` and two attribute stores (app/servekit/http/request_ids.py), no
    ``__init__`` frame."""

    id: str = ""
    sent: bool = False
    """Whether the client sent the ID (then the body's ``id`` does not replace it)."""
    model: str | None = None
    version: str | None = None
    headers: list[tuple[bytes, bytes]] | None = None
    """The HTTP response's header list that carries the ID (rewritten by :meth:`adopt`)."""
    span: Any = None
    """The request's OpenTelemetry span when tracing is on (observability/tracing.py)."""
    client: Any = None
    """Who sent it, as its transport said: ASGI's ``(host, port)``, grpcio's peer text
    (``ipv4:127.0.0.1:51234``); None in process. :func:`client_address` reads the address."""
    over_grpc: bool = False
    """Whether it came over gRPC (set by that adapter): a service that answers as the
    transport's peers do (MLServer hands BYTES over gRPC as bytes, over REST as text) reads it
    here instead of guessing from another field."""
    sent_headers: Any = None
    """The request's headers as its transport gave them (HTTP: uvicorn's ``(bytes, bytes)``
    pairs, lower-case names; gRPC: the invocation metadata's ``(str, str)`` pairs; None in
    process), kept by reference and read only by the rare feature that needs one
    (:func:`sent_header`), so no request pays for a header it does not use."""

    def __init__(self, request_id: str, sent: bool) -> None:
        self.id = request_id
        self.sent = sent

    def adopt(self, body_id: str) -> None:
        """Take the V2 request's ``id`` as this request's ID when the client sent no header
        (and the ``id`` is a valid one): the answer and the log then name the client's ID."""
        if self.sent or not body_id or body_id == self.id:
            return
        valid = accepted(body_id)
        if valid is None:
            return
        self.id = valid
        self.sent = True
        headers = self.headers
        if headers is not None:
            headers[-1] = (HEADER_BYTES, valid.encode())


CURRENT: ContextVar[RequestInfo | None] = ContextVar("servekit_request", default=None)
"""The request the running task serves (None outside a request)."""


def adopt_body_id(body_id: str) -> None:
    """The running request takes the V2 body's ``id`` as its ID (see :meth:`RequestInfo.adopt`)."""
    info = CURRENT.get()
    if info is not None:
        info.adopt(body_id)


def sent_header(name: str) -> bytes | None:
    """The value of the running request's header (gRPC metadata key) ``name``, lower case
    (None: not sent, or no request is running)."""
    info = CURRENT.get()
    headers = info.sent_headers if info is not None else None
    if not headers:
        return None
    encoded = name.encode()
    for key, value in headers:
        if key == encoded:
            return value if isinstance(value, bytes) else None
        if key == name:
            return value.encode() if isinstance(value, str) else value
    return None


def new_id() -> str:
    """A fresh ID: this process's prefix and the next number."""
    return PREFIX + str(next(counter))


def accepted(value: bytes | str) -> str | None:
    """``value`` as an ID if it is 1 to MAX_LENGTH printable ASCII characters (no spaces or
    control characters: it goes into log lines and headers as it is), else None."""
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not 0 < len(value) <= MAX_LENGTH or not value.isascii() or not value.isprintable():
        return None
    if " " in value:
        return None
    return value


def client_address(client: object) -> str | None:
    """The address (no port) of a request's ``client`` (:attr:`RequestInfo.client`): what
    counts one client for a per-client share, e.g. of a model's sequence slots. None when
    the request came from this process."""
    if isinstance(client, tuple | list):
        return str(client[0]) if client else None
    if not isinstance(client, str) or not client:
        return None
    kind, _, rest = client.partition(":")
    if kind in ("ipv4", "ipv6"):
        host = urllib.parse.unquote(rest).rsplit(":", 1)[0]  # grpcio: "ipv6:%5B::1%5D:port"
        return host.removeprefix("[").removesuffix("]")
    return kind  # "unix:..." and the like: one local client
