"""HTTP/1.1 conformance of both ways into inference: named cases and a property over bytes.

A plain inference request is answered at the connection (the inference lane:
app/servekit/http/inference_lane.py ``read_plainly``) unless ``SERVEKIT_HTTP_FAST=0`` sends every
request through uvicorn's cycle and Litestar's route. Whatever the bytes, the two must make
the same framing decision and give the same answers: the same responses read from the socket
(status, headers but the date and request ID, the JSON body or ``{"error": ...}``), and the
connection closed after them or not, alike. Each named case below is one framing question
(RFC 9112) seen on its own, with the answer both must give; the property then mixes them:
pipelines of V2 requests whose framing hypothesis mutates (header case and whitespace,
Content-Length or chunked with random chunk splits, absolute-form targets, HTTP/1.0, a
connection closed mid-pipeline, the bytes written in random pieces, one malformed request).

tests/test_http_framing.py holds the byte-for-byte cases of issue 36 (CL+TE, duplicate,
conflicting and negative Content-Length, obs-fold, bare LF, pipelining after close, oversize
headers); the cases here are the ones it does not send.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import orjson
import pytest
from http_wire import MODEL, SLOW, TARGET, Conversation, both_lanes, converse
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from servers import ServerProcess

pytestmark = pytest.mark.slow  # end to end: real server processes

HEADER_LIMIT = 64 * 1024
"""``server.network.maxHeaderBytes`` by default (app/servekit/config/schema.py)."""


@pytest.fixture(scope="module")
def lanes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    """The fast lane and the ASGI lane, each a server of its own over the identity model."""
    # (a body timeout of 1 s: a connection left waiting for a body it will not get answers
    # 408 then, instead of holding the test for the default 30 s)
    limits = "{network: {bodyTimeoutSeconds: 1}}"
    with both_lanes(tmp_path_factory.mktemp("conformance"), limits) as servers:
        yield servers


def _body(data: list[int], ident: str | None = None) -> bytes:
    document: dict[str, object] = {
        "inputs": [{"name": "INPUT0", "shape": [1, len(data)], "datatype": "FP32", "data": data}]
    }
    if ident is not None:
        document["id"] = ident
    return orjson.dumps(document)


BODY = _body([1, 2, 3, 4])


def _head(*lines: str, target: str = TARGET, version: str = "HTTP/1.1") -> bytes:
    return ("\r\n".join([f"POST {target} {version}", *lines]) + "\r\n\r\n").encode()


def _plain(*lines: str, body: bytes = BODY, **kwargs: str) -> bytes:
    """A request with a Host, ``lines`` and a Content-Length for ``body``."""
    return _head("host: 127.0.0.1", *lines, f"content-length: {len(body)}", **kwargs) + body


def _chunks(body: bytes, cuts: list[int], ext: str = "", upper: bool = False) -> bytes:
    """``body`` as a chunked body cut at ``cuts`` (each chunk size in hex, ``ext`` after it)."""
    out = b""
    edges = [0, *sorted({c for c in cuts if 0 < c < len(body)}), len(body)]
    for start, end in itertools.pairwise(edges):
        size = f"{end - start:X}" if upper else f"{end - start:x}"
        out += f"{size}{ext}\r\n".encode() + body[start:end] + b"\r\n"
    return out + b"0\r\n\r\n"


def _chunked(*lines: str, body: bytes = BODY, cuts: tuple[int, ...] = (), **kwargs: str) -> bytes:
    return _head("host: 127.0.0.1", *lines, "transfer-encoding: chunked", **kwargs) + _chunks(
        body, list(cuts)
    )


def _pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@dataclass(frozen=True)
class Case:
    """Bytes to send (in ``parts``, ``pause`` s apart), the statuses both lanes must answer
    and whether the connection is closed after."""

    parts: list[bytes]
    statuses: list[int]
    closed: bool
    pause: float = 0.0


OK_OPEN = ([200], False)
SLOW_TARGET = f"/v2/models/{SLOW}/infer"
SLOW_BODY = orjson.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
)
GZIPPED = _head("host: 127.0.0.1", "transfer-encoding: gzip") + _chunks(BODY, [])
"""A transfer coding without chunked last: refused by the parser once its headers ended."""

CASES: dict[str, Case] = {
    # -- header names and whitespace -------------------------------------------------------
    "header names in any case": Case(
        [_head("HOST: 127.0.0.1", f"Content-LENGTH: {len(BODY)}", "CONTENT-type: application/json")
         + BODY],
        *OK_OPEN,
    ),
    "whitespace around a header value": Case(
        [_head("host:127.0.0.1", f"content-length: \t {len(BODY)} \t ") + BODY], *OK_OPEN
    ),
    "whitespace after the Host value": Case(
        [_head("host: 127.0.0.1 ", f"content-length: {len(BODY)}") + BODY], *OK_OPEN
    ),
    "no Host in HTTP/1.1": Case([_head(f"content-length: {len(BODY)}") + BODY], [400], True),
    "two Host headers": Case([_plain("host: 127.0.0.1")], [400], True),
    "lower-case method": Case([_plain().replace(b"POST", b"post", 1)], [400], True),
    # (RFC 9112 2.3: a higher minor version SHOULD be read as 1.1; llhttp refuses it, alike)
    "HTTP/1.2": Case([_plain(version="HTTP/1.2")], [400], True),
    "HTTP/2.0 on HTTP/1 framing": Case([_plain(version="HTTP/2.0")], [505], True),
    # (RFC 9112 3: a recipient MAY split the request line on any run of whitespace)
    "two spaces in the request line": Case([_plain().replace(b"POST ", b"POST  ", 1)], *OK_OPEN),
    "whitespace before the colon": Case(
        [_head("host: 127.0.0.1", f"content-length : {len(BODY)}") + BODY], [400], True
    ),
    "space inside a header name": Case(
        [_plain("x bad: 1")], [400], True
    ),
    # -- Content-Length and chunked bodies ---------------------------------------------------
    "chunked body in one chunk": Case([_chunked()], *OK_OPEN),
    "chunked body in many chunks": Case([_chunked(cuts=(1, 2, 3, 10, 40, 41))], *OK_OPEN),
    "chunk sizes in upper case hex with extensions": Case(
        [_head("host: 127.0.0.1", "transfer-encoding: chunked")
         + _chunks(BODY, [7, 30], ext=";name=value", upper=True)],
        *OK_OPEN,
    ),
    "chunked with a trailer": Case(
        [_head("host: 127.0.0.1", "transfer-encoding: chunked")
         + _chunks(BODY, [20])[:-2] + b"x-trailer: 1\r\n\r\n"],
        *OK_OPEN,
    ),
    "a tab after chunked": Case(
        [_head("host: 127.0.0.1", "transfer-encoding: chunked\t") + _chunks(BODY, [9])], *OK_OPEN
    ),
    "transfer-encoding value in mixed case": Case(
        [_head("host: 127.0.0.1", "Transfer-Encoding: Chunked") + _chunks(BODY, [9])], *OK_OPEN
    ),
    "content-length zero before chunked": Case(
        [_head("host: 127.0.0.1", "content-length: 0", "transfer-encoding: chunked")
         + _chunks(BODY, [])],
        [400], True,
    ),
    "duplicate content-length in different case": Case(
        [_head("host: 127.0.0.1", f"Content-Length: {len(BODY)}", f"content-length: {len(BODY)}")
         + BODY],
        [400], True,
    ),
    "negative zero content-length": Case(
        [_head("host: 127.0.0.1", "content-length: -0")], [400], True
    ),
    "huge content-length past 64 bits": Case(
        [_head("host: 127.0.0.1", "content-length: 99999999999999999999999") + BODY],
        [400], True,
    ),
    "huge content-length in range": Case(
        [_head("host: 127.0.0.1", f"content-length: {2**40}") + BODY], [413], True
    ),
    "content-length with letters": Case(
        [_head("host: 127.0.0.1", "content-length: 6a") + BODY], [400], True
    ),
    "content-length in hex": Case(
        [_head("host: 127.0.0.1", "content-length: 0x3c") + BODY], [400], True
    ),
    "content-length with a plus sign": Case(
        [_head("host: 127.0.0.1", f"content-length: +{len(BODY)}") + BODY], [400], True
    ),
    "empty content-length": Case(
        [_head("host: 127.0.0.1", "content-length: ") + BODY], [400], True
    ),
    "content-length with leading zeros": Case(
        [_head("host: 127.0.0.1", f"content-length: 000{len(BODY)}") + BODY], *OK_OPEN
    ),
    "body shorter than content-length": Case(  # the body timeout (1 s here) ends it
        [_head("host: 127.0.0.1", f"content-length: {len(BODY) + 5}") + BODY], [408], True
    ),
    "bytes after the body": Case([_plain() + b"   "], [200, 400], True),
    "bytes after the body, after a close": Case(
        [_head("host: 127.0.0.1", f"content-length: {len(BODY)}", "connection: close")
         + BODY + b"   "],
        [200], True,
    ),
    # -- obs-fold and line ends --------------------------------------------------------------
    "obs-fold with a tab": Case([_plain("x-folded: a", "\tb")], [400], True),
    "obs-fold of content-length": Case(
        [_head("host: 127.0.0.1", "content-length:", f" {len(BODY)}") + BODY], [400], True
    ),
    "bare LF after the request line only": Case(
        [_plain().replace(b"HTTP/1.1\r\n", b"HTTP/1.1\n", 1)], [400], True
    ),
    "bare LF ending the headers": Case(
        [_plain().replace(b"\r\n\r\n", b"\r\n\n", 1)], [400], True
    ),
    "bare CR in a header line": Case([_plain("x-cr: a\rb")], [400], True),
    # -- request targets --------------------------------------------------------------------
    "absolute-form target": Case(
        [_plain(target=f"http://127.0.0.1{TARGET}")], *OK_OPEN
    ),
    "absolute-form target with a port and query": Case(
        [_plain(target=f"http://127.0.0.1:1{TARGET}?a=b")], *OK_OPEN
    ),
    "absolute-form https target": Case(
        [_plain(target=f"https://127.0.0.1{TARGET}")], *OK_OPEN
    ),
    "origin-form target with a query": Case([_plain(target=f"{TARGET}?a=b&c")], *OK_OPEN),
    "percent-encoded target": Case(
        [_plain(target=TARGET.replace("_", "%5F"))], *OK_OPEN
    ),
    "expect 100-continue with the body sent": Case(
        [_plain("expect: 100-continue")], [100, 200], False
    ),
    "asterisk-form target": Case([_plain(target="*")], [404], False),
    "target with a dot segment": Case(
        [_plain(target=f"/v2/models/../models/{MODEL}/infer")], [404], False
    ),
    # -- HTTP/1.0 ------------------------------------------------------------------------------
    "HTTP/1.0 with keep-alive": Case(
        [_plain("connection: keep-alive", version="HTTP/1.0")], [200], True
    ),
    "HTTP/1.0 then a pipelined request": Case(
        [_plain(version="HTTP/1.0") + _plain()], [200], True
    ),
    "HTTP/1.0 chunked": Case(  # RFC 9112 6.1: faulty framing, processed, then closed
        [_chunked(version="HTTP/1.0")], [200], True
    ),
    # -- pipelining ----------------------------------------------------------------------------
    "three pipelined in one write": Case(
        [_plain() + _chunked(cuts=(5,)) + _plain(body=_body([7], "x"))], [200, 200, 200], False
    ),
    "pipelined after a close in the middle": Case(
        [_plain() + _plain("connection: close") + _plain()], [200, 200], True
    ),
    "pipelined after a close of any case": Case(
        [_plain("Connection: CLOSE") + _plain()], [200], True
    ),
    "pipelined garbage after a close": Case(
        [_plain("connection: close") + b"GARBAGE\r\n\r\n"], [200], True
    ),
    # (llhttp refuses these only once their header block has ended: the request is made)
    "a transfer coding without chunked last": Case([GZIPPED], [400], True),
    "valid then one refused at the end of its headers": Case(
        [_plain() + GZIPPED], [200, 400], True
    ),
    "two valid then one refused at the end of its headers": Case(
        [_plain() + _chunked(cuts=(9,)) + GZIPPED], [200, 200, 400], True
    ),
    "a transfer coding not understood before chunked": Case(
        [_head("host: 127.0.0.1", "transfer-encoding: gzip", "transfer-encoding: chunked")
         + _chunks(BODY, [])],
        [501], True,
    ),
    # (the answers before it still computing in the model's thread when the refusal is read)
    "two slow then one malformed": Case(
        [_plain(body=SLOW_BODY, target=SLOW_TARGET) * 2 + b"GARBAGE\r\n\r\n"],
        [200, 200, 400], True,
    ),
    "two slow then one refused at the end of its headers": Case(
        [_plain(body=SLOW_BODY, target=SLOW_TARGET) * 2 + GZIPPED], [200, 200, 400], True
    ),
    "pipelined across writes": Case(
        _pieces(_plain() + _plain() + _plain(), 50), [200, 200, 200], False
    ),
    # -- header size -------------------------------------------------------------------------
    "headers just under the limit": Case(
        [_plain("x-big: " + "a" * (HEADER_LIMIT - 1024))], *OK_OPEN
    ),
    "too many header lines": Case(
        [_plain(*(f"x-h{i}: {i}" for i in range(150)))], [431], True
    ),
    "oversize headers in pieces": Case(
        _pieces(_plain("x-big: " + "a" * (HEADER_LIMIT + 10)), 8192), [431], True
    ),
    # -- trickled -------------------------------------------------------------------------------
    "body trickled a few bytes at a time": Case(
        [_head("host: 127.0.0.1", f"content-length: {len(BODY)}"), *_pieces(BODY, 7)],
        *OK_OPEN, pause=0.005,
    ),
    "chunked body trickled": Case(
        [_head("host: 127.0.0.1", "transfer-encoding: chunked"),
         *_pieces(_chunks(BODY, [3, 17, 50]), 5)],
        *OK_OPEN, pause=0.005,
    ),
    "headers trickled a byte at a time": Case(
        [*_pieces(_head("host: 127.0.0.1", f"content-length: {len(BODY)}"), 1), BODY],
        *OK_OPEN, pause=0.001,
    ),
    # -- the answers --------------------------------------------------------------------------
    "a body that is not JSON": Case([_plain(body=b"{nope")], [400], False),
    "an unknown model": Case([_plain(target="/v2/models/nobody/infer")], [404], False),
    "an empty body": Case([_plain(body=b"")], [400], False),
}  # fmt: skip

MISHANDLED: dict[str, str] = {
    "a transfer coding not understood before chunked": (
        "RFC 9112 6.1: a transfer coding the server does not understand (gzip, then chunked "
        "on a second line) SHOULD be answered 501 and the connection closed; both lanes drop "
        "the gzip coding and answer the body as if it were plain (200, kept open)"
    ),
    "a tab after chunked": (
        "RFC 9112 5.1: whitespace (space or tab) after a field value is not part of it; "
        "httptools (llhttp) refuses `chunked<TAB>` as an invalid Transfer-Encoding (a space "
        "passes): 400 and close, on both lanes"
    ),
    "no Host in HTTP/1.1": (
        "RFC 9112 3.2: a server MUST answer 400 to an HTTP/1.1 request without Host; both "
        "lanes answer it (200, kept open)"
    ),
    "two Host headers": (
        "RFC 9112 3.2: a server MUST answer 400 to a request with two Host lines; both lanes "
        "answer it (200, kept open)"
    ),
    "HTTP/2.0 on HTTP/1 framing": (
        "RFC 9110 15.6.6: a major version the server does not speak in this syntax is 505; "
        "httptools parses `HTTP/2.0` and both lanes answer it as HTTP/1 (200, then close)"
    ),
    "whitespace after the Host value": (
        "RFC 9112 5.1: a field value excludes trailing whitespace, but httptools keeps it and "
        "Litestar's Host check refuses `127.0.0.1 `: 400 Invalid host header, on both lanes"
    ),
    "huge content-length in range": (
        "a body refused before it is read (413 over server.maxRequestBytes) leaves the "
        "connection open, on both lanes, without `connection: close`: the next request on it "
        "is read as that body, answered only by the body timeout's 408"
    ),
}
"""Named cases the current code answers differently on the two lanes (or wrongly on both),
each with the reason: strict xfails, so a fix shows up as a failure to remove the entry."""


def _same(answers: dict[str, Conversation]) -> Conversation:
    fast, asgi = answers["fast"], answers["asgi"]
    assert fast == asgi, f"the lanes differ:\nfast: {fast}\nasgi: {asgi}"
    return fast


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=MISHANDLED[name]))
        if name in MISHANDLED
        else name
        for name in CASES
    ],
)
def test_named_case_alike_on_both_lanes(lanes: dict[str, ServerProcess], name: str) -> None:
    case = CASES[name]
    answers = {
        lane: converse(server, case.parts, len(case.statuses), case.pause)
        for lane, server in lanes.items()
    }
    answer = _same(answers)
    assert (answer.statuses, answer.closed) == (case.statuses, case.closed), answer
    for response in answer.responses:
        if response.status == 200:
            assert response.body["outputs"][0]["data"] in ([1, 2, 3, 4], [7]), response
        elif isinstance(response.body, dict):
            assert set(response.body) == {"error"}, response
    assert answer.tail == b""
    for server in lanes.values():
        assert server.alive(), server.log()


# -- the property: pipelines of V2 requests with mutated framing --------------------------------

BAD = (
    "content-length and chunked",
    "conflicting content-length",
    "negative content-length",
    "content-length past 64 bits",
    "content-length not a number",
    "obs-fold",
    "bare LF",
    "oversize headers",
    "transfer coding without chunked last",
)
"""The malformations one request of a pipeline may carry (one per example)."""

_OWS = st.sampled_from(["", " ", "  ", "\t", " \t "])
_TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=8)


@dataclass(frozen=True)
class Sent:
    """One request of an example: its bytes, its tensor, and whether it ends the connection."""

    wire: bytes
    data: list[int]
    ident: str | None
    closes: bool


@st.composite
def _cased(draw: st.DrawFn, name: str) -> str:
    """``name`` with each letter's case drawn (header names are case-insensitive)."""
    flips = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    return "".join(c.upper() if flip else c for c, flip in zip(name, flips, strict=True))


