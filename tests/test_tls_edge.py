"""The TLS handshake is inside the edge's limits (issue 22, finding 8).

Connections that open TCP and never send a ClientHello used to escape the connection cap (the
edge counted a connection only once its handshake was done) and were closed only by the event
loop's own 60 s handshake timeout: enough of them ran the server out of descriptors and mutual
TLS clients failed for a minute. Here a mutual-TLS server with a low ``maxConnections`` gets
three times that many silent TCP connections; the cap counts them from accept (the oldest are
closed at once, displaced by newer ones), a real mTLS client is still served at once, and the
silent ones left are closed when ``headerTimeoutSeconds`` passes.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trustme
from servers import ServerProcess, running_server

pytestmark = pytest.mark.slow  # a real server process and sockets (tests/tiers.py)

CAP = 12
SILENT = 3 * CAP
HEADER_TIMEOUT = 4.0


@pytest.fixture
def mtls(tmp_path: Path) -> tuple[Path, ssl.SSLContext]:
    """serve.yaml of a mutual-TLS server with a low connection cap, and a client context."""
    server_ca, client_ca = trustme.CA(), trustme.CA()
    cert = server_ca.issue_cert("127.0.0.1")
    client = client_ca.issue_cert("client@servekit.test")
    server_ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    client_ca.cert_pem.write_to_path(str(tmp_path / "client-ca.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    (tmp_path / "server.pem").write_bytes(b"".join(p.bytes() for p in cert.cert_chain_pems))
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server:\n"
        "  tls: {certFile: server.pem, keyFile: server.key, clientCaFile: client-ca.pem}\n"
        f"  network: {{maxConnections: {CAP}, headerTimeoutSeconds: {HEADER_TIMEOUT}}}\n"
        "models: []\n"
    )
    context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    client.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "client.pem"))
    context.load_cert_chain(str(tmp_path / "client.pem"))
    return config, context


@pytest.fixture
def server(mtls: tuple[Path, ssl.SSLContext]) -> Iterator[ServerProcess]:
    config, context = mtls
    with running_server(config, grpc=False, ssl_context=context) as running:
        yield running


def _closed(sock: socket.socket) -> bool:
    """Whether the server has closed this (silent) connection: EOF or reset, without waiting."""
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _silent_connections(host: str, port: int, count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.create_connection((host, port), timeout=5)
        sock.setblocking(False)
        sockets.append(sock)
    return sockets


def test_silent_connections_count_from_accept_and_time_out(server: ServerProcess) -> None:
    host, port = server.http_host_port.rsplit(":", 1)
    silent = _silent_connections(host, int(port), SILENT)
    try:
        opened = time.monotonic()
        # A real mutual-TLS client is served at once, not after the silent ones time out.
        with server.http_client(timeout=HEADER_TIMEOUT - 1) as client:
            assert client.get("/v2/health/live").json() == {"live": True}
        served = time.monotonic()
        assert served - opened < HEADER_TIMEOUT
        # The cap counted the silent connections from accept: all but the newest CAP - 1
        # (the client's connection took a place) were closed before any timeout ran out.
        at_least = SILENT - CAP + 1
        deadline = opened + HEADER_TIMEOUT - 0.5
        while sum(map(_closed, silent)) < at_least and time.monotonic() < deadline:
            time.sleep(0.05)
        closed = sum(map(_closed, silent))
        assert closed >= at_least, f"{closed} of {SILENT} silent connections closed at once"
        # The rest never sent a ClientHello: closed when headerTimeoutSeconds passed.
        deadline = opened + HEADER_TIMEOUT + 10
        while not all(map(_closed, silent)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(map(_closed, silent)), "silent connections outlived headerTimeoutSeconds"
        assert time.monotonic() - opened >= HEADER_TIMEOUT - 0.5  # not closed before it
    finally:
        for sock in silent:
            sock.close()
    # Still serving, and a client that sends nothing but a plain HTTP request is not served.
    with server.http_client(timeout=5) as client:
        assert client.get("/v2/health/ready").status_code == 200
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://{server.http_host_port}/v2/health/live", timeout=5)
    assert server.alive(), server.log()


def test_a_client_stuck_in_its_handshake_is_closed(server: ServerProcess) -> None:
    """Half a ClientHello and then silence: closed at headerTimeoutSeconds, not at 60 s."""
    host, port = server.http_host_port.rsplit(":", 1)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    context = ssl.create_default_context()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    sock = socket.create_connection((host, int(port)), timeout=5)
    try:
        opened = time.monotonic()
        sock.sendall(hello[: len(hello) // 2])
        sock.settimeout(HEADER_TIMEOUT + 10)
        try:
            answer = sock.recv(1024)
        except ConnectionResetError:
            answer = b""
        waited = time.monotonic() - opened
        assert answer == b"", answer  # nothing in the clear, no HTTP answer
        assert HEADER_TIMEOUT - 0.5 <= waited < HEADER_TIMEOUT + 10, waited
    finally:
        sock.close()
