"""Large inference requests over HTTP: read into one buffer, decoded and encoded off the loop.

Small requests (the common case, and the one the throughput tables measure) never come here:
app/servekit/rest/infer.py sends a body here only from :data:`OFF_LOOP_BYTES`. Above it, decoding
and encoding run in a worker thread (numpy's text reader and orjson's writer spend their time in C;
the reader releases the GIL), so health probes and small models keep answering, and at most
:data:`CONCURRENT` such requests decode or encode at once, which bounds the memory they can take
together. After one, freed memory is handed back to the system (glibc keeps freed heap pages of
medium-sized allocations otherwise)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
from collections.abc import Callable
from typing import Any, TypeVar

from litestar.exceptions import InternalServerException
from litestar.types import Receive

from servekit.codecs import v2_binary, v2_json_large
from servekit.types import InferRequest, InferResponse

OFF_LOOP_BYTES = 1024 * 1024
"""Bodies (and responses) from this size are decoded (encoded) in a worker thread."""
CONCURRENT = 2
"""Large decodes or encodes at once (the machine class has two cores)."""
GENERIC_JSON_BYTES = 16 * 1024 * 1024
"""Most bytes of a large JSON body decoded the generic way (Python objects, ~10-20x the text):
everything but the numeric ``data`` arrays."""

T = TypeVar("T")

_slots: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}


def _slot() -> asyncio.Semaphore:
    """The semaphore of the running loop (servers in tests and notebooks run on several)."""
    loop = asyncio.get_running_loop()
    if loop not in _slots:
        for old in [known for known in _slots if known.is_closed()]:
            del _slots[old]
        _slots[loop] = asyncio.Semaphore(CONCURRENT)
    return _slots[loop]


async def _off_loop(work: Callable[[], Any]) -> Any:
    async with _slot():
        return await asyncio.to_thread(work)


async def run(work: Callable[[], T]) -> T:
    """Any large decode (V1 instances) in a worker thread, under the same bound."""
    result: T = await _off_loop(work)
    return result


async def release() -> None:
    """After a large request is answered and its buffers dropped: memory back to the system."""
    await asyncio.to_thread(_trim)


async def decode_json(body: bytes | bytearray, model: str, version: str | None) -> InferRequest:
    """A large V2 JSON request, decoded in a worker thread
    (app/servekit/codecs/v2_json_large.py)."""
    request: InferRequest = await _off_loop(
        lambda: v2_json_large.decode_request(body, model, version, GENERIC_JSON_BYTES)
    )
    return request


def is_large(response: InferResponse) -> bool:
    """Whether encoding ``response`` is worth a thread hop (its outputs' bytes)."""
    total = 0
    for output in response.outputs:
        total += output.data.nbytes
    return total >= OFF_LOOP_BYTES


async def encode(request: InferRequest, response: InferResponse) -> tuple[bytes, int | None]:
    """``v2_binary.encode_response`` in a worker thread."""
    encoded: tuple[bytes, int | None] = await _off_loop(
        lambda: v2_binary.encode_response(request, response)
    )
    return encoded


async def read_into_buffer(receive: Receive, size: int) -> bytearray:
    """Exactly ``size`` announced bytes, received into one buffer (the caller checked ``size``
    against its limit); more or fewer than announced is the client's error."""
    buffer = bytearray(size)
    view = memoryview(buffer)
    received = 0
    while True:
        message = await receive()
        if message["type"] == "http.request":
            chunk = message.get("body", b"")
            end = received + len(chunk)
            if end > size:
                raise InternalServerException("request body longer than its Content-Length")
            view[received:end] = chunk
            received = end
            if not message.get("more_body", False):
                break
        elif message["type"] == "http.disconnect":
            raise InternalServerException("client disconnected prematurely")
    view.release()
    if received != size:
        del buffer[received:]
    return buffer


def _libc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    with contextlib.suppress(OSError, AttributeError):
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
        return trim
    return None


_MALLOC_TRIM = _libc_trim()


def _trim() -> None:
    """Give freed heap memory back to the system (glibc only; elsewhere nothing to do)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
