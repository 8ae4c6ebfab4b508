"""Undecodable protobuf is the client's mistake: INVALID_ARGUMENT and one WARNING, not UNKNOWN.

grpc.aio decodes a request with the method's ``request_deserializer`` before any handler (or
interceptor) runs; when that raises, grpcio answers bare UNKNOWN and logs an ERROR with a
traceback, per call, so garbage bytes become a log flood the client cannot even read. Every
method handler is therefore wrapped once, at registration (:class:`SafeRegistration` stands in
for the server while services register): its deserializer returns an :class:`Undecodable`
marker instead of raising, and its behaviour answers INVALID_ARGUMENT when handed one (for
streamed requests, when the stream yields one). Warnings are rate-limited (:class:`Throttle`).
Only asynchronous behaviours are wrapped (all of ours, health and reflection are). Each is
also given its request ID there (app/servekit/grpc/request_ids.py).
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from servekit.grpc import request_ids

log = logging.getLogger("servekit.grpc")

WARN_EVERY_SECONDS = 10.0


class Throttle:
    """At most one log line per ``every`` seconds; the next one says how many were skipped."""

    def __init__(self, every: float = WARN_EVERY_SECONDS) -> None:
        self.every = every
        self._next = 0.0
        self._skipped = 0

    def warn(self, message: str, *args: object) -> bool:
        now = time.monotonic()
        if now < self._next:
            self._skipped += 1
            return False
        skipped, self._skipped = self._skipped, 0
        self._next = now + self.every
        suffix = f" ({skipped} more since the last such warning)" if skipped else ""
        log.warning(message + suffix, *args)
        return True


THROTTLE = Throttle()


class Undecodable:
    """What a wrapped deserializer returns for bytes that are not the method's message."""

    def __init__(self, method: str, error: Exception) -> None:
        self.method = method
        self.error = error


def _message(item: Undecodable) -> str:
    return f"the request is not a valid {item.method} message (undecodable protobuf)"


async def _refuse(item: Undecodable, context: grpc.aio.ServicerContext) -> None:
    THROTTLE.warn(
        "gRPC %s: undecodable request from %s (%s)",
        item.method,
        context.peer(),
        type(item.error).__name__,
    )
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _message(item))


def safe_handler(method: str, handler: Any) -> Any:
    """``handler`` (a grpc.RpcMethodHandler) whose undecodable requests are refused cleanly."""
    decode = handler.request_deserializer
    kind = _kind(handler)
    behaviour = getattr(handler, kind) if kind else None
    async_behaviour = behaviour is not None and (
        inspect.iscoroutinefunction(behaviour) or inspect.isasyncgenfunction(behaviour)
    )
    if decode is None or kind is None or not async_behaviour:
        return handler
    short = method.rsplit("/", 1)[-1]

    def deserializer(data: bytes) -> Any:
        try:
            return decode(data)
        except Exception as exc:
            return Undecodable(short, exc)

    wrap = _stream_request if handler.request_streaming else _unary_request
    replaced: dict[str, Any] = {"request_deserializer": deserializer, kind: wrap(behaviour)}
    return handler._replace(**replaced)


def _kind(handler: Any) -> str | None:
    streaming = (handler.request_streaming, handler.response_streaming)
    return {
        (False, False): "unary_unary",
        (False, True): "unary_stream",
        (True, False): "stream_unary",
        (True, True): "stream_stream",
    }.get(streaming)


def _unary_request(behaviour: Any) -> Any:
    if inspect.isasyncgenfunction(behaviour):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                await _refuse(request, context)
            async for reply in behaviour(request, context):
                yield reply

        return stream

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            await _refuse(request, context)
        return await behaviour(request, context)

    return unary


def _stream_request(behaviour: Any) -> Any:
    async def checked(
        requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        async for request in requests:
            if isinstance(request, Undecodable):
                await _refuse(request, context)
            yield request

    if inspect.isasyncgenfunction(behaviour):

        async def stream(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for reply in behaviour(checked(requests, context), context):
                yield reply

        return stream

    async def unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        return await behaviour(checked(requests, context), context)

    return unary


class _SafeGeneric(grpc.GenericRpcHandler):  # type: ignore[misc]
    """A generic handler whose method handlers are made safe as they are looked up."""

    def __init__(self, inner: grpc.GenericRpcHandler) -> None:
        self._inner = inner
        self._cache: dict[str, Any] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        method: str = handler_call_details.method
        if method not in self._cache:
            found = self._inner.service(handler_call_details)
            if found is None:
                return None
            self._cache[method] = request_ids.tagged(method, safe_handler(method, found))
        return self._cache[method]


class SafeRegistration(grpc.aio.Server):  # type: ignore[misc]
    """Stands in for the server while services register; wraps every handler on the way."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Sequence[Any]) -> None:
        self._server.add_generic_rpc_handlers([_SafeGeneric(h) for h in handlers])

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        safe = {
            name: request_ids.tagged(f"/{service}/{name}", safe_handler(f"/{service}/{name}", h))
            for name, h in handlers.items()
        }
        self._server.add_registered_method_handlers(service, safe)

    # The rest of grpc.aio.Server's interface, passed through (registration needs none of it).
    def add_insecure_port(self, address: str) -> int:
        port: int = self._server.add_insecure_port(address)
        return port

    def add_secure_port(self, address: str, server_credentials: Any) -> int:
        port: int = self._server.add_secure_port(address, server_credentials)
        return port

    async def start(self) -> None:
        await self._server.start()

    async def stop(self, grace: float | None) -> None:
        await self._server.stop(grace)

    async def wait_for_termination(self, timeout: float | None = None) -> bool:
        done: bool = await self._server.wait_for_termination(timeout)
        return done
