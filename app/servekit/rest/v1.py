"""KServe V1 REST routes: list models, model status, and ``:predict`` (instances -> predictions).

Instances are stacked into the model's single input (or one list per input for multi-input
models, in the order of the model's inputs); the datatype comes from the model's metadata.

``/v1/models/{name}`` (status, GET) and ``/v1/models/{name}:predict`` (POST) are two resources,
but Litestar routes whole path segments, so both live on the one route ``/v1/models/{target}``:
each handler checks the ``:predict`` suffix and answers 405 (with ``Allow``) for the other
resource's method, and OPTIONS names each resource's own methods. The OpenAPI document shows
the two resources as they are (app/servekit/rest/openapi.py moves the predict operation to its
path).

Bodies are read like V2 JSON (app/servekit/http/bodies.py ``read_body``): bounded by
``server.maxJsonRequestBytes``, and from ``large.OFF_LOOP_BYTES`` decoded in a worker thread so
the loop keeps answering.
"""

from __future__ import annotations

import time
from typing import Any, cast

import numpy as np
from litestar import HttpMethod, Request, Response, get, post, route
from litestar.exceptions import MethodNotAllowedException
from litestar.openapi.spec import OpenAPIType, Schema
from litestar.params import FromPath

from servekit.codecs import v2_json
from servekit.codecs.v2_json import json_data_to_array
from servekit.config.auth import ApiGroup
from servekit.datatypes import lookup
from servekit.errors import InvalidArgument, NotFound, shown_name
from servekit.http import compression, large
from servekit.http.bodies import read_body
from servekit.http.client_left import unless_client_leaves
from servekit.rest.access import group_opt
from servekit.rest.inject import Dataplane
from servekit.rest.openapi import (
    INFERENCE_FAILURES,
    ModelList,
    V1Predictions,
    V1Status,
    failures,
    with_media,
)
from servekit.types import InferRequest, ModelSignature, Tensor

PREDICT = ":predict"
V1_BODY = Schema(
    type=OpenAPIType.OBJECT,
    required=["instances"],
    properties={
        "instances": Schema(
            type=OpenAPIType.ARRAY,
            items=Schema(),
            description="One entry per row: a value or list for a single-input model, an "
            "object keyed by input name (or a list in input order) for several inputs.",
        )
    },
)
"""The body of ``:predict`` (read by hand, so described here)."""


@get(
    "/v1/models",
    opt=group_opt(ApiGroup.METADATA),
    sync_to_thread=False,
    responses=failures(ApiGroup.METADATA),
)
def list_models(dataplane: Dataplane) -> ModelList:
    return {"models": dataplane.model_names()}


@get(
    "/v1/models/{model:str}",
    opt=group_opt(ApiGroup.METADATA),
    sync_to_thread=False,
    responses=failures(ApiGroup.METADATA, 400, 404),
)
def model_status(dataplane: Dataplane, model: FromPath[str]) -> V1Status:
    if model.endswith(PREDICT):
        raise MethodNotAllowedException(headers={"Allow": _allowed(model)})
    return {"name": model, "ready": dataplane.model_ready(model)}


@route(
    "/v1/models/{model:str}",
    http_method=[HttpMethod.OPTIONS],
    opt=group_opt(ApiGroup.OPEN),
    include_in_schema=False,
    sync_to_thread=False,
)
def v1_options(model: FromPath[str]) -> Response[None]:
    """The methods of the resource asked about (status or ``:predict``), as RFC 9110 wants."""
    return Response(None, status_code=204, headers={"Allow": _allowed(model)})


def _allowed(target: str) -> str:
    return "OPTIONS, POST" if target.endswith(PREDICT) else "GET, OPTIONS"


@post(
    "/v1/models/{model:str}",
    opt=group_opt(ApiGroup.INFERENCE),
    status_code=200,
    responses=failures(ApiGroup.INFERENCE, *INFERENCE_FAILURES),
    operation_class=with_media(body=V1_BODY),
)
async def predict(
    request: Request[Any, Any, Any], dataplane: Dataplane, model: FromPath[str]
) -> Response[V1Predictions]:
    arrived = time.monotonic()  # before the body: see DataPlane.infer
    name, colon, verb = model.rpartition(":")
    if not colon:
        raise MethodNotAllowedException(headers={"Allow": _allowed(model)})
    if verb != "predict" or not name:
        raise NotFound(f"unknown V1 endpoint {shown_name(model)}; use /v1/models/<name>:predict")
    limit = dataplane.plan.server.max_json_request_bytes
    encoding = request.headers.get("content-encoding")
    body = await read_body(request.scope, request.receive, limit, encoding)
    signature = dataplane.signature_of(name)
    if len(body) < large.OFF_LOOP_BYTES:
        infer_request = _decode(body, name, signature)
    else:
        infer_request = await large.run(lambda: _decode(body, name, signature))
        del body
    waited = dataplane.infer(infer_request, arrived=arrived)
    response = await unless_client_leaves(request.scope, waited)  # dropped if the client left
    first = response.outputs[0]
    content = v2_json.dumps({"predictions": v2_json.output_json_data_nested(first)})
    answer = Response(content, media_type="application/json")
    compressed = await compression.compressed(request.headers.get("accept-encoding"), answer)
    return cast("Response[V1Predictions]", compressed)  # V1's JSON: what the document shows


def _decode(body: bytes | bytearray, model: str, signature: ModelSignature) -> InferRequest:
    """A V1 body as the model's inputs (CPU work only: it may run in a worker thread)."""
    decoded = v2_json.loads(body)
    if not isinstance(decoded, dict) or not isinstance(decoded.get("instances"), list):
        raise InvalidArgument("a V1 predict request is a JSON object with an 'instances' list")
    instances: list[Any] = decoded["instances"]
    inputs = []
    for position, spec in enumerate(signature.inputs):
        values = (
            instances
            if len(signature.inputs) == 1
            else [_field(item, spec.name, position) for item in instances]
        )
        try:
            array = np.asarray(values, dtype=object if spec.datatype == "BYTES" else None)
        except ValueError:
            raise InvalidArgument(f"instances for input {spec.name!r} are ragged") from None
        datatype = lookup(spec.datatype)
        tensor = json_data_to_array(spec.name, datatype, array.shape, values)
        inputs.append(Tensor(spec.name, spec.datatype, tuple(tensor.shape), tensor))
    return InferRequest(model_name=model, inputs=inputs)


def _field(item: Any, name: str, position: int) -> Any:
    if isinstance(item, dict):
        if name not in item:
            raise InvalidArgument(f"instance is missing input {name!r}")
        return item[name]
    if isinstance(item, list) and position < len(item):
        return item[position]
    raise InvalidArgument("each instance of a multi-input model is an object keyed by input name")


ROUTES = [list_models, v1_options, model_status, predict]
"""``v1_options`` before the other handlers of its path: Litestar adds its own OPTIONS handler
to a path whose first handler has none."""
