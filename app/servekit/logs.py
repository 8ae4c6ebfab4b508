"""The one log setup of a server process (``server.logging``): every source, one formatter.

Called once by the composition before anything serves: ``servekit serve`` (app/servekit/cli.py),
each worker of ``server.workers`` (app/servekit/workers/worker.py) and an isolated model's child
process (app/servekit/runtimes/isolated_child.py, through ``CHILD_FORMAT``). A notebook's server
leaves the notebook's own logging alone.

Every source reaches the root logger's one handler: servekit's loggers, uvicorn's (its own
``dictConfig`` is turned off in app/servekit/server.py, so its records propagate here instead
of being printed by handlers of its own, which once printed lines twice), grpcio's Python
loggers, watchfiles' (its per-change INFO lines kept for ``debug``), Python warnings, uncaught
exceptions (main thread and others). Two sources write from C++ straight to stderr, where no
formatter reaches: onnxruntime is told to keep quiet below ERROR in text (its telemetry
warning in a read-only image, its graph notes) and below FATAL in JSON (its errors come back as
the Python exceptions we log), and grpc core's own logging is turned off in JSON
(``GRPC_VERBOSITY``; its errors reach us as statuses).

Why the standard ``logging`` module with a small formatter rather than structlog or
python-json-logger: every library above already logs through ``logging``, so routing them is
the handler's job, and the JSON line is one ``orjson.dumps`` (already a dependency) of the
record's fields; a structured-logging library would add a second model of records to bridge.

JSON lines carry ``time`` (UTC, ISO 8601, milliseconds), ``level``, ``logger``, ``message``,
and when known ``request_id``, ``model``, ``version`` (the request the record was written
for: app/servekit/request_id.py), ``worker`` (its index under ``server.workers``), ``error``
(a traceback), plus the record's own fields (the access log's, a reload's outcome).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from types import TracebackType
from typing import Any, Literal

import orjson

from servekit import request_id
from servekit.request_id import CURRENT, RequestInfo, model_words, printable

Format = Literal["text", "json"]

CHILD_FORMAT = "_SERVEKIT_LOG_FORMAT"
"""Environment variable telling a child process (an isolated model) the log format; not
``SERVEKIT_*``, which is serve.yaml's."""

_STANDARD = frozenset(
    (*vars(logging.LogRecord("", 0, "", 0, "", None, None)), "message", "asctime", "worker")
)
_CONTEXT = frozenset(("request_id", "model", "version", "access"))
"""Fields written from the request's context (or left out: ``access`` marks access lines)."""
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}  # fmt: skip


