"""The payload log: requests and answers as CloudEvents, written off the request path.

What is logged and when is the services' (app/servekit/services/payload_log.py: the marked
models, the sampled share, the request ID joining a request and its answer); this module is the
rest: a bounded queue the request path offers events to (never waiting: a full queue drops and
counts), one thread that makes each event's JSON and hands it to the sink, and the two sinks:

* :class:`FileSink`: one CloudEvent per line in CloudEvents' JSON format (the attributes and
  ``data``), rotated by size by the standard library's ``RotatingFileHandler``;
* :class:`HttpSink`: each event POSTed as KServe's logger sends it (kserve/kserve
  ``pkg/logger/worker.go`` ``sendHttpCloudEvent``, CloudEvents' HTTP binary mode): the attributes
  as ``Ce-*`` headers (``Ce-Specversion: 1.0``, ``Ce-Id`` the request ID, ``Ce-Type``
  ``org.kubeflow.serving.inference.request`` or ``.response``, ``Ce-Source``, ``Ce-Time``, the
  extensions ``Ce-Inferenceservicename``, ``Ce-Namespace``, ``Ce-Component``, ``Ce-Endpoint``,
  ``Ce-Metadata``, ``Ce-Recordedtime``), the payload as the body with its ``Content-Type``.

A sink that fails (refused, unreachable, an error status, a timeout) has the event counted as
dropped and is left alone for :data:`RETRY_S`: events offered meanwhile are dropped at once, so
a dead sink costs a request one comparison. Nothing of a request's headers is ever written.
"""

from __future__ import annotations

import http.client
import logging
import os
import queue
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Protocol

import orjson

from servekit.shown_paths import hide_paths, shown_uri

log = logging.getLogger("servekit.payload_log")

REQUEST = "org.kubeflow.serving.inference.request"
"""KServe's CloudEvent type of a logged request (pkg/logger/worker.go ``CEInferenceRequest``)."""
RESPONSE = "org.kubeflow.serving.inference.response"
"""KServe's CloudEvent type of a logged answer (``CEInferenceResponse``)."""
CAPACITY = 256
"""Events waiting for the sink at most (KServe's logger queues 100); one more is dropped."""
BATCH = 64
"""Most events the log's thread takes off the queue at once: the file sink writes them as one
write (one flush, one rotation check), the HTTP sink one POST each, as KServe's logger."""
TIMEOUT_S = 2.0
"""Longest the HTTP sink waits to connect, or for each read of its answer."""
RETRY_S = 1.0
"""How long a sink that failed is left alone (events offered meanwhile are dropped)."""
WARN_EVERY_S = 60.0
"""At most one warning about a failing sink per this many seconds in the server's log."""
COMPONENT = "predictor"
"""``Ce-Component``: the KServe component servekit is (a predictor)."""
ENDPOINT = "default"
"""``Ce-Endpoint``: KServe's ``default`` (its other value, ``canary``, names a second
InferenceService revision, which one servekit process never is)."""
JSON = "application/json"


@dataclass(slots=True)
class PayloadEvent:
    """One request or one answer to log; its JSON is made by the log's thread (``body``)."""

    type: str
    """:data:`REQUEST` or :data:`RESPONSE`."""
    id: str
    """The request's ID (``X-Request-ID`` or the one made for it): ``Ce-Id`` of both events."""
    model: str
    version: str | None
    occurred: float
    """When the request arrived or the answer was made (``time.time()``): ``Ce-Time``."""
    body: Callable[[], bytes]
    """The V2 JSON of the request or answer (called in the log's thread, not the request's)."""


@dataclass(frozen=True, slots=True)
class PayloadCounts:
    """What the payload log did since the server started (this process's)."""

    logged: int
    """Events the sink took (the file written, the endpoint answered 2xx)."""
    queue_full: int
    """Events dropped because the queue was full (the sink was slower than the requests)."""
    sink_failed: int
    """Events dropped because the sink failed (refused, timed out, an error status), or
    offered while a sink that failed was left alone."""

    @property
    def dropped(self) -> int:
        return self.queue_full + self.sink_failed


