"""MLServer's streaming inference: ``POST /v2/models/{m}[/versions/{v}]/infer_stream``.

MLServer 1.7.1 answers a V2 inference request (the body ``/infer`` takes) with Server-Sent
Events, one ``data: {...}`` event per response of a model's ``predict_stream``, each a V2
inference response. servekit answers the same over ``DataPlane.infer_stream``, so an MLServer
client of a streaming custom runtime works unchanged (a model that answers once gives one
event). As with ``generate_stream`` (generate.py): a request that fails before the first
response gets an ordinary JSON error with its status, a failure after that is one last event
``data: {"error": "..."}``, and a client that leaves stops the model. MLServer's own
``generate_stream`` takes the same V2 body; servekit's ``generate_stream`` is Triton's
generate extension (a flat JSON body), so MLServer clients use ``infer_stream``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from litestar import Request, Response, post
from litestar.params import FromPath

from servekit.codecs import v2_json
from servekit.config.auth import ApiGroup
from servekit.http.bodies import read_body
from servekit.rest.access import group_opt
from servekit.rest.event_stream import EVENT_STREAM, event_stream
from servekit.rest.inject import Dataplane
from servekit.rest.openapi import INFERENCE_FAILURES, failures, with_media
from servekit.services import DataPlane

log = logging.getLogger("servekit.infer_stream")
AnyRequest = Request[Any, Any, Any]


async def _stream(
    request: AnyRequest, dataplane: DataPlane, model: str, version: str | None
) -> Response[Any]:
    arrived = time.monotonic()  # before the body: see DataPlane.infer
    limit = request.app.state.fast_path.json_limit
    body = await read_body(request.scope, request.receive, limit)
    decoded = v2_json.decode_request(v2_json.loads(body), model, version)
    responses = dataplane.infer_stream(decoded, arrived=arrived)
    return await event_stream(request.scope, responses, v2_json.json_response, "an infer stream")


DOC: dict[str, Any] = {
    "responses": failures(ApiGroup.INFERENCE, *INFERENCE_FAILURES),
    "operation_class": with_media(body="InferenceRequest"),  # /infer's body
}
"""What the document says beyond the signatures: the failures and the body."""


@post(
    "/v2/models/{model:str}/infer_stream",
    opt=group_opt(ApiGroup.INFERENCE),
    status_code=200,
    media_type=EVENT_STREAM,
    **DOC,
)
async def infer_stream(
    request: AnyRequest, dataplane: Dataplane, model: FromPath[str]
) -> Response[Any]:
    return await _stream(request, dataplane, model, None)


@post(
    "/v2/models/{model:str}/versions/{version:str}/infer_stream",
    opt=group_opt(ApiGroup.INFERENCE),
    status_code=200,
    media_type=EVENT_STREAM,
    **DOC,
)
async def infer_stream_version(
    request: AnyRequest, dataplane: Dataplane, model: FromPath[str], version: FromPath[str]
) -> Response[Any]:
    return await _stream(request, dataplane, model, version)


ROUTES = [infer_stream, infer_stream_version]
