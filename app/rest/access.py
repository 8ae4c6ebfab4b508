"""Who may call which HTTP route: API-group tokens and the cross-site checks of control routes.

Every route handler says what it does in its ``opt`` (``opt={API_GROUP: ApiGroup.X}``, or
:func:`group_opt`), next to its path, so adding a route means choosing its group; a handler that
says nothing counts as ``admin`` (fail closed). The application-level middleware built by
:func:`access_middleware` runs after routing and before the handler (and before the inference
fast path of app/rest/infer.py), so each request costs one ``opt`` lookup and, only for a
protected group, one header scan and a constant-time compare. Without any token configured the
middleware is not installed at all.

Control routes (``opt[CONTROL]``: repository load/unload, grps online/offline) change what the
server does, so a browser on another site must not be able to reach them with a form, an image
or a no-cors fetch, which send no preflight and carry no token. :func:`refuse_cross_site`
refuses: a ``Sec-Fetch-Site`` other than ``same-origin``/``none`` (every current browser sends
it, and trusting it keeps a proxy that rewrites ``Host`` working); without it, an ``Origin``
whose host differs from ``Host`` (older browsers); and the three content types
a page can post without asking (``text/plain``, form-urlencoded, multipart), which no API client
of ours sends (tritonclient sends none, KServe's clients and the dashboard send JSON). Clients
that are not browsers send neither header and are unaffected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, Scope, Send

from app.auth import AccessPolicy, ApiGroup
from app.errors import PermissionDenied

API_GROUP = "api_group"
"""Key of a handler's ``opt`` naming its :class:`ApiGroup`."""
CONTROL = "control"
"""Key of a handler's ``opt`` marking a route that changes server state (cross-site checked)."""
_AUTHORIZATION = b"authorization"
_FORM_TYPES = (b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data")
_SAME_SITE_OK = (b"same-origin", b"none")


def group_opt(group: ApiGroup, *, control: bool = False) -> dict[str, Any]:
    """The ``opt`` of a route handler in ``group`` (``control``: it changes server state)."""
    return {API_GROUP: group, CONTROL: True} if control else {API_GROUP: group}


def group_of(handler_opt: dict[str, Any]) -> ApiGroup:
    """A handler's group; one that declares none is treated as admin."""
    return ApiGroup(handler_opt.get(API_GROUP, ApiGroup.ADMIN))


def access_middleware(policy: AccessPolicy) -> Callable[[ASGIApp], ASGIApp]:
    """Application middleware: a request to a protected group needs its bearer token, and a
    control route is refused from a browser's cross-site context."""

    def factory(app: ASGIApp) -> ASGIApp:
        async def guard(scope: Scope, receive: Receive, send: Send) -> None:
            # OPTIONS is Litestar's own answer (the Allow header): open, as CORS preflights
            # never carry credentials.
            if scope["type"] == ScopeType.HTTP and scope["method"] != "OPTIONS":
                opt = scope["route_handler"].opt
                group = group_of(opt)
                if policy.protects(group):
                    policy.check(group, _header(scope, _AUTHORIZATION), _client(scope))
                if opt.get(CONTROL):
                    refuse_cross_site(scope)
            await app(scope, receive, send)

        return guard

    return factory


def control_middleware(app: ASGIApp) -> ASGIApp:
    """The cross-site check alone, for servers without tokens (inference stays untouched)."""

    async def guard(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == ScopeType.HTTP and scope["route_handler"].opt.get(CONTROL):
            refuse_cross_site(scope)
        await app(scope, receive, send)

    return guard


def refuse_cross_site(scope: Scope) -> None:
    """Raise PermissionDenied for a request a page of another site could have sent."""
    headers = dict(scope["headers"])  # a control request is rare: the copy costs nothing
    site = headers.get(b"sec-fetch-site")
    if site is not None and site.lower() not in _SAME_SITE_OK:
        raise PermissionDenied(
            f"refused a {site.decode('latin-1')[:20]} browser request to a control route: "
            "only pages served by this server (or non-browser clients) may change its state"
        )
    origin = headers.get(b"origin")  # browsers without Sec-Fetch-Site: compare the origin
    if (
        site is None
        and origin is not None
        and _host_of(origin) != headers.get(b"host", b"").lower()
    ):
        raise PermissionDenied(
            "refused a cross-origin request to a control route (its Origin is not this server)"
        )
    content_type = headers.get(b"content-type", b"").split(b";", 1)[0].strip().lower()
    if content_type in _FORM_TYPES:
        raise PermissionDenied(
            f"control routes take application/json, not {content_type.decode('latin-1')}: "
            "send the header 'Content-Type: application/json'"
        )


def _host_of(origin: bytes) -> bytes:
    """``http://host:port`` -> ``host:port`` (``null`` and garbage give something unequal)."""
    return origin.split(b"://", 1)[-1].rstrip(b"/").lower()


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:  # ASGI header names are lower-case bytes
        if key == name:
            return value
    return None


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "unknown client"
