"""The Litestar application factory: every HTTP surface on one port.

Route modules contribute ``ROUTES`` lists; the factory wires them with the error table and the
services. Handlers receive the services they call as Litestar dependencies, by parameter name:
``dataplane`` (:class:`~servekit.services.dataplane.DataPlane`), ``catalog``
(:class:`~servekit.services.catalog.Catalog`, the read side) and ``control``
(:class:`~servekit.services.model_control.ModelControl`), see app/servekit/rest/inject.py; that is
the whole API an HTTP handler sees. The inference fast path (app/servekit/rest/infer.py) answers
before Litestar resolves dependencies, so it reads the DataPlane from application state instead (one
attribute read). Other features (repository, dashboard, metrics) add their own route lists through
``extra_routes`` so this file stays the one place HTTP is assembled."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from litestar import Router
from litestar.config.app import AppConfig
from litestar.datastructures import State
from litestar.openapi import OpenAPIConfig

from servekit.config.auth import ApiGroup
from servekit.rest import metrics, v1, v2
from servekit.rest.access import group_opt, token_guard
from servekit.rest.errors import EXCEPTION_HANDLERS
from servekit.rest.front import InferenceApp
from servekit.rest.infer import FastPath
from servekit.rest.inject import dependencies
from servekit.rest.openapi import DocumentPlugin, no_such_document
from servekit.services import Catalog, DataPlane, ModelControl, make_registry
from servekit.version import __version__


def create_app(
    dataplane: DataPlane,
    control: ModelControl,
    catalog: Catalog,
    *,
    extra_routes: Sequence[Any] = (),
    max_request_bytes: int | None = None,
) -> InferenceApp:
    """Build the HTTP application over ``dataplane``, ``control`` and ``catalog``.

    Tokens (``server.auth``) are checked by one application guard, installed only when a group
    has a token (app/servekit/rest/access.py); the inference fast path reads the same policy."""
    access = dataplane.access
    limit = max_request_bytes or dataplane.plan.server.max_request_bytes
    fast = FastPath(dataplane, access, dataplane.plan.server.max_json_request_bytes)
    config = AppConfig(
        route_handlers=[*v2.ROUTES, *v1.ROUTES, *metrics.ROUTES, *extra_routes],
        dependencies=dependencies(dataplane, control, catalog),
        guards=[token_guard] if access.enabled else [],
        exception_handlers=EXCEPTION_HANDLERS,  # type: ignore[arg-type]
        state=State(
            {
                # Read by the two handlers Litestar's dependency injection does not reach:
                # the inference fast path and the token guard.
                "dataplane": dataplane,
                "access": access,
                "metrics_registry": make_registry(catalog),
                "fast_path": fast,
            }
        ),
        request_max_body_size=limit,
        openapi_config=OpenAPIConfig(
            title="servekit",
            version=__version__,
            path="/openapi",
            render_plugins=[DocumentPlugin()],
            # The document describes routes, not models: open like the health endpoints. Its
            # own routes are not in it (as in Litestar's default router).
            openapi_router=Router(
                "/openapi",
                route_handlers=[],
                opt=group_opt(ApiGroup.OPEN),
                include_in_schema=False,
                after_request=no_such_document,
            ),
        ),
        debug=False,
    )
    app = InferenceApp.from_config(config)
    app.fast_path = fast
    return app
