"""The services an HTTP handler is given: Litestar dependencies injected by parameter name.

A handler declares ``dataplane: Dataplane``, ``catalog: Catalog`` and/or ``control: Control`` and
Litestar passes the DataPlane, the Catalog and the ModelControl of this application
(app/servekit/rest/app.py wires them with :func:`dependencies`); that is all of the server a handler
sees. The inference fast path (app/servekit/rest/infer.py) answers before Litestar resolves
dependencies and reads the DataPlane from application state instead."""

from __future__ import annotations

from typing import Any, TypeAlias

from litestar.di import NamedDependency, Provide

from servekit.services import Catalog as CatalogService
from servekit.services import DataPlane, ModelControl

Dataplane: TypeAlias = NamedDependency[DataPlane]
"""A handler parameter named ``dataplane``: health, metadata, configuration, inference."""
Catalog: TypeAlias = NamedDependency[CatalogService]
"""A handler parameter named ``catalog``: the models as views, the index, statistics, workers,
ports, recent errors (the read side)."""
Control: TypeAlias = NamedDependency[ModelControl]
"""A handler parameter named ``control``: load, unload, the index, the model control mode."""


def dependencies(
    dataplane: DataPlane, control: ModelControl, catalog: CatalogService
) -> dict[str, Provide | Any]:
    """The application-level dependencies giving handlers these three services."""

    def provide_dataplane() -> DataPlane:
        return dataplane

    def provide_catalog() -> CatalogService:
        return catalog

    def provide_control() -> ModelControl:
        return control

    return {
        "dataplane": Provide(provide_dataplane, use_cache=True, sync_to_thread=False),
        "control": Provide(provide_control, use_cache=True, sync_to_thread=False),
        "catalog": Provide(provide_catalog, use_cache=True, sync_to_thread=False),
    }
