"""Litestar handlers of the dashboard: server-rendered pages and the JSON they poll.

Pages are complete without JavaScript (tables rendered here); the static scripts only enhance
them (live numbers, load/unload in place, the try-it-out form). Inference and load/unload go
through the public V2 API from the browser, never through a private path, so what the dashboard
shows is exactly what a client gets. Nothing here is part of the OpenAPI document.

Access (``opt["api_group"]``, read by the HTTP access check): the JSON is ``metadata``. Pages are
``open`` to that check because a browser navigation carries no ``Authorization`` header; each
page decides what it may hold with :mod:`servekit.dashboard.viewer` (the same tokens), answering the
locked shell when the metadata group is closed to the request. Every response, errors included,
carries the dashboard's security headers (:mod:`servekit.dashboard.headers`).
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get
from litestar.params import FromPath

from servekit.config.auth import ApiGroup
from servekit.dashboard import views
from servekit.dashboard.headers import DASHBOARD_HEADERS, add_headers
from servekit.dashboard.render import render
from servekit.dashboard.viewer import Viewer, hide_admin_data, viewer
from servekit.errors import NotFound
from servekit.rest.inject import Catalog, Control, Dataplane
from servekit.services import DataPlane, ModelState

HTML = "text/html"
NO_STORE = {"Cache-Control": "no-store"}
SECURITY = [add_headers(DASHBOARD_HEADERS)]
PAGE: dict[str, Any] = {
    "sync_to_thread": False,
    "include_in_schema": False,
    "middleware": SECURITY,
    # Open to the access check; the handler shows the locked shell (see the module docstring).
    "opt": {"api_group": ApiGroup.OPEN},
}
JSON: dict[str, Any] = {**PAGE, "opt": {"api_group": ApiGroup.METADATA}}
AnyRequest = Request[Any, Any, Any]


def who(dataplane: DataPlane, request: AnyRequest) -> Viewer:
    """What this request may see, from its Authorization header and the tokens in force."""
    return viewer(dataplane.access, request.headers.get("authorization"))


def json_viewer(dataplane: DataPlane, request: AnyRequest) -> Viewer:
    """The viewer of a JSON request; Unauthenticated (401) when metadata is closed to it.

    The HTTP access check refuses such a request before it gets here; checking again costs
    nothing and keeps the JSON closed even if a route lost its ``opt``.
    """
    seen = who(dataplane, request)
    if seen.locked:
        client = request.client.host if request.client else "unknown"
        seen.policy.check(ApiGroup.METADATA, request.headers.get("authorization"), client)
    return seen


def _page(
    template: str,
    status: int = 200,
    asks: list[str] | None = None,
    gated: list[str] | None = None,
    **context: Any,
) -> Response[str]:
    """A page; ``gated`` names the protected groups whose data the request did not open and
    this page left out (the script fetches the page again when it holds a token), ``asks``
    what the token panel says a token is for."""
    html = render(template, gated=gated or [], asks=asks or [], **context)
    return Response(html, media_type=HTML, status_code=status, headers=NO_STORE)


def _locked() -> Response[str]:
    """The shell answered for every page (known or not) while metadata is closed."""
    asks = ["see this dashboard"]
    return _page("locked.html", 401, asks=asks, gated=["metadata"], page="", server=None)


def _not_found(src: views.Sources, message: str) -> Response[str]:
    return _page("not_found.html", 404, page="", server=views.overview(src), message=message)


@get("/", **PAGE)
def home(
    dataplane: Dataplane, control: Control, catalog: Catalog, request: AnyRequest
) -> Response[str]:
    seen = who(dataplane, request)
    if seen.locked:
        return _locked()
    admin = seen.may(ApiGroup.ADMIN)
    server = views.overview(views.Sources(dataplane, control, catalog), admin=admin)
    asks, gated = [], []
    opens = dataplane.access.protects(ApiGroup.ADMIN)  # a token could open it (not closed)
    if not admin and opens and len(catalog.workers()) > 1:  # the Workers panel: admin data
        asks.append("see the workers")
        gated.append(ApiGroup.ADMIN.value)
    return _page("home.html", asks=asks, gated=gated, page="home", server=server)


@get("/models", **PAGE)
def models(
    dataplane: Dataplane, control: Control, catalog: Catalog, request: AnyRequest
) -> Response[str]:
    seen = who(dataplane, request)
    if seen.locked:
        return _locked()
    # Read by hand: "state" is a reserved handler argument in Litestar.
    text = request.query_params.get("q", "")
    wanted_state = request.query_params.get("state", "")
    src = views.Sources(dataplane, control, catalog)
    server = views.overview(src)
    rows = views.index_rows(catalog)
    controls = server["modelControl"] == "explicit" and server["protected"]["repository"]
    return _page(
        "models.html",
        asks=["load and unload models"] if controls else [],
        page="models",
        server=server,
        rows=views.filter_rows(rows, text, wanted_state),
        total=len(rows),
        q=text,
        wanted_state=wanted_state.upper(),
        states=ModelState.ALL,
    )


def _model_view(src: views.Sources, request: AnyRequest, name: str, template: str) -> Response[str]:
    """A page about one model (its details, or its try-it-out form); 404 page if unknown."""
    seen = who(src.dataplane, request)
    if seen.locked:
        return _locked()
    try:
        model = views.model_detail(src.dataplane, src.catalog, name)
    except NotFound as exc:
        return _not_found(src, exc.message)
    server = views.overview(src)
    asks, gated = [], []
    if template == "try.html" and server["protected"]["inference"]:
        asks.append("run inference")
    if not seen.may(ApiGroup.ADMIN):
        model = hide_admin_data(model)
        opens = seen.policy.protects(ApiGroup.ADMIN)  # else closed: no token would open it
        if template == "model.html" and opens:  # the only page showing admin data
            asks.append("see statistics and configuration")
            gated.append(ApiGroup.ADMIN.value)
    return _page(template, asks=asks, gated=gated, page="models", server=server, model=model)


@get("/models/{name:str}", **PAGE)
def model_page(
    dataplane: Dataplane,
    control: Control,
    catalog: Catalog,
    request: AnyRequest,
    name: FromPath[str],
) -> Response[str]:
    return _model_view(views.Sources(dataplane, control, catalog), request, name, "model.html")


@get("/models/{name:str}/try", **PAGE)
def try_page(
    dataplane: Dataplane,
    control: Control,
    catalog: Catalog,
    request: AnyRequest,
    name: FromPath[str],
) -> Response[str]:
    return _model_view(views.Sources(dataplane, control, catalog), request, name, "try.html")


@get("/dashboard/api/overview", **JSON)
def overview_json(
    dataplane: Dataplane, control: Control, catalog: Catalog, request: AnyRequest
) -> Response[dict[str, Any]]:
    seen = json_viewer(dataplane, request)
    src = views.Sources(dataplane, control, catalog)
    overview = views.overview(src, admin=seen.may(ApiGroup.ADMIN))
    return Response(overview, headers=NO_STORE)


@get("/dashboard/api/models", **JSON)
def models_json(
    dataplane: Dataplane, catalog: Catalog, request: AnyRequest
) -> Response[list[dict[str, Any]]]:
    json_viewer(dataplane, request)
    return Response(views.index_rows(catalog), headers=NO_STORE)


@get("/dashboard/api/models/{name:str}", **JSON)
def model_json(
    dataplane: Dataplane, catalog: Catalog, request: AnyRequest, name: FromPath[str]
) -> Response[dict[str, Any]]:
    seen = json_viewer(dataplane, request)
    model = views.model_detail(dataplane, catalog, name)
    return Response(model if seen.may(ApiGroup.ADMIN) else hide_admin_data(model), headers=NO_STORE)


HANDLERS = [home, models, model_page, try_page, overview_json, models_json, model_json]
