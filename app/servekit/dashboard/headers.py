"""Security headers: the dashboard's strict set, and a milder one any HTTP response can carry.

The dashboard runs only our own static scripts and styles (no inline script or style, no CDN),
so its Content-Security-Policy can forbid everything else: an injected ``<script>`` or
``style=`` does nothing even if escaping ever failed. It may not be framed (clickjacking on the
load/unload buttons), nothing is sniffed into a script, and no address (model names are in
paths) leaves in a Referer.

:func:`add_headers` is a plain ASGI middleware, so it also covers error answers (Litestar runs
route middleware around the exception handler): the dashboard uses it per route with
:data:`DASHBOARD_HEADERS`; the application can wrap every route with :data:`API_HEADERS`. Only
headers a response does not carry yet are added, so the inner, stricter set wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from litestar.datastructures import MutableScopeHeaders
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "form-action 'self'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
    )
)

API_PAGE_POLICY = CONTENT_SECURITY_POLICY.replace("img-src 'self'", "img-src 'self' data:")
"""The API page's (app/servekit/dashboard/api_page.py): Swagger UI's stylesheet draws its icons
as ``data:`` SVG images; scripts, styles and requests stay this server's own."""

API_HEADERS: Mapping[str, str] = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # An API answer is data, never a document: if a browser opens one, it runs nothing.
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
}
"""For every HTTP response of the server (JSON, protobuf, metrics)."""

DASHBOARD_HEADERS: Mapping[str, str] = {
    **API_HEADERS,
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
}
"""For the dashboard's pages, its JSON and its static files."""


def add_headers(headers: Mapping[str, str]) -> Any:
    """An ASGI middleware factory adding ``headers`` (those not already set) to HTTP answers.

    Give the result to a Litestar layer's ``middleware=[...]``.
    """
    encoded = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]

    def middleware(app: ASGIApp) -> ASGIApp:
        async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != ScopeType.HTTP:
                await app(scope, receive, send)
                return

            async def send_with_headers(message: Message) -> None:
                if message["type"] == "http.response.start":
                    present = MutableScopeHeaders.from_message(message)
                    for name, value in encoded:
                        if name.decode("latin-1") not in present:
                            present.headers.append((name, value))
                await send(message)

            await app(scope, receive, send_with_headers)

        return wrapped

    return middleware


__all__ = [
    "API_HEADERS",
    "API_PAGE_POLICY",
    "CONTENT_SECURITY_POLICY",
    "DASHBOARD_HEADERS",
    "add_headers",
]
