"""The HTTP application: Litestar, and the inference routes' table the inference lane reads.

Litestar answers every HTTP request that reaches the application: every route, the OpenAPI
document, 405 and OPTIONS, and the exception handlers. The inference lane
(app/servekit/http/inference_lane.py) answers plain inference requests at the connection,
before any application is called, with the inference route's own answer
(:func:`servekit.rest.infer.respond`): those are the two ways into inference, and
:func:`inference_lane` builds the first from this application.

The lane takes a request only where Litestar's own router would send it to that answer
(:meth:`InferenceApp.route_of`): the first time a path is seen, it asks the router (its own
routing cache, the same answer) and keeps the result, so a path Litestar would answer with 404
or another route still gets Litestar's answer, and nothing about which paths are inference
paths is written twice.
"""

from __future__ import annotations

import math
import os
from typing import Any

from litestar import Litestar
from litestar.handlers import HTTPRouteHandler
from litestar.utils.path import normalize_path

from servekit.http.inference_lane import SWITCH, InferenceLane
from servekit.http.inference_lane import Route as _Route
from servekit.rest.infer import FastPath, respond, serve_infer

MAX_PATHS = 4096
"""Paths remembered (the cache starts over when full: a client sending endless model names
costs one routing per path, as it does in Litestar)."""


class InferenceApp(Litestar):
    """A Litestar application that knows which paths its inference route answers."""

    fast_path: FastPath
    """What the inference answer reads (set by app/servekit/rest/app.py)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._routes: dict[str, _Route | None] = {}

    def route_of(self, path: str) -> _Route | None:
        """Where a POST to ``path`` goes if it is an inference route, else None."""
        routes = self._routes
        route = routes.get(path)
        if route is None and path not in routes:
            route = self._route(routes, path)
        return route

    def _route(self, routes: dict[str, _Route | None], path: str) -> _Route | None:
        """Where Litestar's router sends a POST to ``path``: kept if it is the inference
        answer (:func:`serve_infer`), else None (Litestar answers)."""
        if len(routes) >= MAX_PATHS:
            routes.clear()
        route: _Route | None = None
        normalized = normalize_path(path)
        try:
            app, handler, _, params, _ = self.asgi_router.handle_routing(normalized, "POST")
        except Exception:  # 404, 405: Litestar says so
            app = None
        if app is serve_infer and isinstance(handler, HTTPRouteHandler):
            route = (params, handler.resolve_request_max_body_size() or math.inf, normalized)
        routes[path] = route
        return route


def inference_lane(app: Any) -> InferenceLane | None:
    """The inference lane of ``app`` (app/servekit/http/inference_lane.py): its inference
    routes answered at the connection with the routes' own answer. None when ``app`` is not
    the inference front, or when ``SERVEKIT_HTTP_FAST=0``."""
    if not isinstance(app, InferenceApp) or os.environ.get(SWITCH, "1") == "0":
        return None
    return InferenceLane(app, respond)
