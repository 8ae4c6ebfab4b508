"""OpenTelemetry traces: off unless the standard ``OTEL_*`` variables ask for them (a
foundation module; the extra ``servekit[otel]`` installs the SDK and the OTLP exporter).

Off (the default), :data:`TRACING` ``.on`` is False and this module imports nothing of
OpenTelemetry: every hook on the hot path is one attribute read and a branch
(``if TRACING.on:``), so a server without tracing pays nothing measurable
(bench/instructions.py). The gRPC wrapper is not even installed then.

On, each traced request has a server span (its parent the W3C ``traceparent`` the client sent,
its own ``traceparent`` returned on the answer) with these children:

* ``decode`` / ``encode``: the wire format to the request and the answer back (the HTTP and
  gRPC adapters time them and call :func:`phase`);
* ``queue``: the time a request waited in its model's queue (none for a call run at once);
* ``execute``: the model call, with ``servekit.model``, ``servekit.batch.requests`` (how many
  requests the call served), ``servekit.batch.rows`` and ``servekit.instance`` (the worker
  thread's index, or ``loop`` for a call run on the event loop). While it runs, it is the
  current span of OpenTelemetry's context: spans a Python model opens with the standard API
  (``trace.get_tracer(...).start_as_current_span(...)``) are its children.

The span that carries a request is kept on its :class:`~servekit.request_id.RequestInfo`
(``info.span``), which every layer already reaches through ``request_id.CURRENT`` (and a queued
job through ``Job.request``): no OpenTelemetry context travels with the request's task.

When it is on (:func:`wanted`): ``OTEL_SDK_DISABLED`` is not true, ``OTEL_TRACES_EXPORTER`` is
not ``none``, and either ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``, ``console``) or
an OTLP endpoint is set (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``).
The rest is the SDK's own reading of the standard variables (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``, ``OTEL_PROPAGATORS``,
``OTEL_EXPORTER_OTLP_*``).
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from servekit.request_id import CURRENT, RequestInfo

log = logging.getLogger("servekit.tracing")
T = TypeVar("T")

TRACEPARENT = "traceparent"
TRACEPARENT_BYTES = TRACEPARENT.encode()


class _Tracing:
    """Whether this process traces, and its tracer (set once by :func:`configure`)."""

    on: bool = False
    tracer: Any = None
    provider: Any = None


TRACING = _Tracing()


def wanted(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the standard variables ask for traces (see the module docstring). Off unless
    asked: the SDK's own default exporter (``otlp`` to localhost) would otherwise make every
    server try to send spans nobody collects."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters == "none":
        return False
    if exporters:
        return True
    return bool(
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def configure(env: Mapping[str, str] = os.environ) -> bool:
    """Turn tracing on for this process if :func:`wanted` (once; later calls keep it). A
    tracer provider the process already installed (a notebook's own OpenTelemetry set-up) is
    used as it is; else one is made with the exporters the variables name, a batch span
    processor each (spans leave in a background thread, never on the request's path), and
    made the global one, so that a Python model's spans go to the same place. Returns
    whether tracing is on. Without the extra it logs what to install and stays off."""
    if TRACING.on or not wanted(env):
        return TRACING.on
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "OTEL_* variables ask for traces but OpenTelemetry's SDK is not installed: "
            "pip install 'servekit[otel]'; tracing stays off"
        )
        return False
    from servekit.version import __version__

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # nobody set one up: ours
        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, read by the SDK, come first; what
        # they leave unsaid is servekit's: the name "servekit", the version.
        resource = Resource.create()
        ours: dict[str, str] = {}
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            ours["service.name"] = "servekit"
        if "service.version" not in resource.attributes:
            ours["service.version"] = __version__
        resource = resource.merge(Resource(ours))
        provider = TracerProvider(resource=resource)
        for exporter in _exporters(env):
            provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    TRACING.provider = provider
    TRACING.tracer = provider.get_tracer("servekit", __version__)
    TRACING.on = True
    log.info("tracing on: spans go to %s", _where(env))
    return True


def _exporters(env: Mapping[str, str]) -> list[Any]:
    """The span exporters ``OTEL_TRACES_EXPORTER`` names (default ``otlp``)."""
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    exporters: list[Any] = []
    for name in names:
        if name == "otlp":
            exporters.append(_otlp(env))
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter())
        elif name and name != "none":
            log.warning("OTEL_TRACES_EXPORTER names %r, which servekit does not know", name)
    return exporters


def _otlp(env: Mapping[str, str]) -> Any:
    """The OTLP exporter for ``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL``: ``grpc`` (the default of
    OpenTelemetry's Python SDK, and the one servekit[otel] installs: it rides on grpcio, which
    servekit already ships) or ``http/protobuf`` (when opentelemetry-exporter-otlp-proto-http
    is installed)."""
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    ) or "grpc"
    if protocol.strip().lower() == "http/protobuf":
        try:  # imported by name: not a dependency of servekit[otel] (see _otlp's docstring)
            http = importlib.import_module("opentelemetry.exporter.otlp.proto.http.trace_exporter")
        except ImportError:
            log.warning(
                "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf needs "
                "opentelemetry-exporter-otlp-proto-http; sending over gRPC instead"
            )
        else:
            return http.OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _where(env: Mapping[str, str]) -> str:
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    exporters = env.get("OTEL_TRACES_EXPORTER", "otlp")
    if endpoint:
        return f"{exporters} at {endpoint}"
    return exporters


def flush(timeout_ms: int = 5000) -> None:
    """Send the spans still buffered (at a server's stop: its last requests' spans)."""
    provider = TRACING.provider
    if TRACING.on and provider is not None:
        try:
            provider.force_flush(timeout_ms)
        except Exception:  # an exporter that cannot reach its collector: said, not raised
            log.warning("could not send the last spans", exc_info=True)


# -- request spans ------------------------------------------------------------------------------
def start_request(
    name: str, carrier: Mapping[str, str], info: RequestInfo, attributes: dict[str, Any]
) -> Any:
    """The server span of one request (its parent from the client's ``traceparent`` in
    ``carrier``), kept on ``info``; returns it."""
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    parent = propagate.extract(carrier)
    attributes["servekit.request_id"] = info.id
    span = TRACING.tracer.start_span(
        name, context=parent, kind=SpanKind.SERVER, attributes=attributes
    )
    info.span = span
    return span


def traceparent(span: Any) -> str:
    """The W3C ``traceparent`` that names ``span`` (what the answer carries back)."""
    context = span.get_span_context()
    flags = int(context.trace_flags)
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}"


def end_request(span: Any, failed: bool, message: str | None = None) -> None:
    """End a request's span, marked an error when the request failed."""
    if failed:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, message))
    span.end()


