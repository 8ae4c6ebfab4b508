"""Who may call which HTTP route: API-group tokens and the cross-site checks of control routes.

Every route handler says what it does in its ``opt`` (``opt=group_opt(ApiGroup.X)``), next to
its path, so adding a route means choosing its group; a handler that says nothing counts as
``admin`` (fail closed). :func:`token_guard`, an application guard installed only when some
group has a token, checks the bearer token of protected groups. The V2 inference routes answer
before Litestar runs guards (app/servekit/rest/infer.py's fast path), so they check the same policy
themselves: one ``is None`` test per request when inference is open, one header compare when
it is not. The edge (app/servekit/http/connection.py) asks :class:`EdgeGuard` the same policy when a
request's headers end, so a request without its token is refused before its body is read; the
guard and the fast path's check stay, as a second line.

On a bind beyond loopback, the admin and repository groups without a token are closed
(app/servekit/config/auth.py ``close_public_groups``): the same guard and fast-path check refuse
them with 403, naming the token setting. Which ``Host`` names are answered at all is decided before
routing, at the edge (app/servekit/config/hosts.py, app/servekit/http/connection.py): that is the
guard against DNS rebinding, which the checks below cannot be (after rebinding, the attacker's page
is same-origin).

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
from urllib.parse import unquote

import httptools
from litestar import Litestar
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.types import Scope
from litestar.utils.path import normalize_path

from servekit.config.auth import AccessPolicy, ApiGroup
from servekit.errors import PermissionDenied
from servekit.http.private_apis import is_valid_host

API_GROUP = "api_group"
"""Key of a handler's ``opt`` naming its :class:`ApiGroup`."""
MAX_ROUTES = 4096
"""(method, path) pairs whose group :class:`EdgeGuard` remembers (it starts over when full)."""
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


class EdgeGuard:
    """The token check of every route, asked by the edge (app/servekit/http/connection.py) when a
    request's headers end: before the request counts against the requests in flight and before its
    body is read, so a client without the token cannot hold a slot by sending its body slowly.

    It decides only what the application would decide the same way: the route's group comes
    from Litestar's own router (as :func:`token_guard` finds it), and a request is refused only
    when that group is guarded and no ``Authorization`` value it carries opens it, and nothing
    the application checks before its guard (a malformed ``Host``: 400) would answer first.
    The refused request is then answered by the application itself (its guard, or the
    inference answer's own check), so the 401 or 403 is the one it always was; anything else
    (an unknown path, 404; a method the route lacks, 405; ``OPTIONS``) goes on unjudged."""

    def __init__(self, app: Litestar, policy: AccessPolicy) -> None:
        self._app = app
        self._policy = policy
        self._groups: dict[tuple[bytes, bytes], ApiGroup | None] = {}

    def refuses(self, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]]) -> bool:
        """Whether the application refuses this request for its token (or a closed group)."""
        key = (method, url)
        groups = self._groups
        group = groups.get(key)
        if group is None and key not in groups:
            if len(groups) >= MAX_ROUTES:
                groups.clear()
            group = groups[key] = self._group(method, url)
        if group is None:
            return False
        policy = self._policy
        host = None
        opened = False
        for name, value in headers:
            if name == b"authorization":
                opened = opened or policy.allows(group, value)
            elif name == b"host" and host is None:
                host = value
        if opened:
            return False
        return host is None or is_valid_host(host)  # (Litestar answers a bad Host first)

    def _group(self, method: bytes, url: bytes) -> ApiGroup | None:
        """The guarded group Litestar's router sends ``method url`` to, or None: a route
        nobody guards, or a request Litestar answers before any guard (404, 405)."""
        if method == b"OPTIONS":
            return None  # (token_guard lets it through)
        try:
            path = httptools.parse_url(url).path.decode("ascii")
            if "%" in path:
                path = unquote(path)
            _, handler, _, _, _ = self._app.asgi_router.handle_routing(
                normalize_path(path),
                method.decode("ascii"),
            )
        except Exception:  # not a path, 404, 405: the application says so
            return None
        group = group_of(handler.opt)
        return group if self._policy.guards(group) else None


def edge_guard(app: Any, policy: AccessPolicy) -> EdgeGuard | None:
    """The edge's token check for ``app`` (None when no group is guarded: nothing to check)."""
    if not policy.enabled or not isinstance(app, Litestar):
        return None
    return EdgeGuard(app, policy)


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
