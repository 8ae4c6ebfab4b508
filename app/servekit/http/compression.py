"""HTTP body compression: gzip and deflate request bodies decoded, responses compressed on ask.

Clients compress on their own initiative: tritonclient's ``request_compression_algorithm``
sends ``Content-Encoding: gzip`` (``gzip.compress``) or ``deflate`` (``zlib.compress``: the zlib
format, which is what RFC 9110 means by deflate), and its ``Inference-Header-Content-Length``
then counts bytes of the *decoded* body. So a body is decoded before anything reads it, and the
size limits hold for the decoded bytes: a few KiB of zeros can inflate to gigabytes, so the
decoder never produces more than the limit plus one byte and refuses the rest (413) without
inflating it.

Responses: ``Accept-Encoding`` naming gzip or deflate (tritonclient's
``response_compression_algorithm``, curl's ``--compressed``) gets a compressed body when it is
:data:`WORTH_BYTES` or more (below that the framing costs more than it saves). Without either
header nothing here runs: the inference fast path only notes the two header names while it
scans the headers it scans anyway.
"""

from __future__ import annotations

import asyncio
import zlib

from litestar import Response
from litestar.exceptions import HTTPException

from servekit.errors import InvalidArgument, shown_name

WORTH_BYTES = 1024
"""Smallest response body that is compressed when the client asks."""
LEVEL = 1
"""zlib level for responses: most of the size win of level 6 at a fraction of its CPU (tensor
data compresses poorly at any level; JSON text compresses well at level 1 already)."""
OFF_LOOP_BYTES = 256 * 1024
"""Bodies (compressed, or to compress) from this size are handled in a worker thread."""
_STEP = 1024 * 1024
"""Most bytes fed to the decoder at once, so each step's output stays bounded by its limit."""

_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
"""zlib window bits per content coding: gzip framing, zlib framing."""


class UnsupportedEncoding(HTTPException):
    """415: a Content-Encoding this server cannot decode (RFC 9110 15.5.16)."""

    status_code = 415


def codings(header: bytes | str) -> list[str]:
    """The content codings a Content-Encoding header lists, in the order they were applied
    (``identity`` dropped); an unknown one is refused with 415, naming it."""
    text = header.decode("latin-1") if isinstance(header, bytes) else header
    found = []
    for part in text.split(","):
        name = part.strip().lower()
        if not name or name == "identity":
            continue
        if name not in _WBITS:
            raise UnsupportedEncoding(
                detail=f"unsupported Content-Encoding {shown_name(name)}; this server decodes "
                "gzip and deflate"
            )
        found.append(name)
    return found


def decode(body: bytes | bytearray, names: list[str], limit: float, too_large: Exception) -> bytes:
    """``body`` with ``names`` undone (last applied, first undone), each stage held to ``limit``
    decoded bytes: past it ``too_large`` is raised before more is inflated."""
    data: bytes | bytearray = body
    for name in reversed(names):
        data = _inflate(data, name, limit, too_large)
    return bytes(data)


async def decode_async(
    body: bytes | bytearray, names: list[str], limit: float, too_large: Exception
) -> bytes:
    """:func:`decode`, in a worker thread for a large compressed body."""
    if len(body) < OFF_LOOP_BYTES:
        return decode(body, names, limit, too_large)
    return await asyncio.to_thread(decode, body, names, limit, too_large)


def _inflate(data: bytes | bytearray, name: str, limit: float, too_large: Exception) -> bytes:
    wbits = _WBITS[name]
    if name == "deflate" and not _zlib_header(data):
        wbits = -zlib.MAX_WBITS  # some clients send deflate without the zlib framing
    pieces: list[bytes] = []
    produced = 0
    view = memoryview(data)
    while True:  # one round per gzip member (a deflate body is one zlib stream)
        decoder = zlib.decompressobj(wbits)
        try:
            while view and not decoder.eof:
                room = int(min(limit - produced, 2**62)) + 1  # one byte over shows "too large"
                chunk = decoder.decompress(view[:_STEP], room)
                consumed = min(len(view), _STEP) - len(decoder.unconsumed_tail)
                view = view[consumed:]
                produced += len(chunk)
                if produced > limit:
                    raise too_large
                pieces.append(chunk)
                if not consumed and not chunk:
                    break
            tail = decoder.flush()
        except zlib.error as exc:
            raise InvalidArgument(f"request body is not valid {name} data ({exc})") from None
        produced += len(tail)
        if produced > limit:
            raise too_large
        pieces.append(tail)
        if not decoder.eof:
            raise InvalidArgument(f"request body is truncated {name} data")
        view = memoryview(decoder.unused_data)
        if not view or wbits != _WBITS["gzip"]:
            break
    if view:
        raise InvalidArgument(f"request body has {len(view)} bytes after its {name} data")
    return b"".join(pieces)


def _zlib_header(data: bytes | bytearray) -> bool:
    """Whether ``data`` starts with a zlib header (RFC 1950: method 8, a check multiple of 31)."""
    return len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0


def accepted(header: bytes | str) -> str | None:
    """The coding to answer with for an Accept-Encoding header: gzip (preferred) or deflate,
    unless refused with ``q=0``; None for neither."""
    text = header.decode("latin-1") if isinstance(header, bytes) else header
    allowed: set[str] = set()
    for part in text.split(","):
        name, _, params = part.partition(";")
        name = name.strip().lower()
        quality = params.strip().lower().replace(" ", "")
        if quality.startswith("q=") and _zero(quality[2:]):
            continue
        allowed.add(name)
    for name in ("gzip", "deflate"):
        if name in allowed:
            return name
    if "*" in allowed:
        return "gzip"
    return None


def _zero(value: str) -> bool:
    try:
        return float(value) == 0
    except ValueError:
        return False


def compress(content: bytes, name: str) -> bytes:
    """``content`` in ``name``'s framing (``gzip`` or ``deflate``, i.e. zlib)."""
    encoder = zlib.compressobj(LEVEL, zlib.DEFLATED, _WBITS[name])
    return encoder.compress(content) + encoder.flush()


async def compress_async(content: bytes, name: str) -> bytes:
    """:func:`compress`, in a worker thread for a large body."""
    if len(content) < OFF_LOOP_BYTES:
        return compress(content, name)
    return await asyncio.to_thread(compress, content, name)


async def compressed(accept: str | None, response: Response[bytes]) -> Response[bytes]:
    """``response`` (bytes content), compressed in place when ``accept`` (the request's
    Accept-Encoding) asks and the body is worth it: for the Litestar-built answers (V1, grps)."""
    content = response.content
    if accept is None or not isinstance(content, bytes) or len(content) < WORTH_BYTES:
        return response
    coding = accepted(accept)
    if coding is not None:
        response.content = await compress_async(content, coding)
        response.headers.update({"Content-Encoding": coding, "Vary": "Accept-Encoding"})
    return response
