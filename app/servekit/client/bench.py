"""``server.benchmark(model)`` and ``servekit bench URL MODEL``: how fast a model serves.

The running server is driven the way clients drive it: over HTTP (binary tensor extension) and
over gRPC, by ``concurrency`` client threads each sending one request after the other, for
``seconds`` per protocol and concurrency level. Each request is one row: the first row of an
``example`` when one is given (a DataFrame, or input name -> array), else generated from the
model's metadata (every free dimension 1, numbers 1, a text input the first of the categories
its metadata lists, ``parameters.categories``). One request is sent first: when the model
refuses it (HTTP 400) the benchmark stops there and asks for an example, rather than timing
thousands of refusals. The result is a table (requests/s, p50/p90/p99 latency in
ms, errors counted by kind: connection refused, timeout, HTTP status, gRPC code) that shows
itself in a notebook with an inline SVG chart of throughput and p99 latency against
concurrency, and as text on a terminal. gRPC goes to the handle's ``grpc_target`` (``connect``'s
argument, ``servekit bench --grpc``), so a server behind a port mapping is measured where it is
reached. The numbers include this client's own work: run it from another machine for a
server's true capacity.

Each request carries a deadline only to end its step on time (the time left in the step and
:data:`ABANDON_GRACE`), so a healthy model never shows DEADLINE_EXCEEDED: deadline errors
appear only when a deadline was set, ``timeout`` per request or the model's own
``queueTimeoutMicroseconds``. Progress goes to ``progress_to`` (stdout in a notebook, where
stderr reads as an error; stderr for ``servekit bench``, whose stdout is the table).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import quote

import numpy as np

from servekit.client import frames, wire
from servekit.client.casting import cast_to
from servekit.client.transport import Reply, check
from servekit.codecs.raw import tensor_to_buffer
from servekit.config.auth import ApiGroup
from servekit.datatypes import from_numpy, lookup
from servekit.errors import InvalidArgument

if TYPE_CHECKING:
    from servekit.client.remote import RemoteServer

MAX_SECONDS = 60.0
TABULAR_PLATFORMS = frozenset({"sklearn", "xgboost", "lightgbm", "mlflow"})
"""Models whose text inputs are columns of a DataFrame: a made-up value is no real row."""
MAX_CONCURRENCY = 256


@dataclass
class BenchmarkRow:
    protocol: str
    concurrency: int
    requests: int
    errors: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    error_kinds: dict[str, int] = field(default_factory=dict)
    """How many requests failed, by kind (:func:`error_kind`)."""
    error_samples: dict[str, str] = field(default_factory=dict, repr=False)
    """The first message seen of each kind, to show what the server or the network said."""

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    def percentile(self, q: float) -> float | None:
        """The ``q``-th latency percentile in ms; None when no request succeeded (a figure
        made of nothing is not shown as ``nan``)."""
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else None

    def add_error(self, kind: str, message: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1
        self.error_samples.setdefault(kind, message)

    def as_dict(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol,
            "concurrency": self.concurrency,
            "requests": self.requests,
            "errors": self.errors,
            "rps": round(self.rps, 1),
            "p50_ms": _rounded(self.percentile(50)),
            "p90_ms": _rounded(self.percentile(90)),
            "p99_ms": _rounded(self.percentile(99)),
            "error_kinds": dict(self.error_kinds),
        }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def error_kind(exc: BaseException) -> tuple[str, str]:
    """``(kind, message)`` of a failed request: what a user acts on differs by kind (a refused
    connection is a wrong address, a timeout a slow model or network, an HTTP status or gRPC
    code the server's answer)."""
    import socket

    code = getattr(exc, "code", None)
    if callable(code) and hasattr(exc, "details"):  # grpc.RpcError (a grpc.Call)
        name = getattr(code(), "name", str(code()))
        details = str(exc.details() or "")
        kind = f"gRPC {name}"
        if name == "UNAVAILABLE" and "refused" in details.lower():
            kind += " (connection refused)"
        return kind, details or name
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused", str(exc)
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timeout", str(exc) or "timed out"
    message = str(exc)
    if message.startswith("HTTP ") and message[5:8].isdigit():  # transport.check's wording
        return message[:8], message[8:].lstrip(": ")
    if isinstance(exc, OSError):
        return "connection error", f"{type(exc).__name__}: {exc}"
    return type(exc).__name__, message


@dataclass
class BenchmarkTable:
    """The result: one row per protocol and concurrency; shows as a table and chart."""

    model: str
    rows: list[BenchmarkRow]

    def to_list(self) -> list[dict[str, Any]]:
        return [r.as_dict() for r in self.rows]

    @property
    def errors(self) -> int:
        """Failed requests over every row."""
        return sum(r.errors for r in self.rows)

    def error_lines(self) -> list[str]:
        """One line per protocol and kind of error: how many, and the first message."""
        counts: dict[tuple[str, str], int] = {}
        samples: dict[tuple[str, str], str] = {}
        for row in self.rows:
            for kind, count in row.error_kinds.items():
                counts[row.protocol, kind] = counts.get((row.protocol, kind), 0) + count
                samples.setdefault((row.protocol, kind), row.error_samples.get(kind, ""))
        return [
            f"errors ({protocol}): {count} x {kind}: {_short(samples[protocol, kind])}"
            for (protocol, kind), count in counts.items()
        ]

    def text(self) -> str:
        head = f"{'protocol':8} {'conc':>5} {'req/s':>9} {'p50 ms':>8} {'p90 ms':>8} "
        lines = [f"benchmark of {self.model}", head + f"{'p99 ms':>8} {'errors':>6}"]
        for row in self.to_list():
            lines.append(
                f"{row['protocol']:8} {row['concurrency']:>5} {row['rps']:>9.1f} "
                f"{_cell(row['p50_ms'])} {_cell(row['p90_ms'])} {_cell(row['p99_ms'])} "
                f"{row['errors']:>6}"
            )
        return "\n".join(lines + self.error_lines())

    def __repr__(self) -> str:
        return self.text()

    def _repr_svg_(self) -> str:
        return chart_svg(self.rows)

    def _repr_html_(self) -> str:
        cells = "".join(
            "<tr>" + "".join(f"<td>{escape(_html_cell(v))}</td>" for v in row.values()) + "</tr>"
            for row in self.to_list()
        )
        errors = "".join(f"<p>{escape(line)}</p>" for line in self.error_lines())
        head = "".join(
            f"<th>{h}</th>"
            for h in ("protocol", "concurrency", "requests", "errors", "req/s", "p50 ms", "p90 ms")
        )
        return (
            f"<div><b>benchmark of {escape(self.model)}</b><table><tr>{head}<th>p99 ms</th>"
            f"<th>errors by kind</th></tr>{cells}</table>{errors}{chart_svg(self.rows)}</div>"
        )


def _cell(value: float | None) -> str:
    return f"{'-':>8}" if value is None else f"{value:>8.2f}"


def _short(message: str, limit: int = 160) -> str:
    line = " ".join(message.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _html_cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {n}" for k, n in value.items())
    return str(value)


def chart_svg(rows: Sequence[BenchmarkRow], width: int = 560, height: int = 220) -> str:
    """Two small panels: requests/s and p99 latency against concurrency, a line per protocol."""
    colors = {"http": "#1f77b4", "grpc": "#d62728"}
    panel = (width - 40) // 2
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="11">'
    ]
    levels = sorted({r.concurrency for r in rows})
    panels: list[tuple[str, Callable[[BenchmarkRow], float | None]]] = [
        ("requests/s", _rps),
        ("p99 latency (ms)", _p99),
    ]
    for index, (title, value) in enumerate(panels):
        left = 30 + index * (panel + 20)
        top, bottom = 20, height - 30
        values = [v for v in (value(r) for r in rows) if v is not None]
        peak = max(values, default=1.0) or 1.0
        parts.append(f'<text x="{left}" y="12">{title} (max {peak:.1f})</text>')
        parts.append(
            f'<line x1="{left}" y1="{bottom}" x2="{left + panel}" y2="{bottom}" stroke="#888"/>'
        )
        parts.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#888"/>')
        for i, level in enumerate(levels):
            x = left + (i + 0.5) * panel / max(len(levels), 1)
            parts.append(f'<text x="{x:.0f}" y="{bottom + 14}" text-anchor="middle">{level}</text>')
        for protocol, color in colors.items():
            points = []
            for row in (r for r in rows if r.protocol == protocol):
                v = value(row)
                if v is None:
                    continue
                x = left + (levels.index(row.concurrency) + 0.5) * panel / max(len(levels), 1)
                y = bottom - (bottom - top) * v / peak
                points.append(f"{x:.1f},{y:.1f}")
            if points:
                parts.append(
                    f'<polyline fill="none" stroke="{color}" stroke-width="2" '
                    f'points="{" ".join(points)}"/>'
                )
    parts.append(
        f'<text x="30" y="{height - 4}">concurrency; '
        f'<tspan fill="{colors["http"]}">HTTP</tspan> '
        f'<tspan fill="{colors["grpc"]}">gRPC</tspan></text></svg>'
    )
    return "".join(parts)


def _rps(row: BenchmarkRow) -> float:
    return row.rps


def _p99(row: BenchmarkRow) -> float | None:
    return row.percentile(99)


@dataclass(frozen=True)
class RequestInputs:
    """One request's inputs, and the per-input parameters some need (a DataFrame's datetime
    columns travel as text with ``content_type: datetime``)."""

    arrays: dict[str, np.ndarray]
    parameters: dict[str, dict[str, str]] = field(default_factory=dict)


def example_inputs(metadata: dict[str, Any]) -> dict[str, np.ndarray]:
    """One request's inputs from V2 metadata: free dimensions 1, numbers 1, a text input the
    first category its metadata lists (``parameters.categories``), else ``b"1"``; a tabular
    model's text column without categories cannot be made up (InvalidArgument: give an
    example)."""
    inputs: dict[str, np.ndarray] = {}
    tabular = metadata.get("platform") in TABULAR_PLATFORMS
    for spec in metadata.get("inputs", []):
        shape = tuple(1 if int(d) < 0 else int(d) for d in spec.get("shape", []))
        if spec["datatype"] == "BYTES":
            known = (spec.get("parameters") or {}).get("categories")
            if not known and tabular:
                raise InvalidArgument(
                    f"{metadata.get('name', 'the model')}: input {spec['name']!r} is a text "
                    "column whose values the model does not list, so the benchmark cannot make "
                    "one up; pass an example of its input, e.g. benchmark(model, "
                    "example=X.head(1)) or servekit bench --example rows.csv"
                )
            text = str(known[0]) if known else "1"
            inputs[spec["name"]] = np.full(shape, text.encode("utf-8"), dtype=object)
        else:
            inputs[spec["name"]] = np.ones(shape, dtype=lookup(spec["datatype"]).dtype)
    return inputs


def request_inputs(metadata: dict[str, Any], example: Any = None) -> RequestInputs:
    """The benchmark's request: the first row of ``example`` (a DataFrame, or name -> array
    whose first dimension is rows), numbers cast to the model's datatypes where nothing is
    lost; without one, :func:`example_inputs`."""
    if example is None:
        return RequestInputs(example_inputs(metadata))
    declared = {spec["name"]: spec["datatype"] for spec in metadata.get("inputs", [])}
    shapes = {spec["name"]: spec.get("shape", []) for spec in metadata.get("inputs", [])}
    parameters: dict[str, dict[str, str]] = {}
    if frames.is_frame(example):
        if len(example) == 0:
            raise InvalidArgument("example: the DataFrame has no rows")
        arrays, parameters = frames.columns(example.head(1))
    elif isinstance(example, Mapping):
        arrays = {str(k): np.asarray(v)[:1] for k, v in example.items()}
    else:
        raise InvalidArgument(
            f"example: a pandas DataFrame or a dict of arrays, not {type(example).__name__}"
        )
    for name, array in arrays.items():
        if array.dtype.kind == "U":
            arrays[name] = _from_text(name, array, declared.get(name, "BYTES"))
        elif name in declared:
            try:
                cast = cast_to(name, array, declared[name])
            except InvalidArgument:
                cast = None  # sent as it is: the server says what it takes
            if cast is not None:
                arrays[name] = cast
        if arrays[name].ndim == 1 and list(shapes.get(name, []))[1:] == [1]:
            arrays[name] = arrays[name].reshape(-1, 1)  # a column of a tabular model
    return RequestInputs(arrays, parameters)


def _from_text(name: str, array: np.ndarray, datatype: str) -> np.ndarray:
    """Text (a CSV cell, a str array) as the input's datatype: numbers parsed, BYTES kept."""
    if datatype == "BYTES":
        return array.astype(object)
    try:
        if datatype == "BOOL":
            lowered = np.char.lower(np.char.strip(array))
            if not np.isin(lowered, ("true", "false", "1", "0")).all():
                raise ValueError("not true or false")
            return np.isin(lowered, ("true", "1"))
        return array.astype(lookup(datatype).dtype)
    except ValueError as exc:
        raise InvalidArgument(f"example: input {name!r} takes {datatype}: {exc}") from None


def csv_example(path: str) -> dict[str, np.ndarray]:
    """The first row of a CSV file with a header of input names (``servekit bench
    --example``), as text: :func:`request_inputs` parses each cell as its input's datatype."""
    import csv

    try:
        with open(path, newline="", encoding="utf-8") as handle:
            row = next(csv.DictReader(handle), None)
    except OSError as exc:
        raise InvalidArgument(f"--example: cannot read {path}: {exc.strerror}") from None
    if not row:
        raise InvalidArgument(f"--example: {path} has no header and row")
    return {str(k): np.asarray([v]) for k, v in row.items() if k is not None}


class _Senders:
    """What one step's client threads send with, and how to cut off what they still await.

    Every request carries the time left until the step's deadline (HTTP: its socket's
    timeout; gRPC: the call's deadline, which the server also honours by dropping it from the
    model's queue), so a slow model cannot stretch a step past its length. :meth:`abandon`
    (a stop, e.g. the dashboard's client leaving) cuts the requests in flight at once: the
    gRPC channel is closed (its calls are cancelled) and the HTTP sockets are shut down (the
    server sees its client leave and drops a queued request, app/servekit/http/client_left.py).
    """

    def __init__(self) -> None:
        self._sockets: list[Any] = []
        self._lock = threading.Lock()
        self.close: Callable[[], None] = lambda: None

    def watch(self, sock: Any) -> None:
        with self._lock:
            if sock is not None and sock not in self._sockets:
                self._sockets.append(sock)

    def abandon(self) -> None:
        import socket

        self.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _http_sender(
    server: RemoteServer, model: str, inputs: RequestInputs, senders: _Senders
) -> Callable[[float], None]:
    body, length = wire.encode_request(inputs.arrays, input_parameters=inputs.parameters)
    path = f"/v2/models/{quote(model, safe='')}/infer"
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(length),
    }
    headers.update(server._auth(ApiGroup.INFERENCE))
    transport = server._http

    def send(seconds: float) -> None:
        # This thread's keep-alive connection, used directly: the transport's one retry on a
        # closed connection would resend a request abandon() has just cut off.
        conn = transport._connection()
        try:
            conn.timeout = seconds  # a new connection's connect
            if conn.sock is None:
                conn.connect()  # now, so that abandon() can cut it while the request waits
            conn.sock.settimeout(seconds)
            senders.watch(conn.sock)
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
        except BaseException:
            transport.close()  # this thread's connection: unusable after a cut
            raise
        check(Reply(response.status, {}, data))

    return send


