"""Slow bodies do not take the server (issue 36): the token before the body, a fair share of the
requests in flight per client address, a deadline for the whole body, the nearer timer.

300 "drippers" connect from 127.0.0.1, send an inference request's headers announcing a 100 kB
body, then one body byte per connection every second (a test-only cadence; the issue's attacker
sent one every ~5 s), reconnecting when answered. Meanwhile a normal client is timed: every one
of its requests must be answered 200. Each server is a real ``servekit serve``; every wait is
bounded.
"""

from __future__ import annotations

import contextlib
import http.client
import resource
import selectors
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnx_builders
import orjson
import pytest
from servers import ServerProcess, identity_name, running_server

pytestmark = pytest.mark.slow  # end to end: real server processes

DRIPPERS = 300
DRIP_EVERY = 1.0
"""Seconds between two body bytes of one dripper."""
WATCHED = 10.0
"""Seconds the normal client is watched while the drippers hold on."""
TOKEN = "s3cret-token-36"
MODEL = identity_name("FP32")
BODY = orjson.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
)


@pytest.fixture(autouse=True)
def _descriptors() -> None:
    """300 drippers and their replacements need more than a 1,024 open-file limit may leave."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def _store(root: Path, server: str = "{}") -> Path:
    models = root / "models"
    models.mkdir(parents=True)
    onnx.save(onnx_builders.identity("FP32"), str(models / "identity.onnx"))
    config = models / "serve.yaml"
    config.write_text(
        f"server: {server}\nmodels:\n"
        f"  - {{name: {MODEL}, modelFormat: {{name: onnx}}, storageUri: identity.onnx}}\n"
    )
    return config


def _address(server: ServerProcess) -> tuple[str, int]:
    host, port = server.http_host_port.rsplit(":", 1)
    return host, int(port)


@dataclass
class _Dripper:
    sock: socket.socket
    answer: bytes = b""
    since: float = field(default_factory=time.monotonic)
    answered: float = 0.0


@dataclass
class Drippers:
    """Connections from 127.0.0.1 holding inference requests by sending their bodies slowly."""

    address: tuple[str, int]
    head: bytes
    open: dict[int, _Dripper] = field(default_factory=dict)
    selector: selectors.DefaultSelector = field(default_factory=selectors.DefaultSelector)
    statuses: dict[int, int] = field(default_factory=dict)
    """Status -> how many answers of it the drippers read."""
    closed_after_answer: int = 0
    """Answers followed by the server closing the connection."""
    gone: int = 0
    """Connections closed (or reset) with no answer."""
    kept_open: int = 0
    """Answers after which the server kept the connection open for a second."""

    def connect(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(5)
        sock.connect(self.address)
        sock.sendall(self.head)
        sock.setblocking(False)
        self.open[sock.fileno()] = _Dripper(sock)
        self.selector.register(sock, selectors.EVENT_READ)

    def drip(self) -> None:
        """One body byte on every open connection."""
        for dripper in list(self.open.values()):
            with contextlib.suppress(OSError):
                dripper.sock.send(b"0")

    def read(self) -> None:
        """Take what the server answered; a connection it closed is replaced."""
        for key, _ in self.selector.select(timeout=0):
            dripper = self.open.get(key.fd)
            if dripper is None:
                continue
            try:
                chunk = dripper.sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if chunk:
                if not dripper.answer:
                    dripper.answered = time.monotonic()
                    status = int(chunk.split(b" ", 2)[1])
                    self.statuses[status] = self.statuses.get(status, 0) + 1
                dripper.answer += chunk
                continue
            if dripper.answer:
                self.closed_after_answer += 1
            else:
                self.gone += 1
            self._drop(key.fd)

    def held(self, older_than: float) -> int:
        """Connections unanswered that sent their headers at least ``older_than`` s ago."""
        now = time.monotonic()
        return sum(1 for d in self.open.values() if not d.answer and now - d.since >= older_than)

    def refill(self, count: int) -> None:
        """Reconnect up to ``count`` connections (answered ones the server left open for a
        second are dropped first)."""
        now = time.monotonic()
        for fd in [fd for fd, d in self.open.items() if d.answer and now - d.answered > 1]:
            self.kept_open += 1
            self._drop(fd)
        for _ in range(count - len(self.open)):
            self.connect()

    def _drop(self, fd: int) -> None:
        dripper = self.open.pop(fd)
        self.selector.unregister(dripper.sock)
        dripper.sock.close()

    def close(self) -> None:
        for fd in list(self.open):
            self._drop(fd)
        self.selector.close()


@contextlib.contextmanager
def drippers(server: ServerProcess, headers: str = "") -> Iterator[Drippers]:
    host, port = _address(server)
    head = (
        f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nhost: {host}:{port}\r\n"
        f"content-type: application/json\r\n{headers}content-length: 100000\r\n\r\n{{"
    ).encode()
    crowd = Drippers((host, port), head)
    try:
        crowd.refill(DRIPPERS)
        yield crowd
    finally:
        crowd.close()


def _infer(server: ServerProcess, source: str, token: str | None = None) -> int:
    """One normal inference request from ``source`` (an address of 127.0.0.0/8): its status."""
    host, port = _address(server)
    connection = http.client.HTTPConnection(host, port, timeout=5, source_address=(source, 0))
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    try:
        connection.request("POST", f"/v2/models/{MODEL}/infer", body=BODY, headers=headers)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def _watch(server: ServerProcess, crowd: Drippers, source: str, token: str | None) -> list[int]:
    """The normal client's statuses over ``WATCHED`` seconds while the drippers drip; each
    answer is taken only once most drippers have held their request a second."""
    statuses: list[int] = []
    held: list[int] = []
    deadline = time.monotonic() + WATCHED
    next_drip = time.monotonic()
    while time.monotonic() < deadline:
        crowd.read()
        now = time.monotonic()
        if now >= next_drip:
            crowd.drip()
            crowd.refill(DRIPPERS)
            next_drip = now + DRIP_EVERY
        held.append(crowd.held(older_than=1.0))
        statuses.append(_infer(server, source, token))
    crowd.read()
    crowd.held_seen = max(held)  # type: ignore[attr-defined]
    return statuses


@pytest.mark.parametrize("lane", ["fast", "asgi"])
def test_unauthenticated_slow_bodies_leave_the_token_holder_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lane: str
) -> None:
    """With a token, a request without it is answered 401 at the end of its headers and its
    connection closed: it never holds a slot while its body drips."""
    monkeypatch.setenv("SERVEKIT_TOKEN", TOKEN)
    if lane == "asgi":
        monkeypatch.setenv("SERVEKIT_HTTP_FAST", "0")
    with running_server(_store(tmp_path), grpc=False) as server:
        assert _infer(server, "127.0.0.1", TOKEN) == 200
        assert _infer(server, "127.0.0.1") == 401
        with drippers(server) as crowd:
            statuses = _watch(server, crowd, "127.0.0.1", TOKEN)
            assert statuses and set(statuses) == {200}, statuses
            # the drippers were accepted and refused for their token, not for the server's caps
            assert crowd.statuses.get(401, 0) >= DRIPPERS, crowd.statuses
            assert set(crowd.statuses) == {401}, crowd.statuses
            # ... and each connection closed after its 401: its body is never read
            assert crowd.kept_open == 0, (crowd.kept_open, crowd.closed_after_answer)
            assert crowd.closed_after_answer >= DRIPPERS, (crowd.closed_after_answer, crowd.gone)
        server.assert_healthy()


@pytest.mark.parametrize("lane", ["fast", "asgi"])
def test_slow_bodies_from_one_address_leave_slots_to_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lane: str
) -> None:
    """Without a token, 300 dripping requests from 127.0.0.1 hold at most their address's share
    of maxRequestsInFlight (half of 256): a client from 127.0.0.2 is answered 200 throughout."""
    monkeypatch.delenv("SERVEKIT_TOKEN", raising=False)
    if lane == "asgi":
        monkeypatch.setenv("SERVEKIT_HTTP_FAST", "0")
    with running_server(_store(tmp_path), grpc=False) as server:
        assert _infer(server, "127.0.0.2") == 200
        with drippers(server) as crowd:
            statuses = _watch(server, crowd, "127.0.0.2", None)
            assert statuses and set(statuses) == {200}, statuses
            # the drippers were held (their share of the slots), not refused at connect
            assert crowd.held_seen >= 100, crowd.held_seen  # type: ignore[attr-defined]
            assert 408 not in crowd.statuses, crowd.statuses
        server.assert_healthy()


# --- the body's deadlines and the connection cap --------------------------------------------------


def _raw(
    server: ServerProcess, data: bytes, drip: bytes = b"", every: float = 0.0
) -> tuple[float, bytes]:
    """Send ``data``, then ``drip`` a byte at a time every ``every`` s, on a new connection;
    read until the server closes it. Returns the seconds from the first byte, and the answer."""
    with socket.create_connection(_address(server), timeout=20) as sock:
        started = time.monotonic()
        sock.sendall(data)
        sock.settimeout(every or 20)
        answer = b""
        for byte in drip:
            try:
                answer = sock.recv(65536)
            except TimeoutError:
                with contextlib.suppress(OSError):
                    sock.sendall(bytes([byte]))
                continue
            break
        sock.settimeout(20)
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer += chunk
        return time.monotonic() - started, answer


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def _head(server: ServerProcess, length: int, extra: str = "") -> bytes:
    host, port = _address(server)
    return (
        f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nhost: {host}:{port}\r\n"
        f"content-type: application/json\r\n{extra}content-length: {length}\r\n\r\n"
    ).encode()


@pytest.fixture(scope="module", params=["fast", "asgi"])
def timed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A server whose body may pause 3 s (the header timeout stays 10 s), on either lane."""
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "asgi":
            patch.setenv("SERVEKIT_HTTP_FAST", "0")
        config = _store(tmp_path_factory.mktemp("timed"), "{network: {bodyTimeoutSeconds: 3}}")
        with running_server(config, grpc=False) as server:
            yield server


