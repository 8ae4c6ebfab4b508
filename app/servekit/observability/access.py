"""The access log: one line per request or call, whatever its transport.

Every lane builds one :class:`AccessLine` when its request ends and hands it to
:func:`write_line`, the one writer: the HTTP edge for a request it counts itself
(app/servekit/http/connection.py), app/servekit/http/request_ids.py for a request whose cycle
it wraps, app/servekit/grpc/request_ids.py for a call. :func:`write_line` leaves the line out
when the mode (``server.logging.accessLog``) says so; otherwise the log's own writer makes and
holds it in a server's process (:class:`servekit.observability.logs.AccessLines`: no
``logging.LogRecord``), or it is a record of :data:`access_log` (a notebook's own logging).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from servekit.observability.request_ids import RequestInfo

AccessMode = Literal["off", "on", "errors"]

access_log = logging.getLogger("servekit.access")
"""The access log's logger (app/servekit/observability/logs.py formats its records)."""


@dataclass(slots=True)
class AccessLine:
    """One request's access-log line: what it says, named, made once per request (when it ends,
    or when a gRPC call starts, its counts then growing).

    The lanes build it with positional values, in the order of the fields: a class called with
    keywords costs a dict per call (three times the positional call, on every request)."""

    protocol: str
    """``HTTP`` or ``gRPC``."""
    method: str
    """The HTTP method, or the RPC's name (``ModelInfer``)."""
    path: str
    """The HTTP path, or the RPC's full method (``/inference.GRPCInferenceService/ModelInfer``)."""
    status: int | str
    """The HTTP status (499: the client left first), or the gRPC code's name (``OK``)."""
    duration_s: float
    bytes_in: int
    bytes_out: int
    client: str | None
    """Who sent it: ``host:port`` over HTTP, grpcio's peer text; None in process."""
    info: RequestInfo
    """The request: its ID, model and version."""

    @property
    def failed(self) -> bool:
        """An HTTP status of 400 or more, a gRPC code other than OK (``accessLog: errors``)."""
        status = self.status
        return status != "OK" if isinstance(status, str) else status >= 400


class _Access:
    """The access log's mode for this process (set by the server at start), and the log's own
    writer of access lines when app/servekit/observability/logs.py set one up (else a record
    per line)."""

    mode: AccessMode = "off"
    write: Callable[[AccessLine], None] | None = None
    """The line made and held by the one log handler, with no ``logging.LogRecord``
    (:class:`~servekit.observability.logs.AccessLines`)."""


ACCESS = _Access()


def set_access(mode: AccessMode) -> None:
    """Switch the access log (``server.logging.accessLog``) for the listeners started next."""
    ACCESS.mode = mode


def write_line(line: AccessLine) -> None:
    """Write ``line`` (unless the mode leaves it out): the words for text, the same values as
    fields for JSON. Through the log's own writer when it has one (a server's process), else as
    a record of :data:`access_log` (a notebook's own logging)."""
    if ACCESS.mode == "errors" and not line.failed:
        return
    writer = ACCESS.write
    if writer is not None:
        writer(line)
        return
    if not access_log.isEnabledFor(logging.INFO):
        return
    info = line.info
    duration_ms = round(line.duration_s * 1000.0, 3)
    fields = {
        "access": True,
        "protocol": line.protocol,
        "method": line.method,
        "path": line.path,
        "status": line.status,
        "duration_ms": duration_ms,
        "bytes_in": line.bytes_in,
        "bytes_out": line.bytes_out,
        "client": line.client,
        "request_id": info.id,
        "model": info.model,
        "version": info.version,
    }
    access_log.handle(
        _AccessRecord(
            "%s %s %s %s %.3fms in=%d out=%d%s client=%s id=%s",
            (line.protocol, line.method, printable(line.path), line.status, duration_ms,
             line.bytes_in, line.bytes_out, model_words_of(info.model, info.version),
             line.client or "-", info.id),
            fields,
        )
    )  # fmt: skip


def printable(text: str) -> str:
    """``text`` for a text log line: as it is when printable, else with its control characters
    escaped (a percent-encoded newline in a path must not start a forged line of its own)."""
    if text.isprintable():
        return text
    return text.encode("unicode_escape").decode("ascii")


def model_words_of(model: str | None, version: str | None) -> str:
    """`` model=NAME version=V`` of a text access line (empty when no model is known)."""
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
