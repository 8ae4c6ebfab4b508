"""Core error codes -> gRPC status codes: the one table every gRPC handler goes through.

The core raises :class:`servekit.errors.ServeError` with a transport-neutral code; this module is
the only place that knows which gRPC status each code becomes (tests/test_error_table_grpc.py checks
the table covers every code). Unexpected exceptions become INTERNAL, so a client never sees
gRPC's bare UNKNOWN; their text stays in the log, the client gets a reference to it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from servekit.errors import ErrorCode, ServeError, internal_error

log = logging.getLogger("servekit.grpc")

GRPC_STATUS: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorCode.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.UNIMPLEMENTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorCode.OVERLOADED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status and message an exception raised by a handler becomes."""
    if isinstance(exc, ServeError):
        return GRPC_STATUS[exc.code], exc.message
    return grpc.StatusCode.INTERNAL, internal_error(log, exc, "a gRPC handler")


Request = TypeVar("Request")
Response = TypeVar("Response")
Handler = Callable[[Any, Request, grpc.aio.ServicerContext], Awaitable[Response]]


def guarded(handler: Handler[Request, Response]) -> Handler[Request, Response]:
    """Wrap a unary servicer method so that errors end the call with the mapped status."""

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Request, context: grpc.aio.ServicerContext) -> Response:
        try:
            return await handler(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            code, message = status_of(exc)
        await context.abort(code, message)
        raise AssertionError("unreachable: context.abort raises")  # pragma: no cover

    return wrapper
