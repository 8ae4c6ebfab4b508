"""The V2 inference routes: the server's hot path, answered by a bare ASGI app.

Litestar declares the two routes, and keeps doing everything around them: routing and path
parameters, the OpenAPI document, 405 and OPTIONS, and the exception handlers that turn errors
into ``{"error": ...}`` with the right status. The request itself is answered by
:func:`serve_infer`, installed as the routes' handler-level middleware: it runs before
Litestar builds a ``Request``, resolves handler arguments, opens the dependency exit stack and
turns a return value into a response. For a tiny model, with the server on one core, that
framework work plus ``Request.body()`` was about 30 us of the ~110 us one request cost
(docs/performance.md); the body is read here instead, under the same ``request_max_body_size``
rules. The handler functions are never called: their signatures are what the OpenAPI
document shows (the body Litestar would read, the answer it would send).

(A Litestar ``@asgi`` route would be the obvious tool, but Litestar 2.x fails to route an
``@asgi`` handler with path parameters for any HTTP method, and drops it from OpenAPI.)
"""

from __future__ import annotations

import math
import time
from asyncio import CancelledError, current_task
from dataclasses import dataclass
from typing import Any, cast

from litestar import post
from litestar.exceptions import InternalServerException
from litestar.handlers import HTTPRouteHandler
from litestar.params import JSONBody
from litestar.types import (
    ASGIApp,
    Receive,
    Scope,
    Send,
)

from servekit.codecs import v2_binary, v2_json
from servekit.config.auth import AccessPolicy, ApiGroup
from servekit.http import compression, large, taskless
from servekit.http.bodies import announced_length, read, read_chunks, too_large
from servekit.http.client_left import TASKLESS, WAITING, ClientLeft, client_left
from servekit.http.inference_lane import PENDING, Answer, Headers
from servekit.http.private_apis import is_valid_host
from servekit.observability import tracing
from servekit.observability.request_ids import adopt_body_id
from servekit.observability.tracing import TRACING
from servekit.rest.access import client_of, group_opt
from servekit.rest.openapi import (
    INFERENCE_FAILURES,
    InferenceRequest,
    InferenceResponse,
    failures,
    with_media,
)
from servekit.services import DataPlane

_HEADER_LENGTH = v2_binary.HEADER_LENGTH.encode()
_CONTENT_LENGTH = b"content-length"
_AUTHORIZATION = b"authorization"
_CONTENT_ENCODING = b"content-encoding"
_ACCEPT_ENCODING = b"accept-encoding"
_JSON_TYPE = (b"content-type", b"application/json")
_BINARY_TYPE = (b"content-type", b"application/octet-stream")
_VARY = (b"vary", b"accept-encoding")


@dataclass(frozen=True, slots=True)
class FastPath:
    """What :func:`serve_infer` reads from application state, in one lookup (Litestar's
    ``State`` answers attribute reads through a Python ``__getattr__``)."""

    dataplane: DataPlane
    access: AccessPolicy
    json_limit: int
    """``server.maxJsonRequestBytes`` (restart-only, so read once)."""


async def serve_infer(scope: Scope, receive: Receive, send: Send) -> None:
    """Answer one inference request that Litestar routed: every one the inference lane
    (app/servekit/http/inference_lane.py) does not answer at the connection.

    Also where a failure of the lane's answer is raised again (``PENDING``), so that Litestar's
    exception handling answers it exactly as it answers every route's."""
    pending: BaseException | None = scope.get(PENDING)  # type: ignore[assignment]
    if pending is not None:
        scope[PENDING] = None  # type: ignore[literal-required]
        raise pending
    fast: FastPath = scope["litestar_app"].state.fast_path
    handler = cast("HTTPRouteHandler", scope["route_handler"])
    limit = handler.resolve_request_max_body_size() or math.inf
    await answer(fast, limit, scope, receive, send)


async def answer(
    fast: FastPath,
    limit: float,
    scope: Scope,
    receive: Receive,
    send: Send,
) -> bool:
    """Answer one inference request on Litestar's route (JSON, binary extension or raw
    binary); ``limit``: the route's ``request_max_body_size``. Litestar has checked the
    ``Host`` already, so :func:`respond` need not."""
    answered = await respond(fast, limit, scope, receive, False)
    if answered is None:
        return False
    headers, content, is_large = answered
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": content, "more_body": False})
    if is_large:
        del content, answered
        await large.release()
    return True