def _grpc_sender(
    target: str, token: str | None, model: str, inputs: RequestInputs, senders: _Senders
) -> Callable[[float], None]:
    import grpc

    from servekit.protos import grpc_service_pb2 as pb
    from servekit.protos import grpc_service_pb2_grpc as pb_grpc

    request = pb.ModelInferRequest(model_name=model)
    for name, array in inputs.arrays.items():
        datatype = from_numpy(array.dtype)
        tensor = request.inputs.add(name=name, datatype=datatype.name, shape=list(array.shape))
        for key, value in inputs.parameters.get(name, {}).items():
            tensor.parameters[key].string_param = value
        request.raw_input_contents.append(bytes(tensor_to_buffer(datatype, array)))
    channel = grpc.insecure_channel(target)
    stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
    metadata = [("authorization", f"Bearer {token}")] if token else None
    senders.close = channel.close

    def send(seconds: float) -> None:
        stub.ModelInfer(request, metadata=metadata, timeout=seconds)

    return send


ABANDON_GRACE = 1.0
"""Seconds past a step's end its client threads get to notice it, after which what they still
await is cut off again (the backstop). A request's own deadline is the step's end plus this:
the step's end cuts it first, so a deadline never fires on a healthy model."""


def _measure(send: Callable[[float], None], concurrency: int, seconds: float, protocol: str,
             senders: _Senders, stop: threading.Event, on_exit: Callable[[], None] | None = None,
             timeout: float | None = None) -> BenchmarkRow:  # fmt: skip
    """One step: ``concurrency`` threads sending until ``seconds`` from now, a hard deadline
    (or until ``stop`` is set); what is in flight then is abandoned, not awaited, and not
    counted. ``timeout``: each request's own deadline, when the caller sets one."""
    row = BenchmarkRow(protocol, concurrency, 0, 0, seconds)
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def worker() -> None:
        latencies: list[float] = []
        errors: list[tuple[str, str]] = []
        try:
            while not stop.is_set():
                started = time.perf_counter()
                left = stop_at - started
                if left <= 0:
                    break
                limit = left + ABANDON_GRACE
                try:
                    send(limit if timeout is None else min(timeout, limit))
                except Exception as exc:
                    if stop.is_set() or time.perf_counter() >= stop_at:
                        break  # cut off by the step's end or the stop: not the server's error
                    errors.append(error_kind(exc))
                    continue
                latencies.append((time.perf_counter() - started) * 1000.0)
        finally:
            if on_exit is not None:
                on_exit()
        with lock:
            row.latencies_ms.extend(latencies)
            row.requests += len(latencies)
            for kind, message in errors:
                row.add_error(kind, message)

    begun = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    stop.wait(max(0.0, stop_at - time.perf_counter()))  # returns early on a stop
    senders.abandon()  # the step is over: what is in flight is cut (the server drops it)
    grace = time.perf_counter() + ABANDON_GRACE
    for thread in threads:
        thread.join(max(0.0, grace - time.perf_counter()))
    if any(thread.is_alive() for thread in threads):
        senders.abandon()  # stuck past the end (a connect, a slow network): cut them again
        for thread in threads:
            thread.join(ABANDON_GRACE)
    row.seconds = min(time.perf_counter(), stop_at) - begun
    return row


