"""HTTP routes of Triton's model configuration and statistics extensions.

``GET /v2/models/{m}[/versions/{v}]/config`` answers the ModelConfig JSON Triton clients expect
(tritonclient.http's ``get_model_config``); ``GET /v2/models[/{m}[/versions/{v}]]/stats`` answers
``{"model_stats": [...]}`` (``get_inference_statistics``). Both are typed values computed by the
DataPlane (app/servekit/services/model_config.py, app/servekit/services/model_stats.py) and written
as JSON by app/servekit/rest/triton_json.py, so the gRPC RPCs answer the very same content."""

from __future__ import annotations

from typing import Any, cast

from litestar import get
from litestar.params import FromPath

from servekit.config.auth import ApiGroup
from servekit.rest.access import group_opt
from servekit.rest.inject import Catalog, Dataplane
from servekit.rest.openapi import ModelStatistics, failures
from servekit.rest.triton_json import model_config_json, statistics_json

ONE = failures(ApiGroup.ADMIN, 400, 404)
"""Failures of one model's configuration or statistics."""

# Versioned and unversioned paths get a handler each: Litestar would read an optional
# `version` on the unversioned path as a query parameter.


@get(
    "/v2/models/{model:str}/config",
    opt=group_opt(ApiGroup.ADMIN),
    sync_to_thread=False,
    responses=ONE,
)
def model_config(dataplane: Dataplane, model: FromPath[str]) -> dict[str, Any]:
    return model_config_json(dataplane.model_config(model, None))


@get(
    "/v2/models/{model:str}/versions/{version:str}/config",
    opt=group_opt(ApiGroup.ADMIN),
    sync_to_thread=False,
    responses=ONE,
)
def model_version_config(
    dataplane: Dataplane, model: FromPath[str], version: FromPath[str]
) -> dict[str, Any]:
    return model_config_json(dataplane.model_config(model, version))


@get(
    "/v2/models/stats",
    opt=group_opt(ApiGroup.ADMIN),
    sync_to_thread=False,
    responses=failures(ApiGroup.ADMIN),
)
def all_model_stats(catalog: Catalog) -> ModelStatistics:
    # A handler of its own: OpenAPI operation ids ignore path parameters, so sharing the handler
    # with /v2/models/{model}/stats would give two operations the same id.
    return cast("ModelStatistics", statistics_json(catalog.model_statistics()))


@get(
    "/v2/models/{model:str}/stats",
    opt=group_opt(ApiGroup.ADMIN),
    sync_to_thread=False,
    responses=ONE,
)
def model_stats(catalog: Catalog, model: FromPath[str]) -> ModelStatistics:
    return cast("ModelStatistics", statistics_json(catalog.model_statistics(model, None)))


@get(
    "/v2/models/{model:str}/versions/{version:str}/stats",
    opt=group_opt(ApiGroup.ADMIN),
    sync_to_thread=False,
    responses=ONE,
)
def model_version_stats(
    catalog: Catalog, model: FromPath[str], version: FromPath[str]
) -> ModelStatistics:
    return cast("ModelStatistics", statistics_json(catalog.model_statistics(model, version)))


ROUTES = [
    model_config,
    model_version_config,
    all_model_stats,
    model_stats,
    model_version_stats,
]
"""Mounted by the server, which names the extensions in server metadata
(servekit.services.extensions.CONFIG_AND_STATISTICS)."""
