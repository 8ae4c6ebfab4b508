"""One write per response, seen from a raw socket on a real server (app/servekit/http/connection.py
``_Coalescer``).

The count is the kernel's, not a timing: Linux's ``TCP_INFO`` tells a socket how many segments
that carried data it received (``tcpi_data_segs_in``). On loopback a write of a few hundred bytes
is one segment and two writes are two (the server sets TCP_NODELAY), so a small inference answer
must arrive as exactly one data segment, and so in the client's first ``recv``. Also: pipelined
requests are answered in order, ``connection: close`` closes right after the body, and a
Server-Sent Events answer delivers its first event while the model is still making the next.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import onnx
import onnx_builders
import orjson
import pytest
from servers import ServerProcess, identity_name, running_server

pytestmark = pytest.mark.slow  # end to end: a real server process and raw sockets

IDENTITY = identity_name("FP32")
INFER = orjson.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
)
TCPI_DATA_SEGS_IN = 152
"""Offset of ``tcpi_data_segs_in`` (u32) in Linux's ``struct tcp_info`` (since Linux 4.6)."""

USER_MODULE = """
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

RELEASE = Path(__file__).with_name("release")


class Token(TypedDict):
    text_output: str


def paced(text_input: list[str]) -> Iterator[Token]:
    yield {"text_output": "first"}
    deadline = time.monotonic() + 30  # the test releases it; bounded all the same
    while not RELEASE.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    yield {"text_output": "second"}
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("writes")
    onnx.save(onnx_builders.identity("FP32"), str(root / "identity.onnx"))
    (root / "user_models.py").write_text(USER_MODULE)
    (root / "serve.yaml").write_text(
        "models:\n"
        f"  - {{name: {IDENTITY}, modelFormat: {{name: onnx}}, storageUri: identity.onnx}}\n"
        "  - {name: paced, modelFormat: {name: python}, entrypoint: 'user_models:paced'}\n"
    )
    return root


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[ServerProcess]:
    with running_server(folder / "serve.yaml", grpc=False) as process:
        yield process


@pytest.fixture
def sock(server: ServerProcess) -> Iterator[socket.socket]:
    host, port = server.http_host_port.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as client:
        yield client


def data_segments_in(client: socket.socket) -> int:
    info = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    assert len(info) >= TCPI_DATA_SEGS_IN + 4, "this kernel's tcp_info has no data_segs_in"
    count: int = struct.unpack_from("I", info, TCPI_DATA_SEGS_IN)[0]
    return count


def request(path: str, body: bytes = b"", extra: bytes = b"") -> bytes:
    method = b"POST" if body else b"GET"
    head = b"%s %s HTTP/1.1\r\nhost: test\r\n" % (method, path.encode())
    if body:
        head += b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
    return head + extra + b"\r\n" + body


class Reader:
    """HTTP/1.1 responses read off a raw socket (content-length or chunked), in order."""

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.buffer = b""
        self.reads: list[bytes] = []

    def _more(self) -> None:
        data = self.client.recv(1 << 16)
        assert data, f"connection closed; had {self.buffer!r}"
        self.reads.append(data)
        self.buffer += data

    def until(self, marker: bytes) -> bytes:
        """Everything up to and including ``marker`` (consumed)."""
        while marker not in self.buffer:
            self._more()
        end = self.buffer.index(marker) + len(marker)
        taken, self.buffer = self.buffer[:end], self.buffer[end:]
        return taken

    def response(self) -> tuple[bytes, bytes]:
        """The next response's header block and its body."""
        head = self.until(b"\r\n\r\n")
        lines = head.lower().split(b"\r\n")
        length = next((int(line[15:]) for line in lines if line.startswith(b"content-length:")), 0)
        while len(self.buffer) < length:
            self._more()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return head, body


def test_a_small_inference_answer_is_one_segment_in_one_recv(sock: socket.socket) -> None:
    reader = Reader(sock)
    for _ in range(20):  # on one kept-alive connection
        before = data_segments_in(sock)
        reads = len(reader.reads)
        sock.sendall(request(f"/v2/models/{IDENTITY}/infer", INFER))
        head, body = reader.response()
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert orjson.loads(body)["outputs"][0]["data"] == [1, 2, 3, 4]
        assert data_segments_in(sock) - before == 1, "headers and body in one segment"
        assert len(reader.reads) - reads == 1, "the first recv held the whole answer"
        assert reader.buffer == b""


def test_pipelined_requests_are_answered_in_order(sock: socket.socket) -> None:
    before = data_segments_in(sock)
    sock.sendall(
        request(f"/v2/models/{IDENTITY}/infer", INFER)
        + request("/v2/health/ready")
        + request(f"/v2/models/{IDENTITY}/infer", INFER.replace(b"[1,2,3,4]", b"[5,6,7,8]"))
    )
    reader = Reader(sock)
    answers = [reader.response() for _ in range(3)]
    assert all(head.startswith(b"HTTP/1.1 200 OK\r\n") for head, _ in answers)
    assert orjson.loads(answers[0][1])["outputs"][0]["data"] == [1, 2, 3, 4]
    assert orjson.loads(answers[1][1]) == {"ready": True}
    assert orjson.loads(answers[2][1])["outputs"][0]["data"] == [5, 6, 7, 8]
    assert data_segments_in(sock) - before == 3
    assert reader.buffer == b""


def test_connection_close_closes_after_the_body(sock: socket.socket) -> None:
    sock.sendall(request(f"/v2/models/{IDENTITY}/infer", INFER, b"connection: close\r\n"))
    reader = Reader(sock)
    head, body = reader.response()
    assert b"connection: close\r\n" in head.lower()
    assert orjson.loads(body)["outputs"][0]["data"] == [1, 2, 3, 4]
    assert sock.recv(1 << 16) == b""  # closed by the server, nothing after the body
    assert data_segments_in(sock) == 1


def test_a_stream_delivers_its_first_event_while_the_model_makes_the_next(
    sock: socket.socket, folder: Path
) -> None:
    release = folder / "release"
    release.unlink(missing_ok=True)
    try:
        sock.sendall(request("/v2/models/paced/generate_stream", b'{"text_input": "x"}'))
        reader = Reader(sock)
        head = reader.until(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"transfer-encoding: chunked" in head.lower()
        first = reader.until(b"\n\n\r\n")
        assert b'"text_output":"first"' in first
        assert not release.exists()  # the model is still held on the second token
        release.touch()
        rest = reader.until(b"\r\n0\r\n\r\n")
        assert b'"text_output":"second"' in rest
    finally:
        release.unlink(missing_ok=True)