def test_a_stalled_body_is_cut_at_the_body_timeout_not_the_header_timeout(
    timed: ServerProcess,
) -> None:
    """The nearer timer wins: bodyTimeoutSeconds 3 answers 408 at about 3 s, not at 10."""
    took, answer = _raw(timed, _head(timed, 1000) + b'{"inputs":')
    assert _status(answer) == 408, answer
    assert b"request body not received within 3 s" in answer
    assert 2.5 < took < 6.0, took
    timed.assert_healthy()


@pytest.fixture(scope="module", params=["fast", "asgi"])
def deadlined(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A server that gives a body 3 s, then asks 1,000 bytes/s on average, and takes 24
    connections at most; one client address may hold every request slot."""
    network = (
        "{bodyDeadlineSeconds: 3, bodyMinBytesPerSecond: 1000, maxConnections: 24,"
        " clientShareOfRequests: 1}"
    )
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "asgi":
            patch.setenv("SERVEKIT_HTTP_FAST", "0")
        config = _store(tmp_path_factory.mktemp("deadlined"), f"{{network: {network}}}")
        with running_server(config, grpc=False) as server:
            yield server


def test_a_dripping_body_is_cut_at_the_whole_body_deadline(deadlined: ServerProcess) -> None:
    """A byte every 0.5 s never pauses long enough for bodyTimeoutSeconds (30 s), and is cut
    at bodyDeadlineSeconds: it is far below the minimum rate."""
    took, answer = _raw(deadlined, _head(deadlined, 1000), drip=b"x" * 40, every=0.5)
    assert _status(answer) == 408, answer
    assert b"request body not received within 3 s (nor at 1000 bytes/s)" in answer
    assert 2.5 < took < 6.0, took
    deadlined.assert_healthy()


def test_a_body_moving_at_the_minimum_rate_outlives_the_deadline(deadlined: ServerProcess) -> None:
    """A 10,000-byte body sent at about 2,000 bytes/s takes 5 s, past the 3 s deadline, and is
    answered: the rate keeps a slow but moving upload."""
    body = BODY[:-1] + b" " * (10_000 - len(BODY)) + BODY[-1:]
    with socket.create_connection(_address(deadlined), timeout=20) as sock:
        started = time.monotonic()
        sock.sendall(_head(deadlined, len(body)))
        for offset in range(0, len(body), 200):  # 200 bytes every 0.1 s
            sock.sendall(body[offset : offset + 200])
            time.sleep(0.1)  # the client's own pace, not a wait for the server
        took = time.monotonic() - started
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    assert took > 4.0, took
    assert _status(answer) == 200, answer


def test_a_connection_sending_its_body_is_displaced_at_the_connection_cap(
    deadlined: ServerProcess,
) -> None:
    """24 connections each in the middle of a body fill maxConnections: a 25th connection
    displaces the oldest of them (closed, no answer) and is answered."""
    held: list[socket.socket] = []
    try:
        for _ in range(24):
            sock = socket.create_connection(_address(deadlined), timeout=10)
            sock.sendall(_head(deadlined, 1000) + b"{")
            held.append(sock)
        # the 24th is read and in its body: a probe on a 25th connection now must displace one
        host, port = _address(deadlined)
        probe = f"GET /v2/health/live HTTP/1.1\r\nhost: {host}:{port}\r\nconnection: close\r\n\r\n"
        _, answer = _raw(deadlined, probe.encode())
        assert _status(answer) == 200, answer
        held[0].settimeout(5)
        assert held[0].recv(65536) == b""  # the oldest: closed without an answer
    finally:
        for sock in held:
            sock.close()
    deadlined.assert_healthy()
