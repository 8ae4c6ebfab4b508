"""What the OpenAPI document (``/openapi/openapi.json``) says about each route.

Litestar writes the document from the route handlers: their return types, ``responses=`` and
``data`` parameters. This module holds the pieces those declarations share, so the document
says what the server really answers (tests/test_openapi_self.py runs schemathesis against it):

- the shapes of answers and request bodies, as TypedDicts (handlers keep returning plain dicts;
  the annotations are what Litestar turns into schemas);
- :func:`failures`: the ``{"error": ...}`` answers a route can give, from the one error table
  (app/servekit/rest/errors.py), plus the answers every route of a group may give (401 without its
  token when ``server.auth`` protects the group, 503 from the edge's in-flight cap);
- :func:`with_media`: an ``operation_class`` for the few operations Litestar cannot describe
  from a signature: routes whose bodies are read by hand (the V2 and V1 inference routes, grps),
  and answers with a second media type (binary tensors, grps ``bin_data``).

The document describes routes, not models: model names are free strings, and a request body
that is valid JSON of the right shape may still be refused (400) when its tensors do not match
the model's signature.

(No ``from __future__ import annotations`` here: TypedDicts need their ``NotRequired`` marks as
objects, not strings, to know which keys are optional.)
"""

from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

from litestar import Litestar, MediaType, Request, Response
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import (
    OpenAPIMediaType,
    OpenAPIType,
    Operation,
    Reference,
    RequestBody,
    Schema,
)
from litestar.routes import HTTPRoute

from servekit.config.auth import AccessPolicy, ApiGroup
from servekit.rest.access import group_of
from servekit.services import WorkerState

# -- answers --------------------------------------------------------------------------------------


class ErrorBody(TypedDict):
    """Every failure: what went wrong, for people (never a server path or a secret)."""

    error: str


class ServerMetadata(TypedDict):
    name: str
    version: str
    extensions: list[str]


class Live(TypedDict):
    live: bool


class Ready(TypedDict):
    ready: bool


class ModelReady(TypedDict):
    name: str
    ready: bool
    version: NotRequired[str]


Datatype = Literal[
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
]
"""The V2 tensor datatypes."""


class TensorMetadata(TypedDict):
    name: str
    datatype: str
    shape: list[int]
    optional: NotRequired[bool]
    parameters: NotRequired[dict[str, Any]]
    """``categories``: the values a tabular model knows for the input (MLServer's metadata
    tensors carry ``parameters`` too)."""


class ModelMetadata(TypedDict):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]
    parameters: NotRequired[dict[str, Any]]
    """An MLServer custom runtime's own metadata parameters (its ``metadata()``)."""


class OutputTensor(TypedDict):
    name: str
    datatype: str
    shape: list[int]
    parameters: NotRequired[dict[str, Any]]
    data: NotRequired[list[Any]]
    """Absent when the output travels in the binary part of the answer."""


class InferenceResponse(TypedDict):
    model_name: str
    model_version: NotRequired[str]
    id: NotRequired[str]
    parameters: NotRequired[dict[str, Any]]
    outputs: list[OutputTensor]


class InputTensor(TypedDict):
    name: str
    shape: list[int]
    datatype: Datatype
    parameters: NotRequired[dict[str, Any]]
    data: NotRequired[list[Any]]
    """Flat or nested like ``shape``; absent when the tensor travels in the binary part."""


class RequestedOutput(TypedDict):
    name: str
    parameters: NotRequired[dict[str, Any]]


class InferenceRequest(TypedDict):
    """A V2 inference request (JSON; with binary tensors, its JSON part)."""

    id: NotRequired[str]
    parameters: NotRequired[dict[str, Any]]
    inputs: list[InputTensor]
    outputs: NotRequired[list[RequestedOutput]]


class ModelList(TypedDict):
    models: list[str]


class V1Status(TypedDict):
    name: str
    ready: bool


class V1Predictions(TypedDict):
    predictions: list[Any]


class ModelStatistics(TypedDict):
    """Triton's statistics answer (one row per model version)."""

    model_stats: list[dict[str, Any]]


class IndexRow(TypedDict):
    name: str
    version: NotRequired[str]
    state: NotRequired[str]
    reason: NotRequired[str]


class Empty(TypedDict):
    """A repository load or unload that worked."""


