"""HTTP/1.1 framing, as raw bytes, against both lanes of the HTTP listener (issue 36).

The same named cases go to a server answering plain inference requests at the connection (the
inference lane, app/servekit/http/inference_lane.py ``read_plainly``) and to one sending every
request the ASGI way
(``SERVEKIT_HTTP_FAST=0``): both must make the same framing decision (RFC 9112: a request with
both Content-Length and Transfer-Encoding, duplicate or conflicting Content-Length, a negative
one, obs-fold and bare LF are refused with 400 and the connection closed) and give the same
answer, byte for byte but for the date and the request ID. A valid request pipelined before a
malformed one is answered before the malformed one's 400.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from http_wire import BODY, VARYING, both_lanes, exchange, request, statuses
from servers import ServerProcess

pytestmark = pytest.mark.slow  # end to end: real server processes


@pytest.fixture(scope="module")
def lanes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    """The fast lane and the ASGI lane, each a server of its own over one small model."""
    with both_lanes(tmp_path_factory.mktemp("framing")) as servers:
        yield servers


CASES: dict[str, tuple[list[bytes], list[int]]] = {
    "content-length and transfer-encoding": (
        [request("transfer-encoding: chunked", body=b"4\r\n{}{}\r\n0\r\n\r\n")],
        [400],
    ),
    "duplicate content-length": ([request(f"content-length: {len(BODY)}")], [400]),
    "conflicting content-length": ([request(f"content-length: {len(BODY) + 1}")], [400]),
    "negative content-length": (
        [request("content-length: -5", body=b"", length=False)],
        [400],
    ),
    "content-length list": (
        [request(f"content-length: {len(BODY)}, {len(BODY)}", length=False)],
        [400],
    ),
    "obs-fold": ([request("x-folded: a", " b")], [400]),
    "bare LF": ([request("connection: close").replace(b"\r\n", b"\n")], [400]),
    "pipelined after connection: close": (
        [request("connection: close") + request()],
        [200],
    ),
    "HTTP/1.0": ([request(version="HTTP/1.0")], [200]),
    "two pipelined": ([request() + request("connection: close")], [200, 200]),
    "valid then malformed": ([request() + b"GARBAGE\r\n\r\n"], [200, 400]),
    "oversize headers": ([request("x-big: " + "a" * 70_000)], [431]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_both_lanes_frame_alike(lanes: dict[str, ServerProcess], case: str) -> None:
    parts, expected = CASES[case]
    answers = {lane: exchange(server, parts) for lane, server in lanes.items()}
    for lane, answer in answers.items():
        assert statuses(answer) == expected, (lane, answer)
    fast, asgi = (VARYING.sub(b"", answers[lane]) for lane in ("fast", "asgi"))
    assert fast == asgi


def test_a_trickled_request_is_answered_alike(lanes: dict[str, ServerProcess]) -> None:
    """A request sent a few bytes at a time (headers and body): one answer, the same."""
    whole = request("connection: close")
    parts = [whole[i : i + 16] for i in range(0, len(whole), 16)]
    answers = {lane: exchange(server, parts, pause=0.01) for lane, server in lanes.items()}
    for lane, answer in answers.items():
        assert statuses(answer) == [200], (lane, answer)
    assert VARYING.sub(b"", answers["fast"]) == VARYING.sub(b"", answers["asgi"])


def test_the_answer_before_a_malformed_request_is_written_first(
    lanes: dict[str, ServerProcess],
) -> None:
    """Two valid requests then a malformed one in one write: 200, 200, then 400 and close."""
    parts = [request() + request() + b"POST / HTTP/1.1\r\ncontent-length: -1\r\n\r\n"]
    for lane, server in lanes.items():
        answer = exchange(server, parts)
        assert statuses(answer) == [200, 200, 400], (lane, answer)
        assert answer.count(b'"outputs"') == 2, (lane, answer)
