"""Request bodies read under the route's limits: the one Content-Length rule of the HTTP
routes, the inference lane's and Litestar's alike.

The route's ``request_max_body_size`` (and ``server.maxJsonRequestBytes`` for a JSON body)
bounds the announced Content-Length, refused before anything is read (413, or the JSON
limit's own message), then the bytes actually received, and then the decoded bytes of a gzip
or deflate body (app/servekit/http/compression.py). A body announced from
``large.OFF_LOOP_BYTES`` is read into one buffer of its size (app/servekit/http/large.py). The
first Content-Length is the one read (httptools refuses a request with two: 400).
"""

from __future__ import annotations

import math
from typing import Any, cast

from litestar.exceptions import ClientException, InternalServerException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.handlers import HTTPRouteHandler
from litestar.types import Receive, Scope

from servekit.errors import ResourceExhausted
from servekit.http import compression, large

CONTENT_LENGTH = b"content-length"


def announced_length(value: bytes, limit: float, json_limited: bool) -> int:
    """The Content-Length, refused before anything is read when over ``limit``."""
    try:
        announced = int(value)
    except ValueError:
        raise ClientException(f"Invalid content-length: {value.decode('latin-1')!r}") from None
    if announced > limit:
        raise too_large(limit, json_limited)
    return announced


async def read_body(
    scope: Scope,
    receive: Receive,
    json_limit: int | None = None,
    encoding: bytes | str | None = None,
) -> bytes | bytearray:
    """The whole request body, refused as Litestar's ``Request.body()`` would refuse it, and
    decoded if ``encoding`` (the Content-Encoding header) names gzip or deflate.

    The route's ``request_max_body_size`` (and ``json_limit``, for a JSON request) bounds both
    the announced Content-Length (checked before anything is read) and the bytes actually
    received, and then again the decoded bytes (app/servekit/http/compression.py: a zip bomb is
    refused without being inflated). A large announced body is read into one buffer of its size (no
    second copy when the chunks are joined).
    """
    names = compression.codings(encoding) if encoding is not None else None  # 415 first
    handler = cast("HTTPRouteHandler", scope["route_handler"])
    limit = handler.resolve_request_max_body_size() or math.inf
    json_limited = False
    if json_limit is not None and json_limit < limit:
        limit, json_limited = json_limit, True
    announced = -1
    for key, value in scope["headers"]:
        if key == CONTENT_LENGTH:
            announced = announced_length(value, limit, json_limited)
            break
    return await read(receive, limit, json_limited, announced, names)


async def read(
    receive: Receive,
    limit: float,
    json_limited: bool,
    announced: int,
    names: list[str] | None,
) -> bytes | bytearray:
    """The body of ``announced`` bytes (-1: not announced), decoded by the content codings
    ``names`` (app/servekit/http/compression.py)."""
    body: bytes | bytearray
    if announced >= large.OFF_LOOP_BYTES:
        body = await large.read_into_buffer(receive, announced)
    else:
        body = await read_chunks(receive, limit, json_limited, None)
    if names:
        return await compression.decode_async(body, names, limit, too_large(limit, json_limited))
    return body


async def read_chunks(
    receive: Receive, limit: float, json_limited: bool, first: Any
) -> bytes | bytearray:
    """The body's chunks joined (``first``: a message already received, or None)."""
    chunks: list[bytes] = []
    received = 0
    message: Any = first if first is not None else await receive()
    while True:
        if message["type"] == "http.request":
            chunk = message.get("body", b"")
            if chunk:
                received += len(chunk)
                if received > limit:
                    raise too_large(limit, json_limited)
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        elif message["type"] == "http.disconnect":
            raise InternalServerException("client disconnected prematurely")
        message = await receive()
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def too_large(limit: float, json_limited: bool) -> Exception:
    """The refusal of a body over ``limit``. Built only when refusing: a Litestar exception
    costs more to construct than the rest of reading a small body."""
    if not json_limited:
        return RequestEntityTooLarge()
    return ResourceExhausted(
        f"JSON request body over {limit:.0f} bytes (server.maxJsonRequestBytes); send "
        "large tensors with the binary tensor data extension (Inference-Header-Content-Length)"
    )
