"""Raw HTTP/1.1 on a socket against both ways into inference, for the framing tests.

A server answers a plain inference request either at the connection (the inference lane,
app/servekit/http/inference_lane.py ``read_plainly``) or through uvicorn's
cycle and Litestar's route (``SERVEKIT_HTTP_FAST=0``). tests/test_http_framing.py and
tests/test_http_conformance.py send the same bytes to one server of each kind and compare what
comes back; this module holds what both need: the pair of servers over one identity model, the
request bytes, and a reader that splits what a connection answered into responses.
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import onnx_builders
import orjson
import pytest
from servers import ServerProcess, identity_name, running_server

MODEL = identity_name("FP32")
TARGET = f"/v2/models/{MODEL}/infer"
BODY = orjson.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
)
SLOW = "slow_echo"
"""A Python model answering in its thread after a pause: an answer that is not ready when
the next pipelined request is read."""
SLOW_ECHO = """
import time
import numpy as np
from numpy.typing import NDArray


def predict(INPUT0: NDArray[np.float32]) -> NDArray[np.float32]:
    time.sleep(0.05)
    return INPUT0
"""
VARYING = re.compile(rb"^(date|x-request-id): [^\r]*\r\n", re.MULTILINE | re.IGNORECASE)
"""Header lines that differ between any two answers (not a difference between the lanes)."""
LANES = ("fast", "asgi")
READ_TIMEOUT = 10.0
"""Seconds any one read may wait (a lane that hangs fails the test instead of the run)."""


@contextlib.contextmanager
def both_lanes(root: Path, server: str = "{}") -> Iterator[dict[str, ServerProcess]]:
    """The fast lane and the ASGI lane, each a server of its own over the FP32 identity model
    (``server``: the serve.yaml's ``server:`` block, as flow-style YAML)."""
    models = root / "models"
    models.mkdir()
    onnx.save(onnx_builders.identity("FP32"), str(models / "identity.onnx"))
    (models / "slow_echo.py").write_text(SLOW_ECHO)
    config = models / "serve.yaml"
    config.write_text(
        f"server: {server}\nmodels:\n"
        f"  - {{name: {MODEL}, modelFormat: {{name: onnx}}, storageUri: identity.onnx}}\n"
        f"  - {{name: {SLOW}, modelFormat: {{name: python}}, entrypoint: 'slow_echo:predict'}}\n"
    )
    with contextlib.ExitStack() as stack:
        servers = {"fast": stack.enter_context(running_server(config, grpc=False))}
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("SERVEKIT_HTTP_FAST", "0")
            servers["asgi"] = stack.enter_context(running_server(config, grpc=False))
        yield servers


def address(server: ServerProcess) -> tuple[str, int]:
    host, port = server.http_host_port.rsplit(":", 1)
    return host, int(port)


def exchange(server: ServerProcess, parts: list[bytes], pause: float = 0.0) -> bytes:
    """Send ``parts`` on a new connection (``pause`` s between them), then read until the
    server closes it (bounded)."""
    with socket.create_connection(address(server), timeout=READ_TIMEOUT) as sock:
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


def request(
    *lines: str, body: bytes = BODY, version: str = "HTTP/1.1", length: bool = True
) -> bytes:
    """A V2 inference POST: its request line, a Host, ``lines`` as given, and (``length``)
    a Content-Length for ``body``."""
    head = [f"POST {TARGET} {version}", "host: 127.0.0.1", *lines]
    if length:
        head.append(f"content-length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def statuses(answer: bytes) -> list[int]:
    return [int(m) for m in re.findall(rb"HTTP/1\.1 (\d{3}) [A-Z]", answer)]


@dataclass(frozen=True)
class Response:
    """One response as read from the socket, reduced to what both lanes must agree on."""

    status: int
    headers: tuple[tuple[str, str], ...]
    """Header lines but the varying ones (date, request ID), lower-cased names, sorted."""
    body: Any
    """The JSON body parsed (``{"outputs": ...}``, ``{"error": ...}``), else the raw bytes."""

    @property
    def closes(self) -> bool:
        return ("connection", "close") in self.headers


@dataclass(frozen=True)
class Conversation:
    """What one connection answered: the responses read, and whether it was closed after."""

    responses: tuple[Response, ...]
    closed: bool
    """The connection was closed after the last response (a later request got nothing)."""
    tail: bytes = b""
    """Bytes after the last whole response (none, from a server that frames its answers)."""
    stalled: bool = False
    """Open after the last response, but the probe got no answer within ``READ_TIMEOUT``:
    the connection still waits for bytes of a request it answered (a body it refused)."""

    @property
    def statuses(self) -> list[int]:
        return [r.status for r in self.responses]


def split_responses(data: bytes) -> tuple[list[Response], bytes]:
    """The whole responses at the start of ``data``, and what follows them."""
    responses: list[Response] = []
    while True:
        end = data.find(b"\r\n\r\n")
        if end < 0:
            return responses, data
        head = data[:end].decode("latin-1").split("\r\n")
        rest = data[end + 4 :]
        match = re.fullmatch(r"HTTP/1\.1 (\d{3}) .*", head[0])
        if match is None:
            return responses, data
        headers = [tuple(p.strip() for p in line.split(":", 1)) for line in head[1:]]
        fields = {name.lower(): value for name, value in headers}
        if match[1].startswith("1"):  # an interim answer (100 Continue): no body
            body = b""
        elif fields.get("transfer-encoding", "").lower() == "chunked":
            body, rest, whole = _dechunk(rest)
            if not whole:
                return responses, data
        elif "content-length" in fields:
            size = int(fields["content-length"])
            if len(rest) < size:
                return responses, data
            body, rest = rest[:size], rest[size:]
        else:  # delimited by the close
            body, rest = rest, b""
        kept = tuple(
            sorted(
                (name.lower(), value)
                for name, value in headers
                if name.lower() not in ("date", "x-request-id")
            )
        )
        parsed: Any = body
        if fields.get("content-type", "").startswith("application/json"):
            with contextlib.suppress(orjson.JSONDecodeError):
                parsed = orjson.loads(body)
        responses.append(Response(int(match[1]), kept, parsed))
        data = rest


def _dechunk(data: bytes) -> tuple[bytes, bytes, bool]:
    body = b""
    while True:
        line_end = data.find(b"\r\n")
        if line_end < 0:
            return body, data, False
        size = int(data[:line_end].split(b";")[0], 16)
        start = line_end + 2
        if len(data) < start + size + 2:
            return body, data, False
        body += data[start : start + size]
        data = data[start + size + 2 :]
        if size == 0:
            return body, data, True


PROBE = b"GET /v2/health/live HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"
"""Sent when the answers read left the connection open: answered, it was not closed."""


def converse(
    server: ServerProcess, parts: list[bytes], expected: int, pause: float = 0.0
) -> Conversation:
    """Send ``parts`` on a new connection (``pause`` s between them) and read its answers:
    until the server closes it, or ``expected`` responses came and the last did not say it
    closes, then a probe (``PROBE``) tells whether the connection is still open. Every read
    is bounded (``READ_TIMEOUT``); a server that leaves the request waiting fails here."""
    with socket.create_connection(address(server), timeout=READ_TIMEOUT) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for part in parts:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(part)
            if pause:
                time.sleep(pause)  # the client's own pace (a trickled request)
        data = b""
        eof = False
        while True:
            responses, tail = split_responses(data)
            if len(responses) >= expected and not (responses and responses[-1].closes):
                break
            chunk = _recv(sock)
            if not chunk:
                eof = True
                break
            data += chunk
        stalled = False
        if not eof:  # still open after what was expected: is it?
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(PROBE)
            try:
                while chunk := _recv(sock):
                    data += chunk
            except TimeoutError:
                stalled = True
        responses, tail = split_responses(data)
        if stalled:
            return Conversation(tuple(responses), False, tail, stalled=True)
        answered = [r for r in responses if r.body == {"live": True}]
        if not eof and answered:  # the probe's answer: open after the last real one
            responses.remove(answered[-1])
            return Conversation(tuple(responses), False, tail)
        return Conversation(tuple(responses), True, tail)


def _recv(sock: socket.socket) -> bytes:
    """One read; b"" at the end of the connection (closed or reset)."""
    try:
        return sock.recv(65536)
    except ConnectionResetError:
        return b""
