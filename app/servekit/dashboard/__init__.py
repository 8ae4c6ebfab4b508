"""The web dashboard at ``/``: health, repository index, model pages and try-it-out forms.

``routes()`` is what the server hands to ``servekit.rest.app.create_app(extra_routes=...)``: the
page and JSON handlers plus the router serving the local CSS/JS (no CDN: servers often have no
internet). How the dashboard works when tokens are configured: :mod:`servekit.dashboard.viewer`.
Handlers are given the DataPlane and ModelControl like every HTTP handler
(app/servekit/rest/inject.py) and views read only their methods, so the dashboard and the API can
never
disagree.
"""

from __future__ import annotations

from typing import Any

from litestar.datastructures import CacheControlHeader
from litestar.static_files import create_static_files_router

from servekit.config.auth import ApiGroup
from servekit.dashboard import api_page, bench
from servekit.dashboard.render import STATIC_DIR
from servekit.dashboard.routes import HANDLERS, SECURITY

STATIC_PATH = "/dashboard/static"


def routes() -> list[Any]:
    """Route handlers and the static-files router of the dashboard."""
    static = create_static_files_router(
        path=STATIC_PATH,
        directories=[STATIC_DIR],
        name="dashboard-static",
        cache_control=CacheControlHeader(max_age=300),
        include_in_schema=False,
        middleware=SECURITY,
        opt={"api_group": ApiGroup.OPEN},  # our own CSS/JS/icon: nothing protected in them
    )
    return [*HANDLERS, *bench.HANDLERS, *api_page.HANDLERS, static]


__all__ = ["STATIC_PATH", "routes"]