CLIENT_LEFT = "client left"


def client_left(span: Any) -> None:
    """End a request's span whose client went away before its answer (an HTTP connection
    lost, a gRPC call cancelled): an error, with a ``client left`` event, so that a trace
    shows where the request was when nobody waited for it any more."""
    from opentelemetry.trace import Status, StatusCode

    span.add_event(CLIENT_LEFT)
    span.set_status(Status(StatusCode.ERROR, f"{CLIENT_LEFT} before the answer"))
    span.end()


def now() -> int:
    """The clock phases are timed with (OpenTelemetry's: nanoseconds since the epoch)."""
    return time.time_ns()


def phase(name: str, started: int) -> None:
    """A finished child span ``name`` of the running request, from ``started`` (:func:`now`)
    to now: ``decode`` and ``encode`` (the adapters time them only when tracing is on)."""
    info = CURRENT.get()
    span = None if info is None else info.span
    if span is None:
        return
    from opentelemetry.trace import set_span_in_context

    child = TRACING.tracer.start_span(name, context=set_span_in_context(span), start_time=started)
    child.end()


def encoded(encode: Callable[..., T], *args: Any) -> T:
    """``encode(*args)`` timed as the running request's ``encode`` span."""
    started = time.time_ns()
    answer = encode(*args)
    phase("encode", started)
    return answer


class ModelCall:
    """The ``execute`` spans of one model call (one per traced request it serves), the first
    made the current span of OpenTelemetry's context while the model runs."""

    __slots__ = ("spans", "token")

    def __init__(self, spans: list[Any], token: Any) -> None:
        self.spans = spans
        self.token = token

    def end(self, error: BaseException | None) -> None:
        """The call returned (``error``: what it raised, if it did)."""
        from opentelemetry import context
        from opentelemetry.trace import Status, StatusCode

        if self.token is not None:
            context.detach(self.token)
        for span in self.spans:
            if error is not None:
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            span.end()


def call_started(
    requests: Iterable[tuple[RequestInfo | None, int | None]],
    rows: int,
    instance: int | None,
    model: str,
) -> ModelCall | None:
    """A model call starts now for ``requests`` (each with when it was queued,
    ``time.perf_counter_ns()``, or None if it never was): their ``queue`` spans end now, their
    ``execute`` spans begin. ``instance``: the worker thread's index, None on the event loop.
    None when no request of the call is traced."""
    from opentelemetry import context
    from opentelemetry.trace import set_span_in_context

    tracer = TRACING.tracer
    started = time.time_ns()
    offset = started - time.perf_counter_ns()  # perf_counter -> epoch
    served = list(requests)
    pairs = [(info.span, queued) for info, queued in served if info is not None and info.span]
    if not pairs:
        return None
    attributes = {
        "servekit.model": model,
        "servekit.batch.requests": len(served),
        "servekit.batch.rows": rows,
        "servekit.instance": "loop" if instance is None else str(instance),
    }
    spans = []
    for parent, queued in pairs:
        where = set_span_in_context(parent)
        if queued is not None:
            waited = tracer.start_span("queue", context=where, start_time=queued + offset)
            waited.end(end_time=started)
        spans.append(
            tracer.start_span("execute", context=where, start_time=started, attributes=attributes)
        )
    token = context.attach(set_span_in_context(spans[0]))
    return ModelCall(spans, token)
