"""Open Inference Protocol (V2) REST routes: health, metadata and inference.

Handlers are thin: they read the path, call the DataPlane (injected: ``dataplane``, see
app/servekit/rest/app.py) and answer. Inference, the hot path, lives in :mod:`servekit.rest.infer`
(bodies read as raw bytes and answered as bytes)."""

from __future__ import annotations

from typing import cast

from litestar import Response, get
from litestar.params import FromPath

from servekit.config.auth import ApiGroup
from servekit.rest.access import group_opt
from servekit.rest.infer import infer, infer_version  # the hot path has a module of its own
from servekit.rest.inject import Dataplane
from servekit.rest.openapi import (
    ErrorBody,
    Live,
    ModelMetadata,
    ModelReady,
    Ready,
    ServerMetadata,
    failures,
)
from servekit.services import DataPlane


@get(
    "/v2",
    opt=group_opt(ApiGroup.METADATA),
    sync_to_thread=False,
    responses=failures(ApiGroup.METADATA),
)
def server_metadata(dataplane: Dataplane) -> ServerMetadata:
    return cast("ServerMetadata", dataplane.server_metadata().as_dict())


@get(
    "/v2/health/live",
    opt=group_opt(ApiGroup.OPEN),
    sync_to_thread=False,
    responses=failures(ApiGroup.OPEN),
)
def server_live(dataplane: Dataplane) -> Live:
    return {"live": dataplane.live()}


@get(
    "/v2/health/ready",
    opt=group_opt(ApiGroup.OPEN),
    sync_to_thread=False,
    responses=failures(ApiGroup.OPEN, s503=Ready | ErrorBody),
)
def server_ready(dataplane: Dataplane) -> Response[Ready]:
    ready = dataplane.ready()
    return Response({"ready": ready}, status_code=200 if ready else 503)


MODEL_READY_FAILURES = failures(ApiGroup.OPEN, 400, 404, s503=ModelReady | ErrorBody)
"""A model that is not ready answers 503 with ``ready: false``; the edge's 503 is an error."""
METADATA_FAILURES = failures(ApiGroup.METADATA, 400, 404)

# Each versioned endpoint has two handlers (with and without /versions/{v}) that share one
# body: Litestar would read an optional `version` on the unversioned path as a query parameter.


def _model_ready(dataplane: DataPlane, model: str, version: str | None) -> Response[ModelReady]:
    ready = dataplane.model_ready(model, version)
    body: ModelReady = {"name": model, "ready": ready}
    if version is not None:
        body["version"] = version
    return Response(body, status_code=200 if ready else 503)


@get(
    "/v2/models/{model:str}/ready",
    opt=group_opt(ApiGroup.OPEN),
    sync_to_thread=False,
    responses=MODEL_READY_FAILURES,
)
def model_ready(dataplane: Dataplane, model: FromPath[str]) -> Response[ModelReady]:
    return _model_ready(dataplane, model, None)


@get(
    "/v2/models/{model:str}/versions/{version:str}/ready",
    opt=group_opt(ApiGroup.OPEN),
    sync_to_thread=False,
    responses=MODEL_READY_FAILURES,
)
def model_version_ready(
    dataplane: Dataplane, model: FromPath[str], version: FromPath[str]
) -> Response[ModelReady]:
    return _model_ready(dataplane, model, version)


@get(
    "/v2/models/{model:str}",
    opt=group_opt(ApiGroup.METADATA),
    sync_to_thread=False,
    responses=METADATA_FAILURES,
)
def model_metadata(dataplane: Dataplane, model: FromPath[str]) -> ModelMetadata:
    return cast("ModelMetadata", dataplane.model_metadata(model, None).as_dict())


@get(
    "/v2/models/{model:str}/versions/{version:str}",
    opt=group_opt(ApiGroup.METADATA),
    sync_to_thread=False,
    responses=METADATA_FAILURES,
)
def model_version_metadata(
    dataplane: Dataplane, model: FromPath[str], version: FromPath[str]
) -> ModelMetadata:
    return cast("ModelMetadata", dataplane.model_metadata(model, version).as_dict())


ROUTES = [
    server_metadata,
    server_live,
    server_ready,
    model_ready,
    model_version_ready,
    model_metadata,
    model_version_metadata,
    infer,
    infer_version,
]
