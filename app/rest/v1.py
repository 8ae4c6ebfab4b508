"""KServe V1 REST routes: list models, model status, and ``:predict`` (instances -> predictions).

Instances are stacked into the model's single input (or one list per input for multi-input
models, in the order of the model's inputs); the datatype comes from the model's metadata.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from litestar import Request, Response, get, post
from litestar.params import FromPath

from app.codecs import v2_json
from app.codecs.v2_json import json_data_to_array
from app.config.auth import ApiGroup
from app.datatypes import lookup
from app.errors import InvalidArgument, NotFound, shown_name
from app.rest import compression
from app.rest.access import group_opt
from app.rest.infer import read_body
from app.rest.inject import Dataplane
from app.types import InferRequest, Tensor


@get("/v1/models", opt=group_opt(ApiGroup.METADATA), sync_to_thread=False)
def list_models(dataplane: Dataplane) -> dict[str, list[str]]:
    return {"models": dataplane.model_names()}


@get("/v1/models/{model:str}", opt=group_opt(ApiGroup.METADATA), sync_to_thread=False)
def model_status(dataplane: Dataplane, model: FromPath[str]) -> dict[str, Any]:
    return {"name": model, "ready": dataplane.model_ready(model)}


@post("/v1/models/{target:str}", opt=group_opt(ApiGroup.INFERENCE), status_code=200)
async def predict(
    request: Request[Any, Any, Any], dataplane: Dataplane, target: FromPath[str]
) -> Response[bytes]:
    model, _, verb = target.rpartition(":")
    if verb != "predict" or not model:
        raise NotFound(f"unknown V1 endpoint {shown_name(target)}; use /v1/models/<name>:predict")
    limit = dataplane.plan.server.max_json_request_bytes
    encoding = request.headers.get("content-encoding")
    body = v2_json.loads(await read_body(request.scope, request.receive, limit, encoding))
    if not isinstance(body, dict) or not isinstance(body.get("instances"), list):
        raise InvalidArgument("a V1 predict request is a JSON object with an 'instances' list")
    instances: list[Any] = body["instances"]
    signature = dataplane.signature_of(model)
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
    response = await dataplane.infer(InferRequest(model_name=model, inputs=inputs))
    first = response.outputs[0]
    content = v2_json.dumps({"predictions": v2_json.output_json_data_nested(first)})
    answer = Response(content, media_type="application/json")
    return await compression.compressed(request.headers.get("accept-encoding"), answer)


def _field(item: Any, name: str, position: int) -> Any:
    if isinstance(item, dict):
        if name not in item:
            raise InvalidArgument(f"instance is missing input {name!r}")
        return item[name]
    if isinstance(item, list) and position < len(item):
        return item[position]
    raise InvalidArgument("each instance of a multi-input model is an object keyed by input name")


ROUTES = [list_models, model_status, predict]
