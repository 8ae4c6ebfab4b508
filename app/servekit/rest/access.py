"""Who may call which HTTP route: API-group tokens and the cross-site checks of control routes.

Every route handler says what it does in its ``opt`` (``opt=group_opt(ApiGroup.X)``), next to
its path, so adding a route means choosing its group; a handler that says nothing counts as
``admin`` (fail closed). :func:`token_guard`, an application guard installed only when some
group has a token, checks the bearer token of protected groups. The V2 inference routes answer
before Litestar runs guards (app/servekit/rest/infer.py's fast path), so they check the same policy
themselves: one ``is None`` test per request when inference is open, one header compare when
it is not.

On a bind beyond loopback, the admin and repository groups without a token are closed
(app/servekit/config/auth.py ``close_public_groups``): the same guard and fast-path check refuse
them with 403, naming the token setting. Which ``Host`` names are answered at all is decided
before routing, at the edge (app/servekit/config/hosts.py, app/servekit/edge.py): that is the
guard against DNS rebinding, which the checks below cannot be (after rebinding, the attacker's
page is same-origin).

Control routes (``guards=[cross_site_guard]``: repository load/unload, grps online/offline)
change what the server does, so a browser on another site must not reach them with a form, an
image or a no-cors fetch, which send no preflight and carry no token. :func:`refuse_cross_site`
refuses: a ``Sec-Fetch-Site`` other than ``same-origin``/``none`` (every current browser sends
it, and trusting it keeps a proxy that rewrites ``Host`` working); without it, an ``Origin``
whose host differs from ``Host`` (older browsers); and the three content types a page can post
without asking (``text/plain``, form-urlencoded, multipart), which no API client of ours sends
(tritonclient sends none, KServe's clients and the dashboard send JSON). Clients that are not
browsers send neither header and are unaffected.
"""

from __future__ import annotations

from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.types import Scope

from servekit.config.auth import AccessPolicy, ApiGroup
from servekit.errors import PermissionDenied

API_GROUP = "api_group"
"""Key of a handler's ``opt`` naming its :class:`ApiGroup`."""
_FORM_TYPES = (b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data")
_SAME_SITE_OK = (b"same-origin", b"none")


def group_opt(group: ApiGroup) -> dict[str, Any]:
    """The ``opt`` of a route handler in ``group``."""
    return {API_GROUP: group}


def group_of(handler_opt: dict[str, Any]) -> ApiGroup:
    """A handler's group; one that declares none is treated as admin."""
    return ApiGroup(handler_opt.get(API_GROUP, ApiGroup.ADMIN))


def token_guard(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    """Application guard (installed only when a group has a token or is closed): a request to
    a protected group needs its bearer token; one to a closed group is refused. The V2
    inference routes skip guards (their fast path answers before Litestar's handling) and
    check the same policy in app/servekit/rest/infer.py."""
    if connection.scope.get("method") == "OPTIONS":
        return  # Litestar's own answer (Allow): open, as CORS preflights carry no credentials
    policy: AccessPolicy = connection.app.state.access
    group = group_of(handler.opt)
    authorization = connection.headers.get("authorization")
    if not policy.allows(group, authorization):
        policy.check(group, authorization, client_of(connection.scope))  # raises, logs


def cross_site_guard(
    connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
) -> None:
    """Route guard of control routes: refuses what another site's page could have sent."""
    refuse_cross_site(connection.scope)


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


def client_of(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "unknown client"
