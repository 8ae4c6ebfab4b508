"""HTTP/1.1 framing, as raw bytes, against both lanes of the HTTP listener (issue 36).

The same named cases go to a server answering plain inference requests at the connection (the
fast lane, app/servekit/edge.py ``_read_plainly``) and to one sending every request the ASGI way
(``SERVEKIT_HTTP_FAST=0``): both must make the same framing decision (RFC 9112: a request with
both Content-Length and Transfer-Encoding, duplicate or conflicting Content-Length, a negative
one, obs-fold and bare LF are refused with 400 and the connection closed) and give the same
answer, byte for byte but for the date and the request ID. A valid request pipelined before a
malformed one is answered before the malformed one's 400.
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
from collections.abc import Iterator

import onnx
import onnx_builders
import orjson
import pytest
from servers import ServerProcess, identity_name, running_server

pytestmark = pytest.mark.slow  # end to end: real server processes

MODEL = identity_name("FP32")
BODY = orjson.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
)
_VARYING = re.compile(rb"^(date|x-request-id): [^\r]*\r\n", re.MULTILINE | re.IGNORECASE)


@pytest.fixture(scope="module")
def lanes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    """The fast lane and the ASGI lane, each a server of its own over one small model."""
    root = tmp_path_factory.mktemp("framing")
    models = root / "models"
    models.mkdir()
    onnx.save(onnx_builders.identity("FP32"), str(models / "identity.onnx"))
    config = models / "serve.yaml"
    config.write_text(
        "server: {}\nmodels:\n"
        f"  - {{name: {MODEL}, modelFormat: {{name: onnx}}, storageUri: identity.onnx}}\n"
    )
    with contextlib.ExitStack() as stack:
        servers = {"fast": stack.enter_context(running_server(config, grpc=False))}
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("SERVEKIT_HTTP_FAST", "0")
            servers["asgi"] = stack.enter_context(running_server(config, grpc=False))
        yield servers


def _exchange(server: ServerProcess, parts: list[bytes], pause: float = 0.0) -> bytes:
    """Send ``parts`` on a new connection (``pause`` s between them), then read until the
    server closes it (bounded)."""
    host, port = server.http_host_port.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        for part in parts:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(part)
            if pause:
                time.sleep(pause)  # the client's own pace (a trickled request)
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer += chunk
        return answer


def _request(
    *lines: str, body: bytes = BODY, version: str = "HTTP/1.1", length: bool = True
) -> bytes:
    head = [f"POST /v2/models/{MODEL}/infer {version}", "host: 127.0.0.1", *lines]
    if length:
        head.append(f"content-length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _statuses(answer: bytes) -> list[int]:
    return [int(m) for m in re.findall(rb"HTTP/1\.1 (\d{3}) [A-Z]", answer)]


CASES: dict[str, tuple[list[bytes], list[int]]] = {
    "content-length and transfer-encoding": (
        [_request("transfer-encoding: chunked", body=b"4\r\n{}{}\r\n0\r\n\r\n")],
        [400],
    ),
    "duplicate content-length": ([_request(f"content-length: {len(BODY)}")], [400]),
    "conflicting content-length": ([_request(f"content-length: {len(BODY) + 1}")], [400]),
    "negative content-length": (
        [_request("content-length: -5", body=b"", length=False)],
        [400],
    ),
    "content-length list": (
        [_request(f"content-length: {len(BODY)}, {len(BODY)}", length=False)],
        [400],
    ),
    "obs-fold": ([_request("x-folded: a", " b")], [400]),
    "bare LF": ([_request("connection: close").replace(b"\r\n", b"\n")], [400]),
    "pipelined after connection: close": (
        [_request("connection: close") + _request()],
        [200],
    ),
    "HTTP/1.0": ([_request(version="HTTP/1.0")], [200]),
    "two pipelined": ([_request() + _request("connection: close")], [200, 200]),
    "valid then malformed": ([_request() + b"GARBAGE\r\n\r\n"], [200, 400]),
    "oversize headers": ([_request("x-big: " + "a" * 70_000)], [431]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_both_lanes_frame_alike(lanes: dict[str, ServerProcess], case: str) -> None:
    parts, expected = CASES[case]
    answers = {lane: _exchange(server, parts) for lane, server in lanes.items()}
    for lane, answer in answers.items():
        assert _statuses(answer) == expected, (lane, answer)
    fast, asgi = (_VARYING.sub(b"", answers[lane]) for lane in ("fast", "asgi"))
    assert fast == asgi


def test_a_trickled_request_is_answered_alike(lanes: dict[str, ServerProcess]) -> None:
    """A request sent a few bytes at a time (headers and body): one answer, the same."""
    whole = _request("connection: close")
    parts = [whole[i : i + 16] for i in range(0, len(whole), 16)]
    answers = {lane: _exchange(server, parts, pause=0.01) for lane, server in lanes.items()}
    for lane, answer in answers.items():
        assert _statuses(answer) == [200], (lane, answer)
    assert _VARYING.sub(b"", answers["fast"]) == _VARYING.sub(b"", answers["asgi"])


def test_the_answer_before_a_malformed_request_is_written_first(
    lanes: dict[str, ServerProcess],
) -> None:
    """Two valid requests then a malformed one in one write: 200, 200, then 400 and close."""
    parts = [_request() + _request() + b"POST / HTTP/1.1\r\ncontent-length: -1\r\n\r\n"]
    for lane, server in lanes.items():
        answer = _exchange(server, parts)
        assert _statuses(answer) == [200, 200, 400], (lane, answer)
        assert answer.count(b'"outputs"') == 2, (lane, answer)
