"""Core error codes -> HTTP statuses, and the ``{"error": ...}`` body every failure uses."""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException

from servekit.codecs import openai as openai_codec
from servekit.errors import HTTP_STATUS, ErrorCode, ServeError, internal_error
from servekit.http.client_left import ClientLeft

log = logging.getLogger("servekit.http")


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None
) -> Response[dict[str, str]]:
    return Response(
        {"error": message}, status_code=status, media_type="application/json", headers=headers
    )


CHALLENGE = {"WWW-Authenticate": 'Bearer realm="servekit"'}
"""RFC 6750: a 401 names the scheme the client must use."""


def serve_error_handler(_: Request, exc: ServeError) -> Response[dict[str, str]]:  # type: ignore[type-arg]
    headers = CHALLENGE if exc.code is ErrorCode.UNAUTHENTICATED else None
    if exc.retry_after_seconds is not None:  # RFC 9110: how long to back off before retrying
        headers = {"Retry-After": str(exc.retry_after_seconds)}
    return error_response(HTTP_STATUS[exc.code], exc.message, headers)


def http_error_handler(request: Request, exc: HTTPException) -> Response[Any]:  # type: ignore[type-arg]
    message = exc.detail
    extra = getattr(exc, "extra", None)
    if extra:
        message = f"{message}: {extra}"
    # Keep the framework's headers: a 405 must carry ``Allow`` (RFC 9110), found by schemathesis.
    headers = dict(exc.headers or {})
    path = request.scope["path"]
    if exc.status_code in (404, 405) and openai_codec.under_prefix(path):
        # No route under /openai/v1/ matched: its clients read OpenAI's error object (the
        # routes' own failures are answered by their Router, app/servekit/rest/openai.py).
        body = openai_codec.routing_error(
            exc.status_code, request.method, path, headers.get("allow") or headers.get("Allow")
        )
        return Response(body, status_code=exc.status_code, media_type="application/json",
                        headers=headers)  # fmt: skip
    return error_response(exc.status_code, str(message), headers)


def client_left_handler(_: Request, exc: ClientLeft) -> Response[None]:  # type: ignore[type-arg]
    """Nobody to answer: uvicorn drops what is sent on a lost connection, so this is never
    sent (499, nginx's "client closed request", says so to anything that looks)."""
    return Response(None, status_code=499)


def unexpected_error_handler(request: Request, exc: Exception) -> Response[dict[str, str]]:  # type: ignore[type-arg]
    where = f"{request.method} {request.url.path}"
    return error_response(500, internal_error(log, exc, where))


EXCEPTION_HANDLERS = {
    ServeError: serve_error_handler,
    HTTPException: http_error_handler,
    ClientLeft: client_left_handler,
    Exception: unexpected_error_handler,
}
