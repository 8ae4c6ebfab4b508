"""grps HTTP routes (seed 001): ``/grps/v1/{health,infer,metadata}/...`` over the one DataPlane.

Bodies are the JSON form of ``GrpsMessage`` (:mod:`servekit.codecs.grps_json`: protobuf's JSON
mapping with grps' conventions), or ``application/octet-stream`` for ``bin_data``, both ways.
Query parameters: ``model=name-version`` (the body's ``model`` wins) and ``return-ndarray=true``
(answer the single output as a nested list).

Failures answer a ``GrpsMessage`` whose status is FAILURE with the HTTP status of the one error
table (400, 404, 503, ...), so grps clients always get a message they can parse.

Streaming is asked for as ``server.grpsStreaming`` says (grps' ``streaming_ctrl``): by default
``?streaming=true``; or a header; or a top-level JSON boolean in the body beside the GrpsMessage
fields, taken out before the message is parsed. A streamed answer uses chunked transfer encoding
with the configured Content-Type (default application/octet-stream): each message is one chunk
(JSON and a newline, or the raw bytes of bin_data): one for most models, one per result of a
decoupled model (a Python predict that yields). A failure before the first message answers as
above, so the status code says what went wrong; a failure after it is the stream's last chunk,
a FAILURE message in JSON.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any, cast

from litestar import HttpMethod, Request, Response, route
from litestar.exceptions import HTTPException
from litestar.response import Stream

from servekit.codecs import grps_json, grps_reply
from servekit.config.auth import ApiGroup
from servekit.config.schema import GrpsStreaming
from servekit.errors import HTTP_STATUS, InvalidArgument, ServeError, internal_error
from servekit.http import compression
from servekit.http.bodies import read_body
from servekit.http.client_left import ClientLeft, unless_client_leaves
from servekit.protos import grps_pb2 as pb
from servekit.rest.access import cross_site_guard, group_opt
from servekit.rest.inject import Catalog, Dataplane
from servekit.rest.openapi import (
    GRPS_MODEL_REQUEST,
    GRPS_REQUEST,
    INFERENCE_FAILURES,
    ErrorBody,
    GrpsFailure,
    GrpsMessage,
    failures,
    with_media,
)
from servekit.services import grps_calls
from servekit.types import InferResponse

log = logging.getLogger("servekit.grps")
JSON = "application/json"
OCTETS = "application/octet-stream"
ENCODING = "content-encoding"
BOTH = [HttpMethod.GET, HttpMethod.POST]
AnyRequest = Request[Any, Any, Any]
Answer = Response[GrpsMessage]
"""Every grps answer: a GrpsMessage as JSON (bin_data answers: the raw bytes)."""


def _json(message: pb.GrpsMessage, extra: dict[str, Any] | None = None) -> Answer:
    code = message.status.code or 200
    answer = Response(grps_json.dumps(message, extra), status_code=code, media_type=JSON)
    return cast("Answer", answer)  # the JSON of a GrpsMessage: what the document shows


def _failure(exc: Exception) -> Answer:
    if isinstance(exc, ServeError):
        code, msg = HTTP_STATUS[exc.code], exc.message
    elif isinstance(exc, HTTPException):  # e.g. a body over server.maxRequestBytes
        code, msg = exc.status_code, str(exc.detail)
    else:
        code, msg = 500, internal_error(log, exc, "a grps handler")
    return _json(pb.GrpsMessage(status=grps_reply.status(code, msg)))


async def _read(
    request: AnyRequest, json_limit: int, control: GrpsStreaming | None = None
) -> tuple[pb.GrpsMessage, object, bool]:
    """The request's GrpsMessage, its ndarray (None if absent) and, for a predict request
    (``control`` given), whether it asks for a streamed answer. A JSON body is bounded by
    ``json_limit`` (server.maxJsonRequestBytes, as V2 JSON), a bin_data body by
    server.maxRequestBytes."""
    streaming = False  # no control, or body_param with an octet-stream body (no field to read)
    if control is not None and control.ctrl_mode == "query_param":
        streaming = _flag(request.query_params.get(control.ctrl_key))
    elif control is not None and control.ctrl_mode == "header_param":
        streaming = _flag(request.headers.get(control.ctrl_key))
    octets = request.content_type[0].lower() == OCTETS
    encoding = request.headers.get(ENCODING)
    body = await read_body(request.scope, request.receive, None if octets else json_limit, encoding)
    if octets:
        return pb.GrpsMessage(bin_data=bytes(body)), None, streaming
    if body and not body.strip():  # nothing is {}, but blanks are not JSON
        raise InvalidArgument("the body is blank: send a JSON object (a GrpsMessage) or nothing")
    obj = grps_json.parse_object(bytes(body))
    if control is not None and control.ctrl_mode == "body_param":
        value = obj.pop(control.ctrl_key, False)
        if not isinstance(value, bool):
            raise InvalidArgument(
                f"'{control.ctrl_key}' must be a JSON boolean (true or false), got {value!r:.40}"
            )
        streaming = value
    message, ndarray = grps_json.from_object(obj)
    return message, ndarray, streaming


def grps_failures(group: ApiGroup, *statuses: int) -> dict[int, Any]:
    """:func:`~servekit.rest.openapi.failures` as grps answers them: a GrpsMessage with the status,
    except the token and cross-site refusals (guards, before the handler) and the edge's 503,
    which are ``{"error": ...}``."""
    shapes: dict[str, Any] = {
        f"s{code}": GrpsFailure for code in statuses if code not in (401, 403)
    }
    return failures(group, *statuses, s503=GrpsFailure | ErrorBody, **shapes)


def _flag(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")


# -- health -------------------------------------------------------------------------------------
@route(
    "/grps/v1/health/online",
    opt=group_opt(ApiGroup.ADMIN),
    guards=[cross_site_guard],
    http_method=BOTH,
    status_code=200,
    sync_to_thread=False,
    responses=grps_failures(ApiGroup.ADMIN, 403),
)
def online(dataplane: Dataplane) -> Answer:
    dataplane.set_online(True)
    return _json(grps_reply.ok())


@route(
    "/grps/v1/health/offline",
    opt=group_opt(ApiGroup.ADMIN),
    guards=[cross_site_guard],
    http_method=BOTH,
    status_code=200,
    sync_to_thread=False,
    responses=grps_failures(ApiGroup.ADMIN, 403),
)
def offline(dataplane: Dataplane) -> Answer:
    dataplane.set_online(False)
    return _json(grps_reply.ok())


@route(
    "/grps/v1/health/live",
    opt=group_opt(ApiGroup.OPEN),
    http_method=BOTH,
    status_code=200,
    sync_to_thread=False,
    responses=grps_failures(ApiGroup.OPEN),
)
def live() -> Answer:
    return _json(grps_reply.ok())


@route(
    "/grps/v1/health/ready",
    opt=group_opt(ApiGroup.OPEN),
    http_method=BOTH,
    status_code=200,
    sync_to_thread=False,
    responses=grps_failures(ApiGroup.OPEN),
)
def ready(dataplane: Dataplane) -> Answer:
    return _json(grps_calls.readiness(dataplane))


# -- inference ----------------------------------------------------------------------------------
@route(
    "/grps/v1/infer/predict",
    opt=group_opt(ApiGroup.INFERENCE),
    http_method=[HttpMethod.POST],
    status_code=200,
    responses=grps_failures(ApiGroup.INFERENCE, *INFERENCE_FAILURES),
    operation_class=with_media(body=GRPS_REQUEST, binary_answer=True),
)
async def predict(request: AnyRequest, dataplane: Dataplane) -> Answer:
    arrived = time.monotonic()  # before the body: see DataPlane.infer
    query = request.query_params
    control = dataplane.grps_streaming()
    ndarray_out = _flag(query.get("return-ndarray"))
    try:
        limit = dataplane.plan.server.max_json_request_bytes
        message, ndarray, streaming = await _read(request, limit, control)
        model = query.get("model") or ""
        if streaming:
            return await _stream(
                request, dataplane, message, ndarray, model, control, ndarray_out, arrived
            )
        waited = grps_calls.predict(
            dataplane, message, query_model=model, ndarray=ndarray, arrived=arrived
        )
        kind, response = await unless_client_leaves(request.scope, waited)  # dropped if it left
        reply = cast("Response[bytes]", _answer(response, kind, ndarray_out))
        compressed = await compression.compressed(request.headers.get("accept-encoding"), reply)
        return cast("Answer", compressed)
    except ClientLeft:
        raise  # nobody to answer (app/servekit/rest/errors.py)
    except Exception as exc:
        return _failure(exc)


def _answer(response: InferResponse, kind: str, ndarray_out: bool) -> Answer:
    """One response as grps answers it: JSON, bytes for bin_data, or ``ndarray``."""
    if ndarray_out:
        array = grps_reply.ndarray_output(response)
        return _json(
            grps_reply.ok(model=f"{response.model_name}-{response.model_version}"),
            {"ndarray": array},
        )
    answer = grps_reply.encode_response(response, kind)
    if answer.WhichOneof("data_oneof") == "bin_data":
        return cast("Answer", Response(answer.bin_data, media_type=OCTETS))
    return _json(answer)


def _chunk(reply: Answer) -> bytes:
    """A streamed message: raw bytes for bin_data, else its JSON and a newline."""
    content = cast("bytes", reply.content)  # the typing of Answer is the document's
    return content if reply.media_type == OCTETS else content + b"\n"


async def _stream(
    request: AnyRequest,
    dataplane: Dataplane,
    message: pb.GrpsMessage,
    ndarray: object,
    query_model: str,
    control: GrpsStreaming,
    ndarray_out: bool,
    arrived: float,
) -> Answer:
    """A streamed answer: one chunk per response (a decoupled model yields several). The first
    response is awaited before the status line, so a request that fails before the model
    answers gets the failure status; a later failure is a last chunk, a FAILURE message. A
    client that leaves before the first response drops the request (queued, it never runs);
    after it, Litestar's Stream sees the disconnect and closes the responses."""
    kind, responses = grps_calls.start_stream(
        dataplane, message, query_model=query_model, ndarray=ndarray, arrived=arrived
    )
    try:
        first = await unless_client_leaves(request.scope, anext(responses))
        chunk = _chunk(_answer(first, kind, ndarray_out))
    except BaseException:
        await responses.aclose()
        raise
    # As a header, not media_type: Litestar appends "; charset=utf-8" to any text/* media type,
    # even one that already names its charset; the configured value is sent as written.
    content_type = {"Content-Type": control.res_content_type}
    chunks = _chunks(chunk, responses, kind, ndarray_out)
    return cast("Answer", Stream(chunks, media_type=control.res_content_type, headers=content_type))


