"""A model's responses as Server-Sent Events, one ``data: {...}`` event each: the answer of
``generate_stream`` (Triton's generate extension) and ``infer_stream`` (MLServer's).

Both keep the same rules, so they live here once: the first response is awaited before the
status line, so a request that fails before it gets an ordinary JSON error with its status; a
failure after that is one last event ``data: {"error": "..."}``; a client that leaves closes the
responses, which stops the model.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from litestar import Response
from litestar.response import Stream
from litestar.types import Scope

from servekit.codecs import v2_json
from servekit.errors import ServeError, internal_error
from servekit.http.client_left import unless_client_leaves
from servekit.types import InferResponse

log = logging.getLogger("servekit.event_stream")
EVENT_STREAM = "text/event-stream"
Encode = Callable[[InferResponse], dict[str, Any]]


async def event_stream(
    scope: Scope, responses: AsyncGenerator[InferResponse, None], encode: Encode, what: str
) -> Response[Any]:
    """The streamed answer to ``responses`` (``what`` names the stream in a logged error)."""
    first = await first_response(scope, responses)
    return Stream(_events(first, responses, encode, what), media_type=EVENT_STREAM)


async def first_response(
    scope: Scope, responses: AsyncGenerator[InferResponse, None]
) -> InferResponse | None:
    """The first of ``responses`` (None: there are none), awaited before the status line so
    that a request failing before it gets an ordinary error; on a failure or a client that
    leaves, ``responses`` are closed (which stops the model)."""
    try:
        return await unless_client_leaves(scope, anext(responses))
    except StopAsyncIteration:
        return None
    except BaseException:
        await responses.aclose()
        raise


async def _events(
    first: InferResponse | None,
    responses: AsyncGenerator[InferResponse, None],
    encode: Encode,
    what: str,
) -> AsyncIterator[bytes]:
    async with aclosing(responses):  # a client that disconnects stops the model
        if first is None:
            return
        yield _event(encode(first))
        try:
            async for response in responses:
                yield _event(encode(response))
        except ServeError as exc:
            yield _event({"error": exc.message})
        except Exception as exc:  # the status line is gone: say so in-band
            yield _event({"error": internal_error(log, exc, what)})


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + v2_json.dumps(obj) + b"\n\n"
