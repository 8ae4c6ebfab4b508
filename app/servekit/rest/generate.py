"""Triton's generate extension: ``POST /v2/models/{m}[/versions/{v}]/generate[_stream]``.

JSON in and out (:mod:`servekit.codecs.generate_json`), over ``DataPlane.infer_stream``:

- ``/generate`` answers one JSON object. As in Triton it needs the model to produce exactly one
  response; a decoupled model that yields more gets 400 naming ``generate_stream`` (it is closed
  at its second result, not run to the end).
- ``/generate_stream`` answers Server-Sent Events (``text/event-stream``), one ``data: {...}``
  event per response, as the model yields them. A request that fails before the first response
  (unknown model, bad input, a model that fails at once) gets an ordinary JSON error with its
  status; a failure after that is one last event, ``data: {"error": "..."}``, since the status
  line has gone (so clients check every event, as Triton documents). A client that disconnects
  stops the model (Litestar cancels the stream; closing it closes the model's generator).

A client that leaves before its (first) response drops the request, on both routes: queued, it
never runs (app/servekit/http/client_left.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, cast

from litestar import Request, Response, post
from litestar.openapi.spec import OpenAPIType, Schema
from litestar.params import FromPath

from servekit.codecs import generate_json, v2_json
from servekit.config.auth import ApiGroup
from servekit.errors import InvalidArgument
from servekit.http.bodies import read_body
from servekit.http.client_left import unless_client_leaves
from servekit.rest.access import group_opt
from servekit.rest.event_stream import EVENT_STREAM, event_stream
from servekit.rest.inject import Dataplane
from servekit.rest.openapi import INFERENCE_FAILURES, failures, with_media
from servekit.services import DataPlane
from servekit.types import InferResponse

log = logging.getLogger("servekit.generate")
GENERATE: tuple[str, ...] = ("generate",)
"""The protocol extension these routes add to server metadata (Triton names it so)."""
AnyRequest = Request[Any, Any, Any]
Answer = Response[dict[str, Any]]
"""A generate answer: one JSON object (the model's outputs by name, and its parameters)."""
GENERATE_BODY = Schema(
    type=OpenAPIType.OBJECT,
    description="The model's inputs by name (a value or a list each), and 'parameters'.",
)
"""A generate body (read by hand: described here)."""


async def _start(
    request: AnyRequest, dataplane: DataPlane, model: str, version: str | None
) -> AsyncGenerator[InferResponse, None]:
    """Read and decode the request; the model's responses, not yet started."""
    arrived = time.monotonic()  # before the body: see DataPlane.infer
    limit = request.app.state.fast_path.json_limit
    body = await read_body(request.scope, request.receive, limit)
    obj = v2_json.loads(body)
    inputs = dataplane.signature_of(model, version).inputs
    decoded = generate_json.decode_request(obj, model, version, inputs)
    return dataplane.infer_stream(decoded, arrived=arrived)


async def _generate(
    request: AnyRequest, dataplane: DataPlane, model: str, version: str | None
) -> Answer:
    responses = await _start(request, dataplane, model, version)
    answer = await unless_client_leaves(request.scope, _only(responses, model))
    content = v2_json.dumps(generate_json.encode_response(answer))
    return cast("Answer", Response(content, media_type="application/json"))


async def _only(responses: AsyncGenerator[InferResponse, None], model: str) -> InferResponse:
    """The one response ``/generate`` answers (the responses are closed either way)."""
    async with aclosing(responses):
        answer = None
        async for response in responses:
            if answer is not None:
                raise InvalidArgument(
                    "generate expects model to produce exactly 1 response, use generate stream "
                    f"for model that generates various number of responses (model {model!r} "
                    "yields a stream: POST .../generate_stream)"
                )
            answer = response
    if answer is None:
        raise InvalidArgument(
            "generate expects model to produce exactly 1 response; the model produced none"
        )
    return answer


async def _generate_stream(
    request: AnyRequest, dataplane: DataPlane, model: str, version: str | None
) -> Response[Any]:
    responses = await _start(request, dataplane, model, version)
    return await event_stream(
        request.scope, responses, generate_json.encode_response, "a generate stream"
    )


DOC: dict[str, Any] = {
    "responses": failures(ApiGroup.INFERENCE, *INFERENCE_FAILURES),
    "operation_class": with_media(body=GENERATE_BODY),
}
"""What the document says beyond the signatures: the failures and the body."""


@post("/v2/models/{model:str}/generate", opt=group_opt(ApiGroup.INFERENCE), status_code=200, **DOC)
async def generate(request: AnyRequest, dataplane: Dataplane, model: FromPath[str]) -> Answer:
    return await _generate(request, dataplane, model, None)


@post(
    "/v2/models/{model:str}/versions/{version:str}/generate",
    opt=group_opt(ApiGroup.INFERENCE),
    status_code=200,
    **DOC,
)
async def generate_version(
    request: AnyRequest, dataplane: Dataplane, model: FromPath[str], version: FromPath[str]
) -> Answer:
    return await _generate(request, dataplane, model, version)


@post(
    "/v2/models/{model:str}/generate_stream",
    opt=group_opt(ApiGroup.INFERENCE),
    status_code=200,
    media_type=EVENT_STREAM,
    **DOC,
)
async def generate_stream(
    request: AnyRequest, dataplane: Dataplane, model: FromPath[str]
) -> Response[Any]:
    return await _generate_stream(request, dataplane, model, None)


@post(
    "/v2/models/{model:str}/versions/{version:str}/generate_stream",
    opt=group_opt(ApiGroup.INFERENCE),
    status_code=200,
    media_type=EVENT_STREAM,
    **DOC,
)
async def generate_stream_version(
    request: AnyRequest, dataplane: Dataplane, model: FromPath[str], version: FromPath[str]
) -> Response[Any]:
    return await _generate_stream(request, dataplane, model, version)


ROUTES = [generate, generate_version, generate_stream, generate_stream_version]