def _progress(done: int, total: int, label: str, out: TextIO) -> None:
    """A one-line progress bar on ``out``, redrawn in place."""
    filled = int(30 * done / total) if total else 30
    bar = "#" * filled + "." * (30 - filled)
    end = "\n" if done == total else ""
    print(f"\r[{bar}] {done}/{total} {label:<24}", end=end, file=out, flush=True)


def _refused(server: RemoteServer, model: str, inputs: RequestInputs, example: Any) -> None:
    """One request first: InvalidArgument when the model refuses it (HTTP 400), with the
    way out, instead of a run of refusals. Anything else (a refused connection, a slow
    model) is left to the run, which counts it by kind."""
    senders = _Senders()
    send = _http_sender(server, model, inputs, senders)
    try:
        send(10.0)
    except Exception as exc:
        kind, message = error_kind(exc)
        if kind != "HTTP 400":
            return
        if example is None:
            raise InvalidArgument(
                f"{model}: the model refuses the inputs the benchmark makes from its metadata "
                f"({_short(message)}); pass an example of its input, e.g. "
                f'benchmark("{model}", example=X.head(1)) or servekit bench --example rows.csv'
            ) from None
        raise InvalidArgument(
            f"{model}: the model refuses the example's first row: {_short(message)}"
        ) from None
    finally:
        server._http.close()


