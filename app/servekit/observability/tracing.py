"""OpenTelemetry traces: off unless the standard ``OTEL_*`` variables or serve.yaml's
``server.tracing`` ask for them (a foundation module; the extra ``servekit[otel]`` installs the
SDK and the OTLP exporter). Where both set the same thing, the variable wins.

Off (the default), :data:`TRACING` ``.on`` is False and this module imports nothing of
OpenTelemetry: every hook on the hot path is one attribute read and a branch
(``if TRACING.on:``), so a server without tracing pays nothing measurable
(bench/instructions.py). The gRPC wrapper is not even installed then.

On, each traced request has a server span (its parent the W3C ``traceparent`` the client sent,
its own ``traceparent`` returned on the answer) with these children:

* ``decode`` / ``encode``: the wire format to the request and the answer back (the HTTP and
  gRPC adapters time them and call :func:`phase`; a ModelStreamInfer call has a pair per
  request of its stream, under the call's span);
* ``queue``: the time a request waited in its model's queue (none for a call run at once);
* ``execute``: the model call, with ``servekit.model``, ``servekit.batch.requests`` (how many
  requests the call served), ``servekit.batch.rows`` and ``servekit.instance`` (the worker
  thread's index, or ``loop`` for a call run on the event loop). While it runs, it is the
  current span of OpenTelemetry's context: spans a Python model opens with the standard API
  (``trace.get_tracer(...).start_as_current_span(...)``) are its children.

The span that carries a request is kept on its
:class:`~servekit.observability.request_ids.RequestInfo` (``info.span``), which every layer
already reaches through ``request_ids.CURRENT`` (and a queued job through ``Job.request``): no
OpenTelemetry context travels with the request's task.

A request whose client leaves before its answer (an HTTP connection lost, a gRPC call
cancelled) ends its span at once, an error with a ``client left`` event (:func:`client_left`).

When it is on (:func:`wanted`): ``OTEL_SDK_DISABLED`` is not true, ``OTEL_TRACES_EXPORTER`` is not
``none``, and either ``server.tracing.enabled`` is true, ``OTEL_TRACES_EXPORTER`` names an exporter
(``otlp``, ``console``) or an OTLP endpoint is set (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_ENDPOINT``). The rest is the SDK's own reading of the standard variables
(``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``,
``OTEL_PROPAGATORS``, ``OTEL_EXPORTER_OTLP_*``)."""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from servekit.observability.request_ids import CURRENT, RequestInfo
from servekit.shown_paths import shown_uri

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


@dataclass(frozen=True)
class Settings:
    """serve.yaml's ``server.tracing`` as plain values (the composition converts it: this
    foundation module does not import the config layer). Each is a default the matching
    ``OTEL_*`` variable overrides. ``headers`` never appears in a ``repr``: it may hold a
    collector's API key."""

    enabled: bool = False
    endpoint: str | None = None
    protocol: str = "grpc"
    sample_ratio: float = 1.0
    service_name: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)


NO_SETTINGS = Settings()


