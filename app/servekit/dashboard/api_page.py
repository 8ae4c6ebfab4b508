"""``GET /api``: the dashboard's API page, Swagger UI over the server's OpenAPI document.

Served offline like the rest of the dashboard: Swagger UI's bundle and stylesheet are package
data (``static/vendor/swagger-ui``, copied from the npm package swagger-ui-dist by
``scripts/vendor_swagger_ui.sh``), started by our own ``static/api.js`` (no inline script, so
the dashboard's Content-Security-Policy holds; the page's only addition is ``data:`` images,
Swagger UI's icons). "Try it out" sends real requests from the browser to this server's routes,
through the same access checks, host check and same-site guard as any client's.

Access is the other pages' (:mod:`servekit.dashboard.routes`): the locked shell while the
metadata group is closed to the request.
"""

from __future__ import annotations

from typing import Any

from litestar import Response, get

from servekit.dashboard import views
from servekit.dashboard.headers import API_PAGE_POLICY, DASHBOARD_HEADERS, add_headers
from servekit.dashboard.routes import PAGE, AnyRequest, _locked, _page, who
from servekit.rest.inject import Catalog, Control, Dataplane

API_PAGE: dict[str, Any] = {
    **PAGE,
    "middleware": [add_headers({**DASHBOARD_HEADERS, "Content-Security-Policy": API_PAGE_POLICY})],
}


@get("/api", **API_PAGE)
def api_page(
    dataplane: Dataplane, control: Control, catalog: Catalog, request: AnyRequest
) -> Response[str]:
    if who(dataplane, request).locked:
        return _locked()
    server = views.overview(views.Sources(dataplane, control, catalog))
    return _page("api.html", page="api", server=server)


HANDLERS = [api_page]
