"""The HTTP application: Litestar, with the V2 inference routes answered before its routing.

Litestar keeps every route, the OpenAPI document, 405 and OPTIONS, and the exception handlers.
What it costs per request before a route's own code runs (its router: path normalisation,
the routing cache, the scope state, the route's exception handlers; its exception middleware,
which wraps ``send``) was about a sixth of the instructions of a tiny-model inference
(callgrind, issue 28's first round), so :class:`InferenceApp` answers
``POST /v2/models/{model}[/versions/{version}]/infer`` itself, with the same code Litestar's
route runs (:func:`servekit.rest.infer.answer`), and hands every other request to Litestar.

It takes a request only where Litestar's own router would send it to that code: the first
time a path is seen, it asks the router (its own routing cache, the same answer) and keeps
the result, so a path Litestar would answer with 404 or another route still gets Litestar's
answer, and nothing about which paths are inference paths is written twice. A request whose
``Host`` Litestar's router refuses goes to Litestar too. A failure of the fast answer is
raised again inside Litestar (``PENDING``: Litestar routes the request to the inference
route, which raises it), so every error is answered by Litestar's exception handling, with the
same status, body and headers as on any route.
"""

from __future__ import annotations

import math
import os
from typing import Any

from litestar import Litestar
from litestar.handlers import HTTPRouteHandler
from litestar.utils.path import normalize_path

from servekit.http.inference_lane import PENDING, SWITCH, InferenceLane
from servekit.http.inference_lane import Route as _Route
from servekit.rest.infer import FastPath, answer, respond, serve_infer

MAX_PATHS = 4096
"""Paths remembered (the cache starts over when full: a client sending endless model names
costs one routing per path, as it does in Litestar)."""


class InferenceApp(Litestar):
    """A Litestar application whose inference requests are answered before routing."""

    fast_path: FastPath
    """What the inference answer reads (set by app/servekit/rest/app.py)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._routes: dict[str, _Route | None] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope["root_path"]:
            route = self.route_of(scope["path"])
            if route is not None and PENDING not in scope:  # (PENDING: the connection's
                # answer, app/servekit/http/inference_lane.py, failed: Litestar answers the failure)
                scope["path_params"], limit, scope["path"] = route
                try:
                    if await answer(self.fast_path, limit, scope, receive, send, True):
                        return
                except Exception as exc:  # answered by Litestar's exception handling
                    scope[PENDING] = exc
        await super().__call__(scope, receive, send)

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