def wanted(env: Mapping[str, str] = os.environ, settings: Settings = NO_SETTINGS) -> bool:
    """Whether the standard variables or ``server.tracing.enabled`` ask for traces (see the
    module docstring). Off unless asked: the SDK's own default exporter (``otlp`` to
    localhost) would otherwise make every server try to send spans nobody collects. The
    variables that turn tracing off win over serve.yaml."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters == "none":
        return False
    if exporters or settings.enabled:
        return True
    return bool(
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def configure(env: Mapping[str, str] = os.environ, settings: Settings = NO_SETTINGS) -> bool:
    """Turn tracing on for this process if :func:`wanted` (once; later calls keep it), with
    ``settings`` (``server.tracing``) where no ``OTEL_*`` variable says otherwise. A
    tracer provider the process already installed (a notebook's own OpenTelemetry set-up) is
    used as it is; else one is made with the exporters the variables name, a batch span
    processor each (spans leave in a background thread, never on the request's path), and
    made the global one, so that a Python model's spans go to the same place. Returns
    whether tracing is on. Without the extra it logs what to install and stays off."""
    if TRACING.on or not wanted(env, settings):
        return TRACING.on
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError:
        log.warning(
            "traces are asked for but OpenTelemetry's SDK is not installed: "
            "pip install 'servekit[otel]'; tracing stays off"
        )
        return False
    from servekit.version import __version__

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # nobody set one up: ours
        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, read by the SDK, come first; what
        # they leave unsaid is serve.yaml's, then servekit's: the name "servekit", the version.
        resource = Resource.create()
        ours: dict[str, str] = {}
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            ours["service.name"] = settings.service_name or "servekit"
        if "service.version" not in resource.attributes:
            ours["service.version"] = __version__
        resource = resource.merge(Resource(ours))
        sampler = None  # the SDK's: OTEL_TRACES_SAMPLER, else parent-based, every root kept
        if not env.get("OTEL_TRACES_SAMPLER") and settings.sample_ratio < 1.0:
            sampler = ParentBased(TraceIdRatioBased(settings.sample_ratio))
        provider = TracerProvider(resource=resource, sampler=sampler)
        for exporter in _exporters(env, settings):
            provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    TRACING.provider = provider
    TRACING.tracer = provider.get_tracer("servekit", __version__)
    TRACING.on = True
    log.info("tracing on: spans go to %s", _where(env, settings))
    return True


def _exporters(env: Mapping[str, str], settings: Settings) -> list[Any]:
    """The span exporters ``OTEL_TRACES_EXPORTER`` names (default ``otlp``)."""
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    exporters: list[Any] = []
    for name in names:
        if name == "otlp":
            exporters.append(_otlp(env, settings))
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter())
        elif name and name != "none":
            log.warning("OTEL_TRACES_EXPORTER names %r, which servekit does not know", name)
    return exporters


def _otlp(env: Mapping[str, str], settings: Settings) -> Any:
    """The OTLP exporter for ``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL``: ``grpc`` (the default of
    OpenTelemetry's Python SDK, and the one servekit[otel] installs: it rides on grpcio, which
    servekit already ships) or ``http/protobuf`` (when opentelemetry-exporter-otlp-proto-http
    is installed). serve.yaml's endpoint and headers are given to the exporter only where no
    variable sets them (the exporter reads the variables itself)."""
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    ) or settings.protocol
    http_protocol = protocol.strip().lower() == "http/protobuf"
    options: dict[str, Any] = {}
    if settings.endpoint and not _endpoint_variable(env):
        endpoint = settings.endpoint
        if http_protocol:  # the variable's rule: the base address, the signal's path appended
            endpoint = endpoint.rstrip("/") + "/v1/traces"
        options["endpoint"] = endpoint
    if settings.headers and not (
        env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or env.get("OTEL_EXPORTER_OTLP_HEADERS")
    ):
        options["headers"] = dict(settings.headers)
    if http_protocol:
        try:  # imported by name: not a dependency of servekit[otel] (see _otlp's docstring)
            http = importlib.import_module("opentelemetry.exporter.otlp.proto.http.trace_exporter")
        except ImportError:
            log.warning(
                "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf needs "
                "opentelemetry-exporter-otlp-proto-http; sending over gRPC instead"
            )
        else:
            return http.OTLPSpanExporter(**options)
        if "endpoint" in options and settings.endpoint:  # over gRPC: the base address
            options["endpoint"] = settings.endpoint
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(**options)


def _endpoint_variable(env: Mapping[str, str]) -> str | None:
    return env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")


def _where(env: Mapping[str, str], settings: Settings = NO_SETTINGS) -> str:
    """Where spans go, for the start-up line (never the headers, nor the endpoint's user info
    or query)."""
    endpoint = _endpoint_variable(env) or settings.endpoint
    exporters = env.get("OTEL_TRACES_EXPORTER", "otlp")
    if endpoint:
        return f"{exporters} at {shown_uri(endpoint)}"
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
