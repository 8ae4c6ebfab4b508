"""HTTP routes of Triton's model configuration and statistics extensions.

``GET /v2/models/{m}[/versions/{v}]/config`` answers the ModelConfig JSON Triton clients expect
(tritonclient.http's ``get_model_config``); ``GET /v2/models[/{m}[/versions/{v}]]/stats`` answers
``{"model_stats": [...]}`` (``get_inference_statistics``). Both are computed by the core
(app/services/model_config.py, app/services/model_stats.py), so the gRPC RPCs answer the very same
content.
"""

from __future__ import annotations

from typing import Any

from litestar import get
from litestar.datastructures import State
from litestar.params import FromPath

from app.config.auth import ApiGroup
from app.rest.access import group_opt
from app.services.dataplane import DataPlane
from app.services.model_config import model_config_for
from app.services.model_stats import model_statistics

NAMES: tuple[str, ...] = ("model_configuration", "statistics")
"""Extension names reported by server metadata once these surfaces are registered."""


def _dataplane(state: State) -> DataPlane:
    dataplane: DataPlane = state.dataplane
    return dataplane


# Versioned and unversioned paths get a handler each: Litestar would read an optional
# `version` on the unversioned path as a query parameter.


@get("/v2/models/{model:str}/config", opt=group_opt(ApiGroup.ADMIN), sync_to_thread=False)
def model_config(state: State, model: FromPath[str]) -> dict[str, Any]:
    return model_config_for(_dataplane(state), model, None)


@get(
    "/v2/models/{model:str}/versions/{version:str}/config",
    opt=group_opt(ApiGroup.ADMIN),
    sync_to_thread=False,
)
def model_version_config(
    state: State, model: FromPath[str], version: FromPath[str]
) -> dict[str, Any]:
    return model_config_for(_dataplane(state), model, version)


@get("/v2/models/stats", opt=group_opt(ApiGroup.ADMIN), sync_to_thread=False)
def all_model_stats(state: State) -> dict[str, Any]:
    # A handler of its own: OpenAPI operation ids ignore path parameters, so sharing the handler
    # with /v2/models/{model}/stats would give two operations the same id.
    return model_statistics(_dataplane(state))


@get("/v2/models/{model:str}/stats", opt=group_opt(ApiGroup.ADMIN), sync_to_thread=False)
def model_stats(state: State, model: FromPath[str]) -> dict[str, Any]:
    return model_statistics(_dataplane(state), model, None)


@get(
    "/v2/models/{model:str}/versions/{version:str}/stats",
    opt=group_opt(ApiGroup.ADMIN),
    sync_to_thread=False,
)
def model_version_stats(
    state: State, model: FromPath[str], version: FromPath[str]
) -> dict[str, Any]:
    return model_statistics(_dataplane(state), model, version)


ROUTES = [
    model_config,
    model_version_config,
    all_model_stats,
    model_stats,
    model_version_stats,
]


def register(dataplane: DataPlane) -> list[Any]:
    """Announce the extensions on ``dataplane`` and return the routes to mount."""
    for name in NAMES:
        if name not in dataplane.extensions:
            dataplane.extensions.append(name)
    return list(ROUTES)