async def respond(
    fast: FastPath,
    limit: float,
    scope: Scope,
    receive: Receive,
    check_host: bool,
    ready: bytes | None = None,
    at_connection: bool = False,
    no_task: bool = False,
) -> Answer | None:
    """The answer of :func:`answer` (None: declined, nothing read), not sent yet.

    ``ready``: the whole body, when the caller already holds it: it is taken only where the
    body would be read in one message (no content coding, under ``large.OFF_LOOP_BYTES``),
    under the same limits, else the body is read with ``receive`` as usual. ``at_connection``:
    the caller is the inference lane (app/servekit/http/inference_lane.py), which uvicorn's
    proxy-headers middleware did not see: a request with ``X-Forwarded-For`` or
    ``X-Forwarded-Proto`` is declined, to go through it. Written flat, one pass over the
    headers: it runs for every inference request."""
    arrived = time.monotonic()  # before the body: see DataPlane.infer
    params = scope["path_params"]
    raw_length = None
    authorization = None
    encoding = None
    accept = None
    host = None
    content_length = None
    for key, value in scope["headers"]:  # ASGI header names are lower-case bytes
        if key == _CONTENT_LENGTH:
            if content_length is None:
                content_length = value
        elif key == _HOST:
            if host is None:
                host = value
        elif key == _HEADER_LENGTH:
            raw_length = value.decode("latin-1")
        elif key == _AUTHORIZATION:
            authorization = value
        elif key == _CONTENT_ENCODING:
            encoding = value
        elif key == _ACCEPT_ENCODING:
            accept = value
        elif at_connection and key in _FORWARDED:
            return None  # uvicorn's proxy-headers middleware reads these: the ASGI way
    if check_host and host is not None and host not in _HOSTS:
        if not is_valid_host(host):
            return None
        if len(_HOSTS) < _MAX_HOSTS:
            _HOSTS.add(host)
    # Litestar's guards do not run on this path (see app/servekit/rest/access.py).
    access = fast.access
    if access.enabled and not access.allows(ApiGroup.INFERENCE, authorization):
        access.check(ApiGroup.INFERENCE, authorization, client_of(scope))  # raises, logs
    names = compression.codings(encoding) if encoding is not None else None  # 415 first
    json_limited = False
    if raw_length is None and fast.json_limit < limit:
        limit, json_limited = fast.json_limit, True
    announced = -1
    if content_length is not None:  # announced_length, inlined
        try:
            announced = int(content_length)
        except ValueError:
            announced = announced_length(content_length, limit, json_limited)  # raises, says why
        if announced > limit:
            raise too_large(limit, json_limited)
    if names is None and announced < large.OFF_LOOP_BYTES:
        if ready is not None:
            body: bytes | bytearray = ready
            if len(body) > limit:
                raise too_large(limit, json_limited)
        else:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body = message.get("body", b"")
                if len(body) > limit:
                    raise too_large(limit, json_limited)
            else:
                body = await read_chunks(receive, limit, json_limited, message)
    else:
        body = await read(receive, limit, json_limited, announced, names)
    dataplane = fast.dataplane
    model: str = params["model"]
    version: str | None = params.get("version")
    traced = tracing.now() if TRACING.on else 0  # tracing: the decode span (else 0: no hook)
    if raw_length is None:
        if len(body) < large.OFF_LOOP_BYTES:
            infer_request = v2_json.decode_body(body, model, version)
        else:
            infer_request = await large.decode_json(body, model, version)
    else:
        header_length = v2_binary.parse_header_length(raw_length, len(body))
        assert header_length is not None  # (a header was given)
        if header_length == 0:
            signature = dataplane.signature_of(model, version)
            infer_request = v2_binary.decode_raw_request(body, model, version, signature.inputs)
        else:
            infer_request = v2_binary.decode_request(body, header_length, model, version)
    if infer_request.id:  # the V2 ``id`` names the request when no X-Request-ID did
        adopt_body_id(infer_request.id)
    if traced:
        tracing.phase("decode", traced)
    # A client that leaves while the request waits drops it (ClientLeft: nobody is answered);
    # app/servekit/http/client_left.py, inlined (no coroutine of its own on this path).
    # ``no_task``: the edge runs this answer with no task (app/servekit/http/taskless.py; it puts
    # the driver that resumes it in the mark's place if it waits). Not asking ``current_task()``
    # then spares a system call: Python 3.11 checks the process ID on every lookup of the
    # running loop (one ``getpid()`` per request, seen with ``strace -c``).
    scope[WAITING] = TASKLESS if no_task else current_task()  # type: ignore[literal-required]
    try:
        response = await dataplane.infer(infer_request, arrived=arrived)
    except CancelledError:
        # (no_task: the driver that resumed it, not a task)
        if client_left(scope, taskless.RUNNING if no_task else current_task()):
            raise ClientLeft from None
        raise
    finally:
        scope[WAITING] = None  # type: ignore[literal-required]
    if traced:
        traced = tracing.now()  # the encode span
    is_large = len(body) >= large.OFF_LOOP_BYTES or large.is_large(response)
    if not is_large:
        content, json_length = v2_binary.encode_response(infer_request, response)
    else:
        del body
        content, json_length = await large.encode(infer_request, response)
        del infer_request, response
    coding = None
    if accept is not None and len(content) >= compression.WORTH_BYTES:
        coding = compression.accepted(accept)
        if coding is not None:
            content = await compression.compress_async(content, coding)
    if traced:
        tracing.phase("encode", traced)
    headers = _HEADERS.get((len(content), json_length))  # built once per length (_headers)
    if headers is None:
        headers = _headers(len(content), json_length)
    if coding is not None:
        headers = (*headers, (_CONTENT_ENCODING, coding.encode()), _VARY)
    return headers, content, is_large