Ready = list[tuple[PayloadEvent, bytes]]
"""Events with their JSON, in the order they were offered: what a sink is handed at once."""


class SinkFailed(Exception):
    """A sink took the first ``taken`` events it was handed, then failed (``__cause__``)."""

    def __init__(self, taken: int) -> None:
        super().__init__(taken)
        self.taken = taken


class Sink(Protocol):
    """Where events go: ``write`` takes them all, or raises :class:`SinkFailed`."""

    def write(self, events: Ready, source: str) -> None: ...

    def close(self) -> None: ...

    def shown(self) -> str:
        """What the server's log and the dashboard may show of the sink (no secret, no path)."""
        ...


def ce_time(seconds: float) -> str:
    """A CloudEvents time (RFC 3339, UTC) as KServe's Go SDK writes it (``RFC3339Nano``:
    trailing zeros of the fraction left out)."""
    stamp = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")
    return stamp.rstrip("0").rstrip(".") + "Z"


def namespace() -> str:
    """``Ce-Namespace``: the pod's namespace when Kubernetes gives it (``POD_NAMESPACE``, the
    downward API's usual name), else ``default``."""
    return os.environ.get("POD_NAMESPACE") or "default"


def attributes(event: PayloadEvent, source: str) -> dict[str, str]:
    """The event's CloudEvents attributes and KServe's extensions, named as KServe sets them."""
    return {
        "specversion": "1.0",
        "id": event.id,
        "source": source,
        "type": event.type,
        "time": ce_time(event.occurred),
        "datacontenttype": JSON,
        "inferenceservicename": event.model,
        "namespace": namespace(),
        "component": COMPONENT,
        "endpoint": ENDPOINT,
        "modelversion": event.version or "",
        "metadata": "{}",
        "recordedtime": ce_time(time.time()),
    }


class _Rotating(RotatingFileHandler):
    """The standard library's size-rotated file, raising what it fails on (its own
    ``handleError`` prints to stderr and carries on: the log counts the event dropped)."""

    def handleError(self, record: logging.LogRecord) -> None:
        raise