def run_benchmark(
    server: RemoteServer,
    model: str,
    concurrency: Sequence[int] = (1, 16, 64),
    seconds: float = 5.0,
    protocols: Sequence[str] = ("http", "grpc"),
    progress: bool = True,
    stop: threading.Event | None = None,
    example: Any = None,
    timeout: float | None = None,
    progress_to: TextIO | None = None,
) -> BenchmarkTable:
    """Drive ``model`` of ``server`` (see the module docstring). Each step lasts ``seconds``
    whatever the model's speed (requests still in flight at its end are abandoned); setting
    ``stop`` ends the run at once with the rows measured so far. ``example``: rows of real
    input (the first is sent); ``timeout``: a deadline per request in seconds (its expiries
    are then errors); ``progress_to``: where the progress bar goes (default stdout)."""
    stop = stop or threading.Event()
    levels = [int(c) for c in concurrency]
    if not levels or any(c < 1 or c > MAX_CONCURRENCY for c in levels):
        raise ValueError(f"concurrency: numbers from 1 to {MAX_CONCURRENCY}")
    if not 0 < seconds <= MAX_SECONDS:
        raise ValueError(f"seconds: more than 0, at most {MAX_SECONDS}")
    if timeout is not None and not timeout > 0:
        raise ValueError("timeout: seconds, more than 0")
    inputs = request_inputs(server.metadata(model), example)
    _refused(server, model, inputs, example)
    # gRPC is driven in plain text: over TLS (an https:// server) HTTP alone is measured.
    grpc_ok = server.grpc_target is not None and not server.url.startswith("https://")
    plan = [p for p in protocols if p == "http" or (p == "grpc" and grpc_ok)]
    total = len(plan) * len(levels)
    out = progress_to or sys.stdout
    rows: list[BenchmarkRow] = []
    for protocol in plan:
        for level in levels:
            if stop.is_set():
                break
            if progress:
                _progress(len(rows), total, f"{protocol}, {level} in flight", out)
            senders = _Senders()
            if protocol == "http":
                send = _http_sender(server, model, inputs, senders)
                rows.append(
                    _measure(
                        send, level, seconds, protocol, senders, stop, server._http.close, timeout
                    )
                )
            else:
                assert server.grpc_target is not None
                token = server._token_for(ApiGroup.INFERENCE)
                send = _grpc_sender(server.grpc_target, token, model, inputs, senders)
                try:
                    rows.append(
                        _measure(send, level, seconds, protocol, senders, stop, None, timeout)
                    )
                finally:
                    senders.close()
    if progress:
        _progress(total, total, "done", out)
    return BenchmarkTable(model, rows)