class Ports(TypedDict):
    httpPort: int
    grpcPort: int | None


class Worker(TypedDict):
    """One worker process (with one worker: this process)."""

    index: int
    pid: int | None
    state: WorkerState
    upSince: str | None
    """When its current process started, ISO 8601 UTC (null while restarting)."""
    restarts: int
    inferenceSuccess: int
    inferenceFailure: int
    heartbeatAgeSeconds: float | None
    """Seconds since it last answered the supervisor's heartbeat (null with one worker, and
    while it starts or restarts); ``unresponsive`` past 3 s, killed and restarted past 10 s."""


class Workers(TypedDict):
    workers: list[Worker]


class GrpsStatus(TypedDict):
    code: NotRequired[int]
    msg: NotRequired[str]
    status: NotRequired[str]


class GrpsMessage(TypedDict):
    """A grps answer (protobuf's JSON mapping of ``GrpsMessage``); failures carry a status with
    the HTTP code and ``"status": "FAILURE"``."""

    status: NotRequired[GrpsStatus]
    model: NotRequired[str]
    str_data: NotRequired[str]
    bin_data: NotRequired[str]
    gtensors: NotRequired[dict[str, Any]]
    gmap: NotRequired[dict[str, Any]]
    ndarray: NotRequired[list[Any]]


class GrpsFailure(TypedDict):
    """A grps failure: always a status (its code is the HTTP status, its flag FAILURE)."""

    status: GrpsStatus
    model: NotRequired[str]


# -- failures -------------------------------------------------------------------------------------

WHY: dict[int, str] = {
    400: "The request is malformed or does not match the model (the message says which part).",
    401: "server.auth protects this route's group and the request has no valid bearer token.",
    403: "A control route refused a request another site's page could have sent.",
    404: "No such model (or version).",
    409: "The change conflicts with the repository's state.",
    413: "The body is over server.maxRequestBytes (JSON: server.maxJsonRequestBytes).",
    429: "The model's queue is full; retry later.",
    500: "The model failed while running (the message says how; the log has the details).",
    501: "The request asks for a protocol feature this server does not implement.",
    503: (
        "Not available: the model is not ready, or the server has too many requests in "
        "progress (server.network; retry after the Retry-After header)."
    ),
    504: "The request's deadline passed before the model ran.",
}


def failures(group: ApiGroup, *statuses: int, **shapes: Any) -> dict[int, ResponseSpec]:
    """The failures a route of ``group`` can answer: ``statuses`` (each ``{"error": ...}``
    unless ``shapes`` gives another type under ``s<status>``), 401 for a group tokens can
    protect, and 503 (the edge's in-flight cap answers it on every route)."""
    codes = {*statuses, 503}
    if group is not ApiGroup.OPEN:
        codes.add(401)
    return {
        code: ResponseSpec(
            data_container=shapes.get(f"s{code}", ErrorBody),
            description=WHY[code],
            generate_examples=False,
        )
        for code in sorted(codes)
    }


INFERENCE_FAILURES = (400, 404, 413, 429, 500, 501, 504)
"""What an inference can fail with (besides 401 and 503)."""
BODY_FAILURES = (400, 413)
"""What reading a JSON body can fail with."""


# -- operations Litestar cannot describe from a signature ------------------------------------------

BINARY = "application/octet-stream"
_BYTES = Schema(type=OpenAPIType.STRING, format=None, content_media_type=BINARY)


def with_media(
    *,
    body: Schema | str | None = None,
    body_required: bool = True,
    binary_answer: bool = False,
) -> type[Operation]:
    """An ``operation_class`` adding what a handler's signature cannot say.

    ``body``: the JSON request body of a route that reads its body by hand (a Schema, or the
    name of a component another declaration registers), required unless ``body_required`` is
    false; ``binary_answer``: the 200 answer may also be ``application/octet-stream``.
    """

    @dataclass
    class Documented(Operation):
        def __post_init__(self) -> None:
            if body is not None:
                schema = (
                    Reference(f"#/components/schemas/{body}") if isinstance(body, str) else body
                )
                content = {"application/json": OpenAPIMediaType(schema=schema)}
                self.request_body = RequestBody(required=body_required, content=content)
            ok = (self.responses or {}).get("200")
            if binary_answer and ok is not None and not isinstance(ok, Reference):
                ok.content = {**(ok.content or {}), BINARY: OpenAPIMediaType(schema=_BYTES)}

    return Documented


