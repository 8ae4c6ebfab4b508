"""gRPC traces (app/servekit/observability/tracing.py): each call's server span, wrapped around a
method's behaviour at registration (app/servekit/grpc/request_ids.py's :func:`tagged` does it, and
only when tracing is on: off, no call passes through here).

The client's ``traceparent``/``tracestate`` metadata are the span's parent; the span's own
``traceparent`` goes back in the trailing metadata (beside ``x-request-id``), with the answer or
the error; a call the client cancels ends its span at once, an error with a ``client left``
event. The span is named ``package.Service/Method`` and carries ``rpc.*`` attributes, as
OpenTelemetry's RPC conventions name server spans. Health and reflection are not traced.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import grpc

from servekit.observability.request_ids import CURRENT, HEADER, RequestInfo, new_id
from servekit.observability.tracing import (
    TRACEPARENT,
    client_left,
    end_request,
    start_request,
    traceparent,
)

_UNTRACED = ("/grpc.health.", "/grpc.reflection.")
_CONTEXT_KEYS = ("traceparent", "tracestate", "baggage")


def traced(method: str) -> bool:
    """Whether calls of ``method`` get a span."""
    return not method.startswith(_UNTRACED)


def wrap(method: str, behaviour: Any, streaming: bool) -> Any:
    """``behaviour`` (an async function, or an async generator when ``streaming``) in a span."""
    name = method.lstrip("/")
    service, _, rpc = name.rpartition("/")
    if streaming:

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            span, _ = _begin(name, service, rpc, context)
            context.set_trailing_metadata(((TRACEPARENT, traceparent(span)),))
            error: BaseException | None = None
            try:
                async with aclosing(behaviour(request, context)) as replies:
                    async for reply in replies:
                        yield reply
            except BaseException as exc:
                error = exc
                raise
            finally:
                _end(span, context, error)

        return stream

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        span, info = _begin(name, service, rpc, context)
        context.set_trailing_metadata(((HEADER, info.id), (TRACEPARENT, traceparent(span))))
        error: BaseException | None = None
        try:
            return await behaviour(request, context)
        except BaseException as exc:
            error = exc
            raise
        finally:
            _end(span, context, error)

    return unary


def _begin(
    name: str, service: str, rpc: str, context: grpc.aio.ServicerContext
) -> tuple[Any, RequestInfo]:
    info = CURRENT.get()
    if info is None:  # the request-ID wrapper sets it first; never left without one
        info = RequestInfo(new_id(), False)
        CURRENT.set(info)
    carrier = {k: v for k, v in context.invocation_metadata() or () if k in _CONTEXT_KEYS}
    attributes: dict[str, Any] = {
        "rpc.system": "grpc",
        "rpc.service": service,
        "rpc.method": rpc,
    }
    return start_request(name, carrier, info, attributes), info


def _end(span: Any, context: grpc.aio.ServicerContext, error: BaseException | None) -> None:
    code = context.code()
    if code is None and isinstance(error, asyncio.CancelledError):
        # grpcio cancels a call's task when its client cancels or goes away (the context's
        # cancelled() still reads False then); a server stopping past its drain does too.
        span.set_attribute("rpc.grpc.status_code", grpc.StatusCode.CANCELLED.value[0])
        client_left(span)
        return
    if code is None:
        if error is None or isinstance(error, grpc.aio.AbortError):
            code = grpc.StatusCode.OK
        elif not isinstance(error, Exception):
            code = grpc.StatusCode.CANCELLED
        else:
            code = grpc.StatusCode.UNKNOWN
    number = code.value[0] if isinstance(code, grpc.StatusCode) else 2
    span.set_attribute("rpc.grpc.status_code", number)
    failed = code in _SERVER_FAULTS
    details = context.details() if failed else None
    end_request(span, failed, details if isinstance(details, str) else None)


_SERVER_FAULTS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)
"""The codes OpenTelemetry's RPC conventions mark a server span an error for."""