def _context(record: logging.LogRecord) -> tuple[Any, Any, Any]:
    """The record's request ID, model and version: its own fields, else the request it was
    written for."""
    fields = record.__dict__
    info = CURRENT.get()
    request_id = fields.get("request_id", info.id if info is not None else None)
    model = fields.get("model", info.model if info is not None else None)
    version = fields.get("version", info.version if info is not None else None)
    return request_id, model, version


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def __init__(self, worker: int | None = None) -> None:
        super().__init__()
        self.worker = worker

    def format(self, record: logging.LogRecord) -> str:
        created = time.gmtime(record.created)
        millis = int(record.msecs)
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", created) + f".{millis:03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id, model, version = _context(record)
        if request_id is not None:
            out["request_id"] = request_id
        if model is not None:
            out["model"] = model
        if version is not None:
            out["version"] = version
        if self.worker is not None:
            out["worker"] = self.worker
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in out and key not in _CONTEXT:
                out[key] = value
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["error"] = record.exc_text
        if record.stack_info:
            out["stack"] = record.stack_info
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    """``time LEVEL logger[wN]: message [request ID]`` and the traceback under it."""

    def __init__(self, worker: int | None = None) -> None:
        where = f"[w{worker}]" if worker is not None else ""
        super().__init__(f"%(asctime)s %(levelname)s %(name)s{where}: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.__dict__.get("access"):
            return text  # the access line names its ID itself
        request_id, _, _ = _context(record)
        if request_id is None:
            return text
        first, sep, rest = text.partition("\n")
        return f"{first} [request {request_id}]{sep}{rest}"


def formatter(fmt: Format, worker: int | None = None) -> logging.Formatter:
    return JsonFormatter(worker) if fmt == "json" else TextFormatter(worker)


class LineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The one handler: every record formatted and written to stderr; access lines (one per
    request, app/servekit/request_id.py) written in groups.

    stderr is line-buffered, so each record is one ``write`` system call: for the access log,
    the largest part of its cost per request. Access lines are held instead (at most
    :data:`HELD_LINES`, at most :data:`HELD_SECONDS`) and written together; any other record
    writes the held lines first, so the order of lines is the order of records. A process
    that is killed (SIGKILL) loses at most the last ``HELD_SECONDS`` of access lines; a clean
    exit writes them (``logging.shutdown`` flushes)."""

    HELD_LINES = 64
    HELD_SECONDS = 0.1

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._held: list[str] = []
        self._flusher: threading.Thread | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.__dict__.get("access") is not True:
            if self._held:
                self._write_held()
            super().emit(record)
            return
        try:
            self._held.append(self.format(record))
        except Exception:
            self.handleError(record)
            return
        if len(self._held) >= self.HELD_LINES:
            self._write_held()
        elif self._flusher is None:
            self._flusher = threading.Thread(
                target=self._flush_held, name="servekit-log-flush", daemon=True
            )
            self._flusher.start()

    def hold(self, line: str) -> None:
        """Hold one access line made without a record (:class:`AccessLines`): as :meth:`emit`
        holds a formatted access record."""
        with self.lock:  # type: ignore[union-attr]
            held = self._held
            held.append(line)
            if len(held) >= self.HELD_LINES:
                self._write_held()
        if self._flusher is None:
            self._flusher = threading.Thread(
                target=self._flush_held, name="servekit-log-flush", daemon=True
            )
            self._flusher.start()

    def _write_held(self) -> None:
        """Write the held lines (the caller holds the handler's lock)."""
        lines, self._held = self._held, []
        try:
            self.stream.write(self.terminator.join(lines) + self.terminator)
            self.stream.flush()
        except Exception:  # a closed or broken stderr: as logging treats a failed emit
            with contextlib.suppress(Exception):
                print("servekit: could not write the access log", file=sys.__stderr__)

    def _flush_held(self) -> None:
        wait = threading.Event().wait
        while True:
            wait(self.HELD_SECONDS)
            if self._held:
                with self.lock:  # type: ignore[union-attr]
                    if self._held:
                        self._write_held()

    def flush(self) -> None:
        if self._held:
            with self.lock:  # type: ignore[union-attr]
                if self._held:
                    self._write_held()
        super().flush()


_ACCESS_LOGGER = logging.getLogger("servekit.access")


class AccessLines:
    """The access log's lines, made straight from their values and held by the one handler.

    An access line is written for every request, so it is made without what a record costs
    and it does not need (bench/instructions.py counted it): no ``logging.LogRecord`` and no
    trip through ``Logger.handle`` and the formatter (which walks the record's attributes);
    the time's text is made once a second (the milliseconds appended), and a JSON line is
    one ``orjson.dumps`` of a dict built in the formatter's own order of fields (time, level,
    logger, message, request_id, model, version, worker, then the access fields). The line
    reads as :class:`TextFormatter` / :class:`JsonFormatter` would write it; a JSON line's
    ``message`` is the short ``protocol method path status`` (its fields carry the rest).
    The write stays off the request's path: the handler holds the line (:meth:`LineHandler.hold`).
    """

    def __init__(self, handler: LineHandler, fmt: Format, worker: int | None) -> None:
        self.hold = handler.hold
        self.json = fmt == "json"
        self.worker = worker
        self.name = f"servekit.access[w{worker}]" if worker is not None else "servekit.access"
        self._stamp = (-1, "")
        """The second and its text, one tuple: a thread never pairs one with the other's."""

    def __call__(
        self,
        protocol: str,
        method: str,
        path: str,
        status: int | str,
        duration_s: float,
        bytes_in: int,
        bytes_out: int,
        client: str | None,
        info: RequestInfo,
    ) -> None:
        if not _ACCESS_LOGGER.isEnabledFor(logging.INFO):
            return
        now = time.time()
        second = int(now)
        done, stamp = self._stamp
        if second != done:  # the time's text, once a second
            if self.json:
                stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            else:
                stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
            self._stamp = (second, stamp)
        millis = int((now - second) * 1000)
        if not self.json:
            self.hold(
                f"{stamp},{millis:03d} INFO {self.name}: {protocol} {method} {printable(path)} "
                f"{status} {duration_s * 1000.0:.3f}ms in={bytes_in} out={bytes_out}"
                f"{model_words(info)} client={client or '-'} id={info.id}"
            )
            return
        out: dict[str, Any] = {
            "time": f"{stamp}.{millis:03d}Z",
            "level": "INFO",
            "logger": "servekit.access",
            "message": f"{protocol} {method} {path} {status}",
            "request_id": info.id,
        }
        if info.model is not None:
            out["model"] = info.model
        if info.version is not None:
            out["version"] = info.version
        if self.worker is not None:
            out["worker"] = self.worker
        out["protocol"] = protocol
        out["method"] = method
        out["path"] = path
        out["status"] = status
        out["duration_ms"] = round(duration_s * 1000.0, 3)
        out["bytes_in"] = bytes_in
        out["bytes_out"] = bytes_out
        out["client"] = client
        self.hold(orjson.dumps(out).decode())


def setup(
    fmt: Format, level: str = "info", *, worker: int | None = None, onnxruntime: bool = True
) -> None:
    """Route every source through one handler on stderr in ``fmt`` at ``level``
    (``onnxruntime``: quieten it too; a supervisor, which loads no model, does not import it)."""
    os.environ[CHILD_FORMAT] = fmt  # child processes (isolated models) format alike
    if fmt == "json":
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")  # read when grpc core starts
    handler = LineHandler(sys.stderr)
    handler.setFormatter(formatter(fmt, worker))
    request_id.ACCESS.write = AccessLines(handler, fmt, worker)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(_LEVELS.get(level, logging.INFO))
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "grpc", "watchfiles"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    if root.level > logging.DEBUG:
        logging.getLogger("watchfiles").setLevel(logging.WARNING)  # "1 change detected", each
    logging.captureWarnings(True)
    sys.excepthook = _uncaught
    threading.excepthook = _uncaught_in_thread
    if onnxruntime:
        quiet_onnxruntime(fmt)


def quiet_onnxruntime(fmt: Format) -> None:
    """onnxruntime's C++ logger writes to stderr itself: let only what matters through (ERROR
    in text; FATAL in JSON, where a raw line would break the stream)."""
    with contextlib.suppress(ImportError):
        import onnxruntime

        onnxruntime.set_default_logger_severity(4 if fmt == "json" else 3)


def setup_child(name: str) -> None:
    """An isolated model's child process: the server's format (``CHILD_FORMAT``), INFO."""
    fmt: Format = "json" if os.environ.get(CHILD_FORMAT) == "json" else "text"
    setup(fmt, "info", onnxruntime=False)
    logging.getLogger().handlers[0].addFilter(_Named(name))
    request_id.ACCESS.write = None  # (serves no request) any access record meets the filter


class _Named(logging.Filter):
    """Names the model of a child process on each of its records."""

    def __init__(self, model: str) -> None:
        super().__init__()
        self.model = model

    def filter(self, record: logging.LogRecord) -> bool:
        record.__dict__.setdefault("model", self.model)
        return True


def announce(message: str, fmt: Format, **fields: Any) -> None:
    """A line for stdout (the listening line, the stopping line): as it is in text, a JSON
    object with the same message and ``fields`` in JSON."""
    if fmt == "json":
        record = logging.LogRecord("servekit", logging.INFO, "", 0, message, None, None)
        record.__dict__.update(fields)
        line = JsonFormatter().format(record)
    else:
        line = message
    print(line, flush=True)


_log = logging.getLogger("servekit")


def _uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, exc, tb)
        return
    _log.critical("uncaught exception", exc_info=(kind, exc, tb))


def _uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    name = args.thread.name if args.thread is not None else "?"
    _log.error(
        "uncaught exception in thread %s", name,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )  # fmt: skip


def level_of(flag: str | None, configured: str) -> str:
    """The level in force: the command line's ``--log-level`` over serve.yaml's."""
    return flag if flag is not None else configured
