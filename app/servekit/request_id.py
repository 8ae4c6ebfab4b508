"""Request IDs and the access log: what every transport shares (a foundation module).

A request's ID comes from the client when it sends one (HTTP ``X-Request-ID``, gRPC metadata
``x-request-id``; at most :data:`MAX_LENGTH` printable ASCII characters, else it is replaced),
else from the V2 request's own ``id`` (when the adapter reads one before answering), else it is
made here. The adapters put a :class:`RequestInfo` in :data:`CURRENT` for the request's task,
so every log record written while it runs (the DataPlane's, a model's) carries its ID, model and
version (app/servekit/logs.py reads it), and write the ID back on the answer.

A made ID is this process's random prefix and a counter (``3f9c1a2b7d4e-26``): unique across
processes and restarts without a system call per request, which a UUID would cost.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
import urllib.parse
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Literal

HEADER = "x-request-id"
"""The HTTP header (any case) and the gRPC metadata key (lower case, as gRPC requires)."""
HEADER_BYTES = HEADER.encode()
MAX_LENGTH = 128
"""Longest ID taken from a client (Heroku's and nginx's IDs are 36 and 32 characters)."""

AccessMode = Literal["off", "on", "errors"]

access_log = logging.getLogger("servekit.access")
"""The access log's logger: one record per request or call (app/servekit/logs.py formats it)."""

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
    """The request's OpenTelemetry span when tracing is on (app/servekit/tracing.py)."""
    client: Any = None
    """Who sent it, as its transport said: ASGI's ``(host, port)``, grpcio's peer text
    (``ipv4:127.0.0.1:51234``); None in process. :func:`client_address` reads the address."""

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


class _Access:
    """The access log's mode for this process (set by the server at start), and the log's own
    writer of access lines when app/servekit/logs.py set one up (else a record per line)."""

    mode: AccessMode = "off"
    write: Callable[..., None] | None = None
    """``write(protocol, method, path, status, duration_s, bytes_in, bytes_out, client, info)``:
    the line made and held by the one log handler, with no ``logging.LogRecord``
    (app/servekit/logs.py :class:`~servekit.logs.AccessLines`)."""


ACCESS = _Access()


def set_access(mode: AccessMode) -> None:
    """Switch the access log (``server.logging.accessLog``) for the listeners started next."""
    ACCESS.mode = mode


def record_access(
    *,
    protocol: str,
    method: str,
    path: str,
    status: int | str,
    failed: bool,
    duration_s: float,
    bytes_in: int,
    bytes_out: int,
    client: str | None,
    info: RequestInfo,
) -> None:
    """Write one access-log line (unless the mode leaves it out): the words for text, the
    same values as fields for JSON. Through the log's own writer when it has one (a server's
    process), else as a record of :data:`access_log` (a notebook's own logging)."""
    access_line(protocol, method, path, status, failed, duration_s, bytes_in, bytes_out, client,
                info)  # fmt: skip


def access_line(
    protocol: str,
    method: str,
    path: str,
    status: int | str,
    failed: bool,
    duration_s: float,
    bytes_in: int,
    bytes_out: int,
    client: str | None,
    info: RequestInfo,
) -> None:
    """:func:`record_access` with its values in order (no keywords: one access line per
    request, so the HTTP edge calls this directly)."""
    if ACCESS.mode == "errors" and not failed:
        return
    write = ACCESS.write
    if write is not None:
        write(protocol, method, path, status, duration_s, bytes_in, bytes_out, client, info)
        return
    if not access_log.isEnabledFor(logging.INFO):
        return
    duration_ms = round(duration_s * 1000.0, 3)
    fields = {
        "access": True,
        "protocol": protocol,
        "method": method,
        "path": path,
        "status": status,
        "duration_ms": duration_ms,
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
        "client": client,
        "request_id": info.id,
        "model": info.model,
        "version": info.version,
    }
    access_log.handle(
        _AccessRecord(
            "%s %s %s %s %.3fms in=%d out=%d%s client=%s id=%s",
            (protocol, method, printable(path), status, duration_ms, bytes_in, bytes_out,
             model_words(info), client or "-", info.id),
            fields,
        )
    )  # fmt: skip


def printable(text: str) -> str:
    """``text`` for a text log line: as it is when printable, else with its control characters
    escaped (a percent-encoded newline in a path must not start a forged line of its own)."""
    if text.isprintable():
        return text
    return text.encode("unicode_escape").decode("ascii")


def model_words(info: RequestInfo) -> str:
    """`` model=NAME version=V`` of a text access line (empty when no model is known)."""
    return model_words_of(info.model, info.version)


def model_words_of(model: str | None, version: str | None) -> str:
    """:func:`model_words` of a model and version."""
    if not model:
        return ""
    words = f" model={model}" + (f" version={version}" if version else "")
    return printable(words)  # a name taken from a path may hold anything


class _AccessRecord(logging.LogRecord):
    """An access line's record, made without the per-record work of ``Logger.info`` that such
    a line does not need: the caller's frame lookup (``findCaller`` walks the stack), the
    file-name splitting, the thread and process names, the checks of ``extra``. That work was
    most of the access log's cost per request (bench/observability.py). It goes to the same
    handlers and formatter as any record (``Logger.handle``); the attributes a formatter's
    ``%(...)s`` reads are set on the instance, the others are class-level placeholders."""

    pathname = filename = module = funcName = ""
    lineno = 0
    thread = threadName = processName = process = taskName = None
    relativeCreated = 0.0

    def __init__(self, msg: str, args: tuple[Any, ...], fields: dict[str, Any]) -> None:
        # LogRecord.__init__ not called, on purpose (see the class docstring).
        self.__dict__.update(fields)
        self.name = "servekit.access"
        self.msg = msg
        self.args = args
        self.levelname = "INFO"
        self.levelno = logging.INFO
        self.exc_info = None
        self.exc_text = None
        self.stack_info = None
        self.created = now = time.time()
        self.msecs = int((now - int(now)) * 1000) + 0.0


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