_NULL = OpenAPIType.NULL
_GRPS_DATA = {
    "str_data": Schema(type=[OpenAPIType.STRING, _NULL]),
    "bin_data": Schema(type=[OpenAPIType.STRING, _NULL], description="base64"),
    "gtensors": Schema(type=[OpenAPIType.OBJECT, _NULL], description="{tensors: [GenericTensor]}"),
    "gmap": Schema(type=[OpenAPIType.OBJECT, _NULL], description="GenericMapData"),
    "ndarray": Schema(type=[OpenAPIType.ARRAY, _NULL], items=Schema(), description="nested list"),
}
"""The data fields; null is the field's default (protobuf's JSON mapping), as it is for model."""
_GRPS_MODEL = Schema(
    type=[OpenAPIType.STRING, _NULL], description="name-version; empty: the default model"
)


def _grps_message(*data: str) -> Schema:
    properties: dict[str, Schema | Reference] = {"model": _GRPS_MODEL}
    properties.update((key, _GRPS_DATA[key]) for key in data)
    # Other keys are ignored (as grps ignores them), except the other data fields: one message
    # carries one kind of data.
    others = [key for key in _GRPS_DATA if key not in data]
    return Schema(
        type=OpenAPIType.OBJECT,
        properties=properties,
        property_names=Schema(schema_not=Schema(enum=others)),
    )


GRPS_REQUEST = Schema(
    description="A GrpsMessage (protobuf's JSON mapping): its model and one of the data fields.",
    any_of=[_grps_message(key) for key in _GRPS_DATA],
)
"""A grps predict body (grps routes read their bodies by hand)."""
GRPS_MODEL_REQUEST = Schema(
    type=OpenAPIType.OBJECT, properties={"model": _GRPS_MODEL, "str_data": _GRPS_DATA["str_data"]}
)
"""A grps model metadata body: ``str_data`` (else ``model``) names the model."""


# -- the document as served -----------------------------------------------------------------------

V1_ROUTE = "/v1/models/{model}"
V1_PREDICT = "/v1/models/{model}:predict"


def served(document: dict[str, Any], app: Litestar) -> dict[str, Any]:
    """The document as this server serves it: the V1 predict operation on its real path, and,
    when ``server.auth`` has tokens, a bearer security requirement on the operations of the
    groups they protect (the document is built before the tokens are known to Litestar).

    Litestar routes whole path segments, so ``:predict`` is handled on the route
    ``/v1/models/{model}`` (app/servekit/rest/v1.py), but a client must see the resource it calls.
    Idempotent: Litestar builds the document once and hands the same dict to every render."""
    paths: dict[str, Any] = document.get("paths", {})
    policy: AccessPolicy = app.state.access
    if policy.enabled:
        groups = {
            (route.path_format, method.lower()): group_of(handler.opt)
            for route in app.routes
            if isinstance(route, HTTPRoute)
            for handler in route.route_handlers
            for method in handler.http_methods
        }
        for path, item in paths.items():
            for method, operation in item.items():
                group = groups.get((path.replace(":predict", ""), method), ApiGroup.ADMIN)
                operation["security"] = [{"bearer": []}] if policy.protects(group) else []
        schemes = document.setdefault("components", {}).setdefault("securitySchemes", {})
        schemes["bearer"] = {
            "type": "http",
            "scheme": "bearer",
            "description": "The token of the route's group (server.auth).",
        }
    status = paths.get(V1_ROUTE, {})
    if "post" in status:
        paths[V1_PREDICT] = {"post": status.pop("post")}
    return document


class DocumentPlugin(JsonRenderPlugin):
    """``/openapi/openapi.json`` (and ``/openapi``): Litestar's document, as :func:`served`."""

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        return super().render(request, served(openapi_schema, request.app))


def no_such_document(response: Response[Any]) -> Response[Any]:
    """``after_request`` of the document's router: Litestar answers other paths under it with
    an HTML 404 page; this server answers ``{"error": ...}`` everywhere."""
    if response.status_code == 404 and response.media_type == MediaType.HTML:
        return Response(
            {"error": "no such document: the OpenAPI document is /openapi/openapi.json"},
            status_code=404,
            media_type=MediaType.JSON,
        )
    return response