_HOST = b"host"
_FORWARDED = (b"x-forwarded-for", b"x-forwarded-proto")
_HOSTS: set[bytes] = set()
"""``Host`` values seen valid (Litestar's router checks each request's against a pattern)."""
_MAX_HOSTS = 256


_HEADERS: dict[tuple[int, int | None], Headers] = {}
"""The answer's headers by (body length, JSON header length): a tiny model's answers have a
few lengths, so their headers are built once. Tuples (ASGI takes any iterable): shared by
every answer of that length, so nothing on the way may change them in place."""
_MAX_HEADERS = 4096


def _headers(length: int, json_length: int | None) -> Headers:
    """Content-Type and Content-Length (and the JSON header's length) of an answer."""
    key = (length, json_length)
    headers = _HEADERS.get(key)
    if headers is None:
        size = (_CONTENT_LENGTH, str(length).encode())
        if json_length is None:
            headers = (_JSON_TYPE, size)
        else:
            headers = (_BINARY_TYPE, size, (_HEADER_LENGTH, str(json_length).encode()))
        if len(_HEADERS) >= _MAX_HEADERS:
            _HEADERS.clear()
        _HEADERS[key] = headers
    return headers


def _answer_directly(app: ASGIApp) -> ASGIApp:
    """Handler-level middleware factory: ``serve_infer`` answers instead of Litestar's own
    request handling (``app``)."""
    return serve_infer


INFER_DOC: dict[str, Any] = {
    "responses": failures(ApiGroup.INFERENCE, *INFERENCE_FAILURES),
    "operation_class": with_media(binary_answer=True),
}
"""What the document says beyond the signatures: the failures, and binary answers (outputs
asked for with ``binary_data``, or a request sent with the binary extension)."""


@post(
    "/v2/models/{model:str}/infer",
    opt=group_opt(ApiGroup.INFERENCE),
    status_code=200,
    middleware=[_answer_directly],
    **INFER_DOC,
)
async def infer(data: JSONBody[InferenceRequest]) -> InferenceResponse:
    """Run an inference (JSON, or binary tensors with Inference-Header-Content-Length)."""
    raise _NEVER  # the signature is the document's: serve_infer (middleware) answers


@post(
    "/v2/models/{model:str}/versions/{version:str}/infer",
    opt=group_opt(ApiGroup.INFERENCE),
    status_code=200,
    middleware=[_answer_directly],
    **INFER_DOC,
)
async def infer_version(data: JSONBody[InferenceRequest]) -> InferenceResponse:
    """Run an inference on one version of the model."""
    raise _NEVER


_NEVER = InternalServerException("the inference route answered without its middleware")
