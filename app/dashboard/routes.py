"""Litestar handlers of the dashboard: server-rendered pages and the JSON they poll.

Pages are complete without JavaScript (tables rendered here); the static scripts only enhance
them (live numbers, load/unload in place, the try-it-out form). Inference and load/unload go
through the public V2 API from the browser, never through a private path, so what the dashboard
shows is exactly what a client gets. Nothing here is part of the OpenAPI document.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get
from litestar.datastructures import State
from litestar.params import FromPath

from app.dashboard import views
from app.dashboard.render import render
from app.dataplane import DataPlane
from app.errors import NotFound

HTML = "text/html"
NO_STORE = {"Cache-Control": "no-store"}


def sources(state: State) -> views.Sources:
    """What the views read, from application state (ServeKit adds addresses and control)."""
    dataplane: DataPlane = state.dataplane
    kit = state.get("servekit")
    addresses = getattr(kit, "addresses", None)
    return views.Sources(
        dataplane,
        http_url=getattr(addresses, "http_url", None),
        grpc_target=getattr(addresses, "grpc_target", None),
        control=getattr(kit, "control", None) or state.get("control"),
    )


def _page(template: str, status: int = 200, **context: Any) -> Response[str]:
    return Response(render(template, **context), media_type=HTML, status_code=status,
                    headers=NO_STORE)  # fmt: skip


def _not_found(src: views.Sources, message: str) -> Response[str]:
    return _page("not_found.html", 404, page="", server=views.overview(src), message=message)


@get("/", sync_to_thread=False, include_in_schema=False)
def home(state: State) -> Response[str]:
    src = sources(state)
    return _page("home.html", page="home", server=views.overview(src))


@get("/models", sync_to_thread=False, include_in_schema=False)
def models(state: State, request: Request[Any, Any, Any]) -> Response[str]:
    # Read by hand: "state" is a reserved handler argument in Litestar.
    text = request.query_params.get("q", "")
    wanted_state = request.query_params.get("state", "")
    src = sources(state)
    rows = views.index_rows(src)
    return _page(
        "models.html",
        page="models",
        server=views.overview(src),
        rows=views.filter_rows(rows, text, wanted_state),
        total=len(rows),
        q=text,
        wanted_state=wanted_state.upper(),
        states=views.STATES,
    )


def _model_view(state: State, name: str, template: str) -> Response[str]:
    """A page about one model (its details, or its try-it-out form); 404 page if unknown."""
    src = sources(state)
    try:
        model = views.model_detail(src, name)
    except NotFound as exc:
        return _not_found(src, exc.message)
    return _page(template, page="models", server=views.overview(src), model=model)


@get("/models/{name:str}", sync_to_thread=False, include_in_schema=False)
def model_page(state: State, name: FromPath[str]) -> Response[str]:
    return _model_view(state, name, "model.html")


@get("/models/{name:str}/try", sync_to_thread=False, include_in_schema=False)
def try_page(state: State, name: FromPath[str]) -> Response[str]:
    return _model_view(state, name, "try.html")


@get("/dashboard/api/overview", sync_to_thread=False, include_in_schema=False)
def overview_json(state: State) -> Response[dict[str, Any]]:
    return Response(views.overview(sources(state)), headers=NO_STORE)


@get("/dashboard/api/models", sync_to_thread=False, include_in_schema=False)
def models_json(state: State) -> Response[list[dict[str, Any]]]:
    return Response(views.index_rows(sources(state)), headers=NO_STORE)


@get("/dashboard/api/models/{name:str}", sync_to_thread=False, include_in_schema=False)
def model_json(state: State, name: FromPath[str]) -> Response[dict[str, Any]]:
    return Response(views.model_detail(sources(state), name), headers=NO_STORE)


HANDLERS = [home, models, model_page, try_page, overview_json, models_json, model_json]