async def _chunks(
    first: bytes, responses: AsyncGenerator[InferResponse, None], kind: str, ndarray_out: bool
) -> AsyncIterator[bytes]:
    async with aclosing(responses):  # a client that leaves stops the model
        yield first
        try:
            async for response in responses:
                yield _chunk(_answer(response, kind, ndarray_out))
        except Exception as exc:  # the status line is gone: the failure is the last chunk
            yield _chunk(_failure(exc))


# -- metadata -----------------------------------------------------------------------------------
@route(
    "/grps/v1/metadata/server",
    opt=group_opt(ApiGroup.METADATA),
    http_method=BOTH,
    status_code=200,
    sync_to_thread=False,
    responses=grps_failures(ApiGroup.METADATA),
)
def server_metadata(dataplane: Dataplane, catalog: Catalog) -> Answer:
    return _json(grps_reply.ok(str_data=grps_calls.server_metadata(dataplane, catalog)))


@route(
    "/grps/v1/metadata/model",
    opt=group_opt(ApiGroup.METADATA),
    http_method=BOTH,
    status_code=200,
    responses=grps_failures(ApiGroup.METADATA, 400, 404, 413),
    operation_class=with_media(body=GRPS_MODEL_REQUEST, body_required=False),
)
async def model_metadata(request: AnyRequest, dataplane: Dataplane) -> Answer:
    """The request's str_data names the model (else its model field, ?model=, the default)."""
    try:
        message, _, _ = await _read(request, dataplane.plan.server.max_json_request_bytes)
        selector = message.str_data or message.model or request.query_params.get("model") or ""
        text = grps_calls.model_metadata(dataplane, selector)
    except Exception as exc:
        return _failure(exc)
    return _json(grps_reply.ok(str_data=text))


ROUTES = [online, offline, live, ready, predict, server_metadata, model_metadata]
"""grps adds no V2 protocol extension to server metadata."""
