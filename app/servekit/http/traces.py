"""HTTP traces (app/servekit/observability/tracing.py): the request's server span, begun at the
edge with the request ID (app/servekit/http/request_ids.py calls :func:`begin` only when tracing
is on).

The client's ``traceparent``/``tracestate`` are its parent; the span's own ``traceparent`` is one
more header of the answer (every answer: routes, errors, streams); the span ends with the response's
last body write, or when the client leaves first (an error, ``client left``: the edge calls the
scope's :data:`LEFT`), named by the route's template (``POST /v2/models/{model}/infer``) as
OpenTelemetry's HTTP conventions name server spans. Health probes and ``/metrics`` are not traced:
scraped every few seconds, they would drown the requests worth reading."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from servekit.observability.request_ids import RequestInfo
from servekit.observability.tracing import (
    TRACEPARENT_BYTES,
    client_left,
    end_request,
    start_request,
    traceparent,
)

Message = dict[str, Any]

_UNTRACED = ("/v2/health/", "/metrics", "/v1/models/health")
LEFT = "servekit.trace_left"
"""Scope key of a traced request's ``finish(left)``: the edge calls ``finish(True)`` when the
connection is lost before the answer's last write
(app/servekit/http/connection.py ``connection_lost``),
so a request whose client left still ends its span, marked so, and is exported."""
_CONTEXT_HEADERS = (b"traceparent", b"tracestate", b"baggage")


def begin(cycle: Any, info: RequestInfo) -> None:
    """Start the span of uvicorn's ``cycle`` and put its ``traceparent`` on the answer."""
    scope = cycle.scope
    path: str = scope.get("path", "")
    if path.startswith(_UNTRACED):
        return
    carrier = {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in scope["headers"]
        if name in _CONTEXT_HEADERS
    }
    method: str = scope.get("method", "GET")
    client = scope.get("client")
    attributes: dict[str, Any] = {"http.request.method": method, "url.path": path}
    if client:
        attributes["client.address"] = client[0]
    span = start_request(method, carrier, info, attributes)
    headers = cycle.default_headers  # the request ID's entry stays last (RequestInfo.adopt)
    headers.insert(len(headers) - 1, (TRACEPARENT_BYTES, traceparent(span).encode()))
    send: Callable[[Message], Awaitable[None]] = cycle.send
    status = [0]
    ended = [False]

    def finish(left: bool) -> None:
        """End the span once: at the answer's last write, or when the client leaves first."""
        if ended[0]:
            return
        ended[0] = True
        template = scope.get("path_template") or _template(scope)
        if template:
            span.update_name(f"{method} {template}")
            span.set_attribute("http.route", template)
        if left:
            client_left(span)
            return
        span.set_attribute("http.response.status_code", status[0])
        end_request(span, status[0] >= 500)

    async def traced_send(message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            status[0] = int(message["status"])
        elif kind == "http.response.body" and not message.get("more_body", False):
            try:
                await send(message)
            finally:
                finish(False)
            return
        await send(message)

    cycle.send = traced_send
    scope[LEFT] = finish


def _template(scope: Any) -> str | None:
    """The route's template from the path and its parameters (``/v2/models/{model}/infer``),
    when the router left none in the scope (the inference fast path answers before it would)."""
    params = scope.get("path_params")
    if not params:
        return None
    parts = str(scope.get("path", "")).split("/")
    names = {str(value): name for name, value in params.items()}
    return "/".join(f"{{{names[part]}}}" if part in names else part for part in parts)
