"""HTTP routes of Triton's model repository extension (index, load, unload).

Bodies are optional (tritonclient sends none to index) and read as raw bytes: an empty body is
``{}``. ``file:`` parameters travel base64-encoded over HTTP and are decoded here, so the core
only ever sees bytes. Success answers 200 with an empty JSON object; errors go through the one
error table as ``{"error": ...}``.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, cast

import orjson
from litestar import Request, Response, post
from litestar.openapi.spec import OpenAPIType, Schema
from litestar.params import Parameter

from servekit.config.auth import ApiGroup
from servekit.config.schema import MODEL_NAME
from servekit.errors import InvalidArgument
from servekit.rest.access import cross_site_guard, group_opt
from servekit.rest.inject import Control
from servekit.rest.openapi import BODY_FAILURES, Empty, IndexRow, failures, with_media
from servekit.services import ModelControl

INDEX_BODY = Schema(
    type=OpenAPIType.OBJECT,
    properties={"ready": Schema(type=OpenAPIType.BOOLEAN, description="ready versions only")},
)
"""The index's optional body (an empty body is ``{}``)."""
LOAD_BODY = Schema(
    type=OpenAPIType.OBJECT,
    properties={
        "parameters": Schema(
            type=OpenAPIType.OBJECT,
            description="Triton's load parameters; without them, a model serve.yaml or an "
            "earlier push named is loaded again.",
            properties={
                "config": Schema(
                    type=OpenAPIType.STRING,
                    description="The model configuration (Triton's JSON text): pushes a model.",
                )
            },
            pattern_properties={
                f"^{ModelControl.FILE_PREFIX}": Schema(
                    type=OpenAPIType.STRING,
                    description="file:<version>/<name>: a file of the pushed model, base64.",
                )
            },
            additional_properties=False,
        )
    },
)
"""A load's optional body."""
UNLOAD_BODY = Schema(
    type=OpenAPIType.OBJECT,
    properties={
        "parameters": Schema(
            type=OpenAPIType.OBJECT,
            properties={"unload_dependents": Schema(type=OpenAPIType.BOOLEAN)},
        )
    },
)
"""An unload's optional body."""
ModelName = Annotated[
    str,
    Parameter(
        # In the document only (schema_extra): the core checks the name and says what is wrong
        # in words, the same over HTTP and gRPC.
        schema_extra={"pattern": MODEL_NAME.pattern},
        description="letters, digits, '_', '.', '-'; starts with a letter or digit; at most 128",
    ),
]
"""The name a load may give a model (push), as the document shows it."""
CONTROL_FAILURES = failures(ApiGroup.REPOSITORY, *BODY_FAILURES, 403, 404, 409)
"""Load and unload: bad parameters, cross-site refusals, unknown models, conflicts."""
ONE_REPLICA = (
    "{what} on this server only (every worker of it). Behind a load balancer that is the one "
    "replica the call reached: the others keep serving what they serve, and a replica that "
    "starts later serves its serve.yaml."
)
"""What a control call changes, said in the OpenAPI document (docs/ops.md says it too)."""


async def _body(request: Request[Any, Any, Any]) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidArgument("request body must be a JSON object")
    return data


def _parameters(body: dict[str, Any]) -> dict[str, object]:
    params = body.get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidArgument("'parameters' must be a JSON object")
    out: dict[str, object] = {}
    for key, value in params.items():
        if key.startswith(ModelControl.FILE_PREFIX):
            if not isinstance(value, str):
                raise InvalidArgument(f"parameter {key!r} must be a base64 string")
            try:
                out[key] = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise InvalidArgument(f"parameter {key!r} is not valid base64") from None
        else:
            out[key] = value
    return out


@post(
    "/v2/repository/index",
    opt=group_opt(ApiGroup.REPOSITORY),
    status_code=200,
    responses=failures(ApiGroup.REPOSITORY, *BODY_FAILURES),
    operation_class=with_media(body=INDEX_BODY, body_required=False),
)
async def repository_index(request: Request[Any, Any, Any], control: Control) -> list[IndexRow]:
    ready = (await _body(request)).get("ready", False)
    if not isinstance(ready, bool):
        raise InvalidArgument("'ready' must be true or false")
    return cast("list[IndexRow]", [row.as_dict() for row in control.index(ready_only=ready)])


@post(
    "/v2/repository/models/{model:str}/load",
    opt=group_opt(ApiGroup.REPOSITORY),
    guards=[cross_site_guard],
    status_code=200,
    responses=CONTROL_FAILURES,
    operation_class=with_media(body=LOAD_BODY, body_required=False),
    description=ONE_REPLICA.format(what="Loads, reloads or pushes the model"),
)
async def repository_load(
    request: Request[Any, Any, Any], control: Control, model: ModelName
) -> Response[Empty]:
    await control.load(model, _parameters(await _body(request)))
    return Response({}, status_code=200)


@post(
    "/v2/repository/models/{model:str}/unload",
    opt=group_opt(ApiGroup.REPOSITORY),
    guards=[cross_site_guard],
    status_code=200,
    responses=CONTROL_FAILURES,
    operation_class=with_media(body=UNLOAD_BODY, body_required=False),
    description=ONE_REPLICA.format(what="Unloads the model"),
)
async def repository_unload(
    request: Request[Any, Any, Any], control: Control, model: ModelName
) -> Response[Empty]:
    params = _parameters(await _body(request))
    dependents = params.get("unload_dependents", False)
    if not isinstance(dependents, bool):
        raise InvalidArgument("'unload_dependents' must be true or false")
    await control.unload(model, unload_dependents=dependents)
    return Response({}, status_code=200)


ROUTES = [repository_index, repository_load, repository_unload]
"""Mounted by the server, which names the extension in server metadata
(servekit.services.extensions.REPOSITORY); the handlers get ModelControl injected (``control``)."""
