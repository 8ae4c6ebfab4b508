"""gRPC request IDs and access-log lines: every method handler wrapped once, at registration
(app/servekit/grpc/undecodable.py's :class:`SafeRegistration` calls :func:`tagged`).

A call's ID is the client's ``x-request-id`` metadata when valid, else the V2 request's ``id``
(ModelInfer), else a new one; it is returned in the trailing metadata of a unary call (with
its answer or its error) and in the initial metadata of a streaming answer (before its first
message), and every log record the call writes carries it. Wrapped at registration rather than
with a server interceptor for the same reason as the token check (app/servekit/grpc/access.py):
grpcio runs interceptors in Python for every call. With the access log on, the wrapper also
times the call and writes one line when it ends: RPC, status code, bytes in and out (the
protobuf sizes), model, version, peer and ID.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import grpc

from servekit.grpc import traces
from servekit.observability.access import ACCESS, AccessLine, write_line
from servekit.observability.request_ids import CURRENT, HEADER, RequestInfo, accepted, new_id
from servekit.observability.tracing import TRACING


def tagged(method: str, handler: Any) -> Any:
    """``handler`` (a grpc.RpcMethodHandler) whose calls get their request ID (and, with the
    access log on, their line). Synchronous behaviours (none of ours) are left as they are."""
    kind = {
        (False, False): "unary_unary",
        (False, True): "unary_stream",
        (True, False): "stream_unary",
        (True, True): "stream_stream",
    }.get((handler.request_streaming, handler.response_streaming))
    behaviour = getattr(handler, kind) if kind else None
    if kind is None or behaviour is None:
        return handler
    if not (inspect.iscoroutinefunction(behaviour) or inspect.isasyncgenfunction(behaviour)):
        return handler
    if TRACING.on and traces.traced(method) and not _writes(handler, behaviour):
        behaviour = traces.wrap(method, behaviour, handler.response_streaming)
    logged = ACCESS.mode != "off"
    if handler.response_streaming and inspect.isasyncgenfunction(behaviour):
        wrapped = _streaming(method, behaviour, handler.request_streaming, logged)
    elif handler.response_streaming:  # a coroutine writing its answers (context.write)
        wrapped = _writing(method, behaviour, handler.request_streaming, logged)
    elif logged:
        wrapped = _unary_logged(method, behaviour, handler.request_streaming)
    else:
        wrapped = _unary(behaviour)
    return handler._replace(**{kind: wrapped})


def _writes(handler: Any, behaviour: Any) -> bool:
    """A streaming answer written with ``context.write`` (not traced: gRPC health's Watch)."""
    return bool(handler.response_streaming) and not inspect.isasyncgenfunction(behaviour)


def _info(context: grpc.aio.ServicerContext, request: Any) -> RequestInfo:
    """The call's request: the client's ID, else ModelInfer's ``id``, else a new one; and
    the client's peer (a client's share of sequence slots) and metadata (a header the
    services read: ``RequestInfo.sent_headers``)."""
    metadata = context.invocation_metadata() or ()
    info = _named(metadata, request)
    info.client = context.peer()
    info.over_grpc = True
    info.sent_headers = metadata
    return info


def _named(metadata: Any, request: Any) -> RequestInfo:
    for key, value in metadata:
        if key == HEADER:
            sent = accepted(value)
            if sent is not None:
                return RequestInfo(sent, True)
            break
    has_id = _HAS_ID.get(type(request))
    if has_id is None:
        has_id = _has_id(type(request))
    body_id = request.id if has_id else None
    if body_id and isinstance(body_id, str):
        valid = accepted(body_id)
        if valid is not None:
            return RequestInfo(valid, True)
    return RequestInfo(new_id(), False)


_HAS_ID: dict[type, bool] = {}
"""Whether a request type has an ``id`` field (ModelInfer's does; most do not)."""


def _has_id(kind: type) -> bool:
    """Whether messages of ``kind`` have an ``id`` field, from the protobuf descriptor: asking
    a message for a field it does not have raises inside upb (twice, with the class's own
    lookup), about 7,000 instructions, on every call of every other RPC. A stream's request
    iterator has none."""
    descriptor = getattr(kind, "DESCRIPTOR", None)
    fields = getattr(descriptor, "fields_by_name", None)
    has = fields is not None and "id" in fields
    if len(_HAS_ID) < 256:  # (message types are few)
        _HAS_ID[kind] = has
    return has


def _unary(behaviour: Any) -> Any:
    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        info = _info(context, request)
        context.set_trailing_metadata(((HEADER, info.id),))  # kept by abort(): errors carry it
        CURRENT.set(info)  # this call's own task
        return await behaviour(request, context)

    return unary


def _model_of(info: RequestInfo, request: Any) -> None:
    """The model and version a request names: ``model_name``/``model_version`` (ModelInfer
    and its kin), else ``name``/``version``. The second pair is read only when the first is
    not there: a missing attribute of a protobuf message costs an exception inside upb (two,
    with the class's own lookup), several times what a line costs otherwise."""
    if info.model is not None:
        return
    model = getattr(request, "model_name", None)
    if model:
        version = getattr(request, "model_version", None)
    else:
        model = getattr(request, "name", None)
        version = getattr(request, "version", None) if model else None
    if model and isinstance(model, str):
        info.model = model
        info.version = version if version and isinstance(version, str) else None


def _size(message: Any) -> int:
    try:
        size: int = message.ByteSize()
    except AttributeError:  # not a protobuf message (an undecodable request's marker)
        return 0
    return size


_OK = grpc.StatusCode.OK
_CANCELLED = grpc.StatusCode.CANCELLED


def _line(method: str, rpc: str, info: RequestInfo) -> AccessLine:
    """A call's access line, begun when the call starts (``method``: the RPC's path, ``rpc``
    its name): its byte counts grow as the call goes, :func:`_end` sets its status and
    duration."""
    # (positional: a class called with keywords builds a dict first; the client is the peer)
    return AccessLine("gRPC", rpc, method, "OK", 0.0, 0, 0, info.client, info)


def _end(
    line: AccessLine,
    context: grpc.aio.ServicerContext,
    started: float,
    error: BaseException | None,
) -> None:
    """Write the call's line: its status from the context, else from how the call ended."""
    code = context.code()
    if code is None or code is _OK:
        if code is None and error is not None and not isinstance(error, grpc.aio.AbortError):
            # the client left (the call's task cancelled), else the handler failed
            code = grpc.StatusCode.UNKNOWN if isinstance(error, Exception) else _CANCELLED
        else:
            code = _OK
    if code is not _OK:
        line.status = code.name if isinstance(code, grpc.StatusCode) else str(code)
    line.duration_s = time.monotonic() - started
    write_line(line)


async def _counted(requests: AsyncIterator[Any], line: AccessLine) -> Any:
    async for request in requests:
        line.bytes_in += _size(request)
        _model_of(line.info, request)
        yield request


def _unary_logged(method: str, behaviour: Any, request_streaming: bool) -> Any:
    """A unary answer with its access line."""
    rpc = method.rsplit("/", 1)[-1]
    if request_streaming:

        async def streamed(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            started = time.monotonic()
            info = _info(context, None)
            context.set_trailing_metadata(((HEADER, info.id),))
            CURRENT.set(info)
            line = _line(method, rpc, info)
            error: BaseException | None = None
            try:
                response = await behaviour(_counted(requests, line), context)
                line.bytes_out = _size(response)
                return response
            except BaseException as exc:
                error = exc
                raise
            finally:
                _end(line, context, started, error)

        return streamed

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        started = time.monotonic()
        info = _info(context, request)
        context.set_trailing_metadata(((HEADER, info.id),))
        CURRENT.set(info)
        line = _line(method, rpc, info)
        try:
            bytes_in = request.ByteSize()
        except AttributeError:  # an undecodable request's marker
            bytes_in = 0
        line.bytes_in = bytes_in
        model = getattr(request, "model_name", None)
        if model and type(model) is str:  # ModelInfer's: _model_of, inlined
            info.model = model
            version = getattr(request, "model_version", None)
            if version and type(version) is str:
                info.version = version
        else:
            _model_of(info, request)
        try:
            response = await behaviour(request, context)
        except BaseException as exc:
            _end(line, context, started, exc)
            raise
        try:
            bytes_out = response.ByteSize()
        except AttributeError:
            bytes_out = 0
        line.bytes_out = bytes_out
        _end(line, context, started, None)
        return response

    return unary


def _stream_begins(
    method: str,
    context: grpc.aio.ServicerContext,
    request: Any,
    request_streaming: bool,
    logged: bool,
) -> tuple[float, RequestInfo, AccessLine, Any]:
    """A streaming call's start: its clock, its request (made :data:`CURRENT`), its access line
    (bytes in counted as the request stream is read, when logged) and the request to hand on
    (the counting stream, or the message)."""
    started = time.monotonic()
    info = _info(context, None if request_streaming else request)
    CURRENT.set(info)
    line = _line(method, method.rsplit("/", 1)[-1], info)  # (a stream: once per stream)
    if request_streaming and logged:
        request = _counted(request, line)
    elif logged:
        line.bytes_in = _size(request)
    return started, info, line, request


def _streaming(method: str, behaviour: Any, request_streaming: bool, logged: bool) -> Any:
    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        started, info, line, request = _stream_begins(
            method, context, request, request_streaming, logged
        )
        if logged and not request_streaming:
            _model_of(info, request)
        error: BaseException | None = None
        try:
            await context.send_initial_metadata(((HEADER, info.id),))
            async with aclosing(behaviour(request, context)) as replies:  # closed if cancelled
                async for reply in replies:
                    if logged:
                        line.bytes_out += _size(reply)
                    yield reply
        except BaseException as exc:
            error = exc
            raise
        finally:
            if logged:
                _end(line, context, started, error)

    return stream


def _writing(method: str, behaviour: Any, request_streaming: bool, logged: bool) -> Any:
    """A streaming answer written with ``context.write`` (gRPC health's Watch): the ID goes
    in the initial metadata first; bytes out are not counted (the writes are not seen)."""

    async def writer(request: Any, context: grpc.aio.ServicerContext) -> Any:
        started, info, line, request = _stream_begins(
            method, context, request, request_streaming, logged
        )
        error: BaseException | None = None
        try:
            await context.send_initial_metadata(((HEADER, info.id),))
            return await behaviour(request, context)
        except BaseException as exc:
            error = exc
            raise
        finally:
            if logged:
                _end(line, context, started, error)

    return writer
