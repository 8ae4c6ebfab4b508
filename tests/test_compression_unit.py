"""app/servekit/http/compression.py on its own: codings, limits on the decoded size,
Accept-Encoding."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib

import pytest
from litestar.exceptions import HTTPException

from servekit.errors import InvalidArgument, ResourceExhausted
from servekit.http import compression

TOO_LARGE = ResourceExhausted("too large")


def test_codings_in_the_order_applied_and_unknown_refused() -> None:
    assert compression.codings(b"gzip") == ["gzip"]
    assert compression.codings("Deflate, identity, x-gzip") == ["deflate", "x-gzip"]
    assert compression.codings(b"identity") == []
    with pytest.raises(HTTPException) as caught:
        compression.codings(b"gzip, zstd")
    assert caught.value.status_code == 415 and "'zstd'" in caught.value.detail


def test_stacked_codings_undone_last_first() -> None:
    data = b"servekit " * 1000
    stacked = gzip.compress(zlib.compress(data))
    assert compression.decode(stacked, ["deflate", "gzip"], 10**6, TOO_LARGE) == data


def test_gzip_members_are_concatenated() -> None:
    body = gzip.compress(b"first ") + gzip.compress(b"second")
    assert compression.decode(body, ["gzip"], 100, TOO_LARGE) == b"first second"


def _peak_bytes_refusing(bomb: bytes, limit: int) -> int:
    """The most memory Python held while ``decode`` refused ``bomb`` (traced from after the
    bomb was built, so only what decoding allocated counts)."""
    tracemalloc.start()
    try:
        with pytest.raises(ResourceExhausted):
            compression.decode(bomb, ["gzip"], limit, TOO_LARGE)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_limit_counts_decoded_bytes_and_stops_inflating() -> None:
    # A bomb is refused once its decoded size passes the limit, and decoding stops there: the
    # memory held stays near the limit, far below what inflating the whole body would take.
    # One gzip stream of 16 MiB of zeros (16 KiB sent), and a gzip body of 1,024 members of
    # 1 MiB each (1 GiB decoded, 1 MiB sent; members are the cheap way to build a large bomb).
    zeros = bytes(1 << 20)
    encoder = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    one_stream = b"".join(encoder.compress(zeros) for _ in range(16)) + encoder.flush()
    members = gzip.compress(zeros, 9) * 1024
    assert len(one_stream) < 64 << 10 and len(members) < 2 << 20
    for bomb in (one_stream, members):
        assert _peak_bytes_refusing(bomb, 1 << 20) < 8 << 20  # inflating all: >= 16 MiB
    data = bytes(1000)
    assert compression.decode(gzip.compress(data), ["gzip"], 1000, TOO_LARGE) == data
    with pytest.raises(ResourceExhausted):
        compression.decode(gzip.compress(data), ["gzip"], 999, TOO_LARGE)


@pytest.mark.parametrize("body", [b"plain", gzip.compress(b"x" * 100)[:20]])
def test_invalid_or_truncated_is_invalid_argument(body: bytes) -> None:
    with pytest.raises(InvalidArgument, match="gzip"):
        compression.decode(body, ["gzip"], 10**6, TOO_LARGE)


@pytest.mark.parametrize(
    ("header", "coding"),
    [
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("gzip, deflate, br", "gzip"),
        ("br;q=1.0, deflate;q=0.5", "deflate"),
        ("gzip;q=0, deflate", "deflate"),
        ("gzip; q=0", None),
        ("identity", None),
        ("*", "gzip"),
        ("", None),
    ],
)
def test_accepted(header: str, coding: str | None) -> None:
    assert compression.accepted(header.encode()) == coding


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_compress_round_trips(coding: str) -> None:
    data = b'{"outputs": []}' * 100
    packed = compression.compress(data, coding)
    unpack = gzip.decompress if coding == "gzip" else zlib.decompress
    assert unpack(packed) == data


def test_deflate_without_zlib_framing_is_accepted() -> None:
    data = b"raw deflate " * 50
    encoder = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    raw = encoder.compress(data) + encoder.flush()
    assert compression.decode(raw, ["deflate"], 10**6, TOO_LARGE) == data
    assert compression.decode(zlib.compress(data), ["deflate"], 10**6, TOO_LARGE) == data