@st.composite
def _request(draw: st.DrawFn, bad: str | None) -> Sent:
    data = draw(st.lists(st.integers(-(2**20), 2**20), min_size=1, max_size=6))
    ident = draw(st.none() | _TOKEN)
    body = _body(data, ident)
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.1", "HTTP/1.0"]))
    target = draw(
        st.sampled_from(
            [TARGET, f"http://127.0.0.1{TARGET}", f"{TARGET}?q=1", TARGET.replace("_", "%5f")]
        )
    )
    connection = draw(st.sampled_from([None, None, "keep-alive", "close", "Close"]))
    chunked = version == "HTTP/1.1" and draw(st.booleans())

    def field(name: str, value: str) -> str:
        # (no whitespace after the Host value, no tab after chunked: refused alike on both
        # lanes, see MISHANDLED)
        if name == "host":
            after = ""
        elif name == "transfer-encoding":
            after = draw(st.sampled_from(["", " ", "  "]))
        else:
            after = draw(_OWS)
        return f"{draw(_cased(name))}:{draw(_OWS)}{value}{after}"

    lines = [field("host", "127.0.0.1"), field("content-type", "application/json")]
    if connection is not None:
        lines.append(field("connection", connection))
    lines += [field(f"x-f{i}", draw(_TOKEN)) for i in range(draw(st.integers(0, 3)))]
    cuts = draw(st.lists(st.integers(1, max(1, len(body) - 1)), max_size=5))
    if chunked:
        lines.append(field("transfer-encoding", "chunked"))
        payload = _chunks(body, cuts)
    else:
        lines.append(field("content-length", str(len(body))))
        payload = body
    if bad == "content-length and chunked":
        lines.append(field("content-length" if chunked else "transfer-encoding",
                           str(len(payload)) if chunked else "chunked"))  # fmt: skip
    elif bad == "conflicting content-length":
        lines.append(field("content-length", str(len(payload) + 1)))
    elif bad == "negative content-length":
        lines.append(field("content-length", f"-{len(payload)}"))
    elif bad == "content-length past 64 bits":
        lines.append(field("content-length", "9" * draw(st.integers(20, 40))))
    elif bad == "content-length not a number":
        lines.append(
            field("content-length", draw(st.sampled_from(["1a", "0x10", "+6", "x", "1 2"])))
        )
    elif bad == "obs-fold":
        lines.append(field("x-folded", "a") + "\r\n" + draw(st.sampled_from([" ", "\t"])) + "b")
    elif bad == "transfer coding without chunked last":
        coding = draw(st.sampled_from(["gzip", "identity", "chunked, gzip", "deflate"]))
        framing = ("content-length", "transfer-encoding")  # (the coding's line is the only one)
        lines = [line for line in lines if not line.lower().startswith(framing)]
        lines.append(field("transfer-encoding", coding))
    elif bad == "oversize headers":
        lines.append(field("x-big", "a" * (HEADER_LIMIT + 100)))
    lines = draw(st.permutations(lines))
    wire = _head(*lines, target=target, version=version) + payload
    if bad == "bare LF":
        head, _, rest = wire.partition(b"\r\n\r\n")
        wire = head.replace(b"\r\n", b"\n") + b"\n\n" + rest
    closes = version == "HTTP/1.0" or (connection or "").lower() == "close"
    return Sent(wire, data, ident, closes)


