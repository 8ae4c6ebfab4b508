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
the Python exceptions we log), and grpc core's own logging is kept to its errors in text and
turned off in JSON (``GRPC_VERBOSITY``; its errors reach us as statuses): it wrote one line per
failed TLS handshake, which Python cannot throttle.

Why the standard ``logging`` module with a small formatter rather than structlog or
python-json-logger: every library above already logs through ``logging``, so routing them is
the handler's job, and the JSON line is one ``orjson.dumps`` (already a dependency) of the
record's fields; a structured-logging library would add a second model of records to bridge.

Both formats show every URI in a message or traceback as servekit shows URIs
(:func:`servekit.shown_paths.hide_uri_secrets`: no user info, no query), whoever logged it:
a library's debug line naming a signed URL too.

JSON lines carry ``time`` (UTC, ISO 8601, milliseconds), ``level``, ``logger``, ``message``,
and when known ``request_id``, ``model``, ``version`` (the request the record was written
for: app/servekit/observability/request_ids.py), ``worker`` (its index under
``server.workers``), ``error`` (a traceback), plus the record's own fields (the access log's, a
reload's outcome).
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

from servekit.observability.access import ACCESS, AccessLine, model_words_of, printable
from servekit.observability.request_ids import CURRENT
from servekit.shown_paths import hide_uri_secrets

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
            "message": hide_uri_secrets(record.getMessage()),
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
            out["error"] = hide_uri_secrets(self.formatException(record.exc_info))
        elif record.exc_text:
            out["error"] = hide_uri_secrets(record.exc_text)
        if record.stack_info:
            out["stack"] = record.stack_info
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    """``time LEVEL logger[wN]: message [request ID]`` and the traceback under it."""

    def __init__(self, worker: int | None = None) -> None:
        where = f"[w{worker}]" if worker is not None else ""
        super().__init__(f"%(asctime)s %(levelname)s %(name)s{where}: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = hide_uri_secrets(super().format(record))
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
    request, app/servekit/observability/access.py) written in groups.

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
            self._start_flusher()

    def hold(self, line: str) -> None:
        """Hold one access line made without a record: as :meth:`emit` holds a formatted
        access record (:class:`AccessLines` does the same inline).

        Without the handler's lock: ``list.append`` is atomic, and the held list is one list
        for the handler's life (:meth:`_write_held` takes lines off its front), so a line
        appended while the lines before it are written stays for the next write."""
        held = self._held
        held.append(line)
        if len(held) >= self.HELD_LINES:
            with self.lock:  # type: ignore[union-attr]
                self._write_held()
        if self._flusher is None:
            self._start_flusher()

    def hold_more(self) -> None:
        """What :meth:`hold` does after the append (for :class:`AccessLines`, which appends
        itself): the full group written, the flusher started."""
        if len(self._held) >= self.HELD_LINES:
            with self.lock:  # type: ignore[union-attr]
                self._write_held()
        if self._flusher is None:
            self._start_flusher()

    def _start_flusher(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            if self._flusher is None:
                self._flusher = threading.Thread(
                    target=self._flush_held, name="servekit-log-flush", daemon=True
                )
                self._flusher.start()

    def _write_held(self) -> None:
        """Write the held lines (the caller holds the handler's lock): taken off the list's
        front, as many as it holds now (a line appended meanwhile stays, for the next write)."""
        held = self._held
        count = len(held)
        if not count:
            return
        lines = held[:count]
        del held[:count]
        lines.append("")  # the last line's terminator, with no copy of the joined text
        try:
            self.stream.write(self.terminator.join(lines))
            self.stream.flush()
        except Exception:  # a closed or broken stderr: as logging treats a failed emit
            with contextlib.suppress(Exception):
                print("servekit: could not write the access log", file=sys.__stderr__)

    def _flush_held(self) -> None:
        sleep = time.sleep  # (not an Event's wait: that is a Condition's, in Python, each time)
        while True:
            sleep(self.HELD_SECONDS)
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


_MILLIS = tuple(f"{n:03d}" for n in range(1000))
"""``000`` to ``999``: a line's milliseconds (of its time and of its duration) by index, with no
format specification parsed per line."""


class AccessLines:
    """The access log's lines, made straight from their values and held by the one handler.

    An access line is written for every request, so it is made without what a record costs
    and it does not need (bench/instructions.py counted it): no ``logging.LogRecord`` and no
    trip through ``Logger.handle`` and the formatter (which walks the record's attributes).
    What a line shares with the lines before it is made once: the time's text once a second
    (the milliseconds taken from a table), and the part a route repeats (protocol, method,
    path, status, model, version: in JSON each of them encoded, with the fixed keys around
    them) once per such combination (:meth:`_pieces_of`, at most :data:`MAX_PIECES` kept). A
    line is then one f-string of ready strings and the values that change (time, duration,
    bytes, client, ID): no ``%`` template, no dict, no ``orjson.dumps`` per line.

    The line reads as :class:`TextFormatter` / :class:`JsonFormatter` would write it; a JSON
    line's ``message`` is the short ``protocol method path status`` (its fields carry the
    rest); the duration is written to the microsecond (``12.345``) in both. The write stays
    off the request's path: the line is held by the handler (:class:`LineHandler`).
    """

    MAX_PIECES = 4096
    """Combinations of route, status and model kept (a scan of random paths cannot grow it)."""

    def __init__(self, handler: LineHandler, fmt: Format, worker: int | None) -> None:
        self.handler = handler
        self._held = handler._held  # (one list for the handler's life)
        self.json = fmt == "json"
        self.worker = worker
        self.name = f"servekit.access[w{worker}]" if worker is not None else "servekit.access"
        self._stamp = (-1, "")
        """The second and its text, one tuple: a thread never pairs one with the other's."""
        self._pieces: dict[tuple[Any, ...], tuple[str, str]] = {}
        self._clients: dict[str, str] = {}
        """A JSON line's client, encoded (clients are few, and their text is made once)."""

    def __call__(self, line: AccessLine) -> None:
        """Make ``line``'s text and hold it (the access log's writer, ``ACCESS.write``)."""
        now = time.time()
        second = int(now)
        done, stamp = self._stamp
        if second != done:  # the time's text (and the level's check), once a second
            stamp = self._stamp_of(second)
        if not stamp:  # the level leaves access lines out (--log-level warning)
            return
        info = line.info
        key = (line.protocol, line.method, line.path, line.status, info.model, info.version)
        pieces = self._pieces.get(key)
        if pieces is None:
            pieces = self._pieces_of(key)
        head, tail = pieces
        micros = int(line.duration_s * 1000000.0 + 0.5)
        client = line.client
        if self.json:
            request_id = info.id
            if info.sent and ('"' in request_id or "\\" in request_id):
                request_id = orjson.dumps(request_id).decode()[1:-1]  # (printable ASCII)
            peer = "null"
            if client is not None:
                peer = self._clients.get(client) or self._client_of(client)
            text = (
                f"{stamp}{_MILLIS[int((now - second) * 1000.0)]}{head}{request_id}{tail}"
                f'{micros // 1000}.{_MILLIS[micros % 1000]},"bytes_in":{line.bytes_in},'
                f'"bytes_out":{line.bytes_out},"client":{peer}}}'
            )
        else:
            text = (
                f"{stamp}{_MILLIS[int((now - second) * 1000.0)]}{head}{micros // 1000}."
                f"{_MILLIS[micros % 1000]}ms in={line.bytes_in} out={line.bytes_out}{tail}"
                f"{client or '-'} id={info.id}"
            )
        held = self._held  # LineHandler.hold, inlined (a call less per line)
        held.append(text)
        if len(held) >= LineHandler.HELD_LINES or self.handler._flusher is None:
            self.handler.hold_more()

    def _stamp_of(self, second: int) -> str:
        """The text of a line's time up to its milliseconds (kept for the second), or ""
        when the access logger's level leaves its lines out: the level is read here, once a
        second, not per line (a change of level shows within the second)."""
        if not _ACCESS_LOGGER.isEnabledFor(logging.INFO):
            stamp = ""
        elif self.json:
            stamp = f'{{"time":"{time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))}.'
        else:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S,", time.localtime(second))
        self._stamp = (second, stamp)
        return stamp

    def _pieces_of(self, key: tuple[Any, ...]) -> tuple[str, str]:
        """What a line of ``key`` (protocol, method, path, status, model, version) writes
        around its changing values: the part after the time and the part after the ID (JSON)
        or the duration and bytes (text)."""
        protocol, method, path, status, model, version = key
        if self.json:
            dumps = orjson.dumps
            head = (
                'Z","level":"INFO","logger":"servekit.access","message":'
                + dumps(f"{protocol} {method} {path} {status}").decode()
                + ',"request_id":"'
            )
            tail = '"'
            if model is not None:
                tail += ',"model":' + dumps(model).decode()
            if version is not None:
                tail += ',"version":' + dumps(version).decode()
            if self.worker is not None:
                tail += f',"worker":{self.worker}'
            tail += (
                f',"protocol":{dumps(protocol).decode()},"method":{dumps(method).decode()},'
                f'"path":{dumps(path).decode()},"status":{dumps(status).decode()},'
                '"duration_ms":'
            )
        else:
            head = f" INFO {self.name}: {protocol} {method} {printable(path)} {status} "
            tail = model_words_of(model, version) + " client="
        if len(self._pieces) >= self.MAX_PIECES:
            self._pieces.clear()
        self._pieces[key] = pieces = (head, tail)
        return pieces

    def _client_of(self, client: str) -> str:
        text = orjson.dumps(client).decode()
        if len(self._clients) >= self.MAX_PIECES:
            self._clients.clear()
        self._clients[client] = text
        return text


def setup(
    fmt: Format, level: str = "info", *, worker: int | None = None, onnxruntime: bool = True
) -> None:
    """Route every source through one handler on stderr in ``fmt`` at ``level``
    (``onnxruntime``: quieten it too; a supervisor, which loads no model, does not import it)."""
    os.environ[CHILD_FORMAT] = fmt  # child processes (isolated models) format alike
    # grpc core logs from C++ (absl) straight to stderr, out of Python's reach: one INFO line
    # per failed TLS handshake (ssl_transport_security.cc), as many lines as a client makes
    # failures. Its only bound is the level, read when grpc core starts: errors only in text,
    # nothing in JSON (its errors reach clients as statuses), unless the variable is set.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE" if fmt == "json" else "ERROR")
    handler = LineHandler(sys.stderr)
    handler.setFormatter(formatter(fmt, worker))
    ACCESS.write = AccessLines(handler, fmt, worker)
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
    ACCESS.write = None  # (serves no request) any access record meets the filter


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