class FileSink:
    """CloudEvents in JSON format, one a line, in a file rotated at ``max_bytes``."""

    def __init__(self, path: Path, max_bytes: int, backup_count: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._name = path.name
        self._handler = _Rotating(
            path, maxBytes=max_bytes, backupCount=backup_count, encoding="utf-8", delay=True
        )
        self._handler.setFormatter(logging.Formatter("%(message)s"))

    def write(self, events: Ready, source: str) -> None:
        """One write of every event's line (the file may pass ``max_bytes`` by one batch)."""
        lines = [
            orjson.dumps({**attributes(event, source), "data": orjson.Fragment(body)}).decode()
            for event, body in events
        ]
        record = logging.makeLogRecord({"msg": "\n".join(lines), "levelno": logging.INFO})
        try:
            self._handler.emit(record)
        except Exception as exc:
            raise SinkFailed(0) from exc

    def close(self) -> None:
        self._handler.close()

    def shown(self) -> str:
        return f"file {self._name}"


class HttpSink:
    """Each event POSTed in CloudEvents' binary mode, as KServe's logger sends it; one
    keep-alive connection, made again after a failure."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "localhost"
        self._port = parts.port
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._shown = shown_uri(url)
        self._connection: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        if self._https:
            context = ssl.create_default_context()
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=TIMEOUT_S, context=context
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=TIMEOUT_S)

    def write(self, events: Ready, source: str) -> None:
        for taken, (event, body) in enumerate(events):
            try:
                self._post(event, body, source)
            except Exception as exc:
                raise SinkFailed(taken) from exc

    def _post(self, event: PayloadEvent, body: bytes, source: str) -> None:
        headers = {
            f"Ce-{name.capitalize()}": value
            for name, value in attributes(event, source).items()
            if name != "datacontenttype"
        }
        headers["Content-Type"] = JSON
        connection = self._connection or self._connect()
        self._connection = None
        try:
            connection.request("POST", self._target, body, headers)
            answer = connection.getresponse()
            answer.read()
        except BaseException:
            connection.close()
            raise
        if not 200 <= answer.status < 300:
            connection.close()
            raise OSError(f"the payload log's endpoint answered HTTP {answer.status}")
        self._connection = connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def shown(self) -> str:
        return f"http {self._shown}"


class PayloadLog:
    """The queue, the thread and the counts around one sink (see the module docstring).

    The queue is a ``SimpleQueue`` (no lock taken on the request's side) bounded by counting:
    what the request's thread put in minus what the log's thread took out is what waits, and
    past ``capacity`` an event is dropped before it is even made (:meth:`admits`)."""

    def __init__(self, sink: Sink, source: Callable[[], str], capacity: int = CAPACITY) -> None:
        """``source``: ``Ce-Source`` (the server's address, read when an event is sent)."""
        self.sink = sink
        self._source = source
        self._capacity = capacity
        self._queue: queue.SimpleQueue[PayloadEvent | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._down_until = 0.0
        self._warned = -WARN_EVERY_S
        # Each count is written by one thread only (no lock): the request's or the log's.
        self._put = 0
        self._full = 0
        self._refused = 0
        self._taken = 0
        self._logged = 0
        self._failed = 0

    def admits(self, events: int) -> bool:
        """Whether a request's ``events`` may be offered; if not (the queue is full, or a sink
        that failed is left alone), they are counted dropped now, before anything is made."""
        if self._down_until and time.monotonic() < self._down_until:
            self._refused += events
            return False
        if self._put - self._taken >= self._capacity:
            self._full += events
            return False
        return True

    def offer(self, event: PayloadEvent) -> None:
        """Queue ``event`` for the sink (admitted by :meth:`admits`); never waits. The queue
        may hold a few more than ``capacity``: the events of requests admitted together."""
        if self._thread is None:
            self._start()
        self._put += 1
        self._queue.put(event)

    def counts(self) -> PayloadCounts:
        return PayloadCounts(self._logged, self._full, self._failed + self._refused)

    def _start(self) -> None:
        thread = threading.Thread(target=self._run, name="servekit-payload-log", daemon=True)
        self._thread = thread
        thread.start()

    def _run(self) -> None:
        take, more = self._queue.get, self._queue.get_nowait
        while True:
            batch = [take()]
            while batch[-1] is not None and len(batch) < BATCH:
                try:
                    batch.append(more())
                except queue.Empty:
                    break
            stop = batch[-1] is None
            events = [event for event in batch if event is not None]
            self._taken += len(events)
            self._deliver(events)
            if stop:
                break
        self.sink.close()

    def _deliver(self, events: list[PayloadEvent]) -> None:
        """Hand ``events`` to the sink, counting what it took and what was dropped."""
        if not events:
            return
        if self._down_until and time.monotonic() < self._down_until:
            self._failed += len(events)
            return
        ready: Ready = []
        for event in events:
            try:
                ready.append((event, event.body()))
            except Exception as exc:  # a value JSON cannot hold: this event only
                self._failed += 1
                self._warn(exc)
        if not ready:
            return
        try:
            self.sink.write(ready, self._source())
        except SinkFailed as failed:
            self._logged += failed.taken
            self._failed += len(ready) - failed.taken
            self._down_until = time.monotonic() + RETRY_S
            cause = failed.__cause__
            self._warn(cause if isinstance(cause, Exception) else failed)
            return
        self._down_until = 0.0
        self._logged += len(ready)

    def _warn(self, error: Exception) -> None:
        """Say in the server's log why events are dropped (at most once a minute)."""
        now = time.monotonic()
        if now - self._warned < WARN_EVERY_S:
            return
        self._warned = now
        reason = type(error).__name__ if isinstance(error, TimeoutError) else str(error)
        log.warning(
            "payload log: %s failed (%s); events are dropped and counted until it answers",
            self.sink.shown(),
            hide_paths(reason),
        )

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued (for up to ``timeout`` seconds) and stop the thread; a later
        ``offer`` starts it again. Blocking: call it off the event loop."""
        thread = self._thread
        if thread is None:
            return
        self._queue.put(None)
        thread.join(timeout)
        self._thread = None