@dataclass(frozen=True)
class Example:
    requests: list[Sent]
    bad_at: int | None
    bad: str | None
    parts: list[bytes]
    pause: float


@st.composite
def _examples(draw: st.DrawFn) -> Example:
    count = draw(st.integers(1, 3))
    bad = draw(st.none() | st.sampled_from(BAD))
    bad_at = draw(st.integers(0, count - 1)) if bad is not None else None
    requests = [draw(_request(bad if i == bad_at else None)) for i in range(count)]
    wire = b"".join(r.wire for r in requests)
    cuts = sorted(set(draw(st.lists(st.integers(1, len(wire) - 1), max_size=6))))
    edges = [0, *cuts, len(wire)]
    parts = [wire[a:b] for a, b in itertools.pairwise(edges)]
    pause = draw(st.sampled_from([0.0, 0.0, 0.002]))
    return Example(requests, bad_at, bad, parts, pause)


def _expected(example: Example) -> tuple[list[int], bool]:
    """The statuses a conforming server answers (RFC 9112), and whether it then closes."""
    statuses: list[int] = []
    for i, sent in enumerate(example.requests):
        if i == example.bad_at:
            return [*statuses, 431 if example.bad == "oversize headers" else 400], True
        statuses.append(200)
        if sent.closes:
            return statuses, True
    return statuses, False


@settings(
    max_examples=100,
    derandomize=True,  # the same examples on every run: reproducible in CI
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(example=_examples())
def test_mutated_framing_alike_on_both_lanes(
    lanes: dict[str, ServerProcess], example: Example
) -> None:
    """Any pipeline of requests, however framed and cut: the same answers on both lanes, and
    the ones a conforming server gives (each request's tensor back, in order, until one that
    closes; a malformed one refused, the answers before it written first, then closed)."""
    statuses, closed = _expected(example)
    note(f"sent: {example.parts!r}, pause {example.pause}")
    event(example.bad or "well formed")
    event(f"{len(example.requests)} requests in {len(example.parts)} writes")
    answers = {
        lane: converse(server, example.parts, len(statuses), example.pause)
        for lane, server in lanes.items()
    }
    answer = _same(answers)
    assert (answer.statuses, answer.closed, answer.tail) == (statuses, closed, b""), answer
    for sent, response in zip(example.requests, answer.responses, strict=False):
        if response.status == 200:
            output = response.body["outputs"][0]
            assert output["data"] == sent.data, (sent, response)
            assert response.body.get("id") == sent.ident, (sent, response)
