"""``server.tls``: HTTPS and gRPC over TLS from the server itself, plain and mutual.

Certificates are made per test session by ``trustme`` (a throwaway CA, nothing downloaded): one
CA signs the server's certificate (for 127.0.0.1, ::1 and localhost), another signs the client
certificates a mutual-TLS server accepts. Real servers (``servekit serve`` subprocesses) are
reached with the clients users run: tritonclient.http (``ssl=True``, ``ssl_options``),
tritonclient.grpc (``ssl=True``, ``root_certificates``, ``private_key``,
``certificate_chain``), httpx and ``servekit.connect``.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import onnx_builders
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import trustme
from cryptography.hazmat.primitives import serialization
from servers import LISTENING, ServerProcess, start_server
from tritonclient.utils import InferenceServerException
from waits import wait_until

import servekit

pytestmark = pytest.mark.slow

MODEL = "  - {name: add_sub, modelFormat: {name: onnx}, storageUri: add_sub.onnx}\n"


@dataclass(frozen=True)
class Pki:
    """PEM files of a test PKI (all in one folder)."""

    folder: Path
    ca: Path  # the CA that signed the server's certificate
    cert: Path  # the server's certificate chain
    key: Path  # and its key
    client_ca: Path  # the CA whose client certificates a mutual-TLS server accepts
    client_cert: Path
    client_key: Path
    stranger_cert: Path  # a client certificate from a CA the server does not know
    stranger_key: Path

    def context(self, *, client: bool = False) -> ssl.SSLContext:
        """An httpx/ssl client context trusting the server's CA (with the client cert)."""
        context = ssl.create_default_context(cafile=str(self.ca))
        if client:
            context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("tls")
    server_ca, client_ca, other_ca = trustme.CA(), trustme.CA(), trustme.CA()
    server = server_ca.issue_cert("127.0.0.1", "::1", "localhost")
    client = client_ca.issue_cert("notebook@servekit.test")
    stranger = other_ca.issue_cert("stranger@servekit.test")
    server_ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    client_ca.cert_pem.write_to_path(str(folder / "client-ca.pem"))
    server.private_key_pem.write_to_path(str(folder / "server.key"))
    (folder / "server.pem").write_bytes(b"".join(p.bytes() for p in server.cert_chain_pems))
    client.private_key_pem.write_to_path(str(folder / "client.key"))
    client.cert_chain_pems[0].write_to_path(str(folder / "client.pem"))
    stranger.private_key_pem.write_to_path(str(folder / "stranger.key"))
    stranger.cert_chain_pems[0].write_to_path(str(folder / "stranger.pem"))
    (folder / "add_sub.onnx").write_bytes(onnx_builders.add_sub().SerializeToString())
    return Pki(
        folder,
        folder / "ca.pem",
        folder / "server.pem",
        folder / "server.key",
        folder / "client-ca.pem",
        folder / "client.pem",
        folder / "client.key",
        folder / "stranger.pem",
        folder / "stranger.key",
    )


def write_config(pki: Pki, name: str, tls: str) -> Path:
    config = pki.folder / name
    config.write_text(f"server: {{tls: {tls}}}\nmodels:\n{MODEL}")
    return config


@pytest.fixture(scope="module")
def tls_server(pki: Pki) -> Iterator[ServerProcess]:
    config = write_config(pki, "tls.yaml", "{certFile: server.pem, keyFile: server.key}")
    server = start_server(config, ssl_context=pki.context())
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture(scope="module")
def mtls_server(pki: Pki) -> Iterator[ServerProcess]:
    tls = "{certFile: server.pem, keyFile: server.key, clientCaFile: client-ca.pem}"
    config = write_config(pki, "mtls.yaml", tls)
    server = start_server(config, ssl_context=pki.context(client=True))
    yield server
    assert server.stop() == 0, server.log()


def add_sub_inputs(module: Any) -> list[Any]:
    """INPUT0 = 0..15 and INPUT1 = ones, as tritonclient.http or .grpc InferInputs."""
    a, b = np.arange(16, dtype=np.float32).reshape(1, 16), np.ones((1, 16), np.float32)
    inputs = [
        module.InferInput("INPUT0", [1, 16], "FP32"),
        module.InferInput("INPUT1", [1, 16], "FP32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def check_infer(
    client: httpclient.InferenceServerClient | grpcclient.InferenceServerClient,
) -> None:
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    result = client.infer("add_sub", add_sub_inputs(module))
    expected = np.arange(16, dtype=np.float32).reshape(1, 16) + 1
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)


def test_the_listening_line_says_https_and_grpcs(tls_server: ServerProcess) -> None:
    line = next(x for x in tls_server.stdout_lines if LISTENING.match(x))
    assert line.startswith("servekit: listening https://127.0.0.1:")
    assert f" grpcs://{tls_server.grpc_target}" in line
    assert tls_server.tls


def test_tritonclient_http_over_tls(tls_server: ServerProcess, pki: Pki) -> None:
    with httpclient.InferenceServerClient(
        tls_server.http_host_port, ssl=True, ssl_options={"ca_certs": str(pki.ca)}
    ) as client:
        assert client.is_server_ready()
        check_infer(client)


def test_tritonclient_grpc_over_tls(tls_server: ServerProcess, pki: Pki) -> None:
    assert tls_server.grpc_target is not None
    with grpcclient.InferenceServerClient(
        tls_server.grpc_target, ssl=True, root_certificates=str(pki.ca)
    ) as client:
        assert client.is_server_ready()
        check_infer(client)


def test_plain_clients_and_untrusting_clients_get_nothing(
    tls_server: ServerProcess, pki: Pki
) -> None:
    plain = "http://" + tls_server.http_host_port
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{plain}/v2/health/live", timeout=5)
    with pytest.raises(httpx.ConnectError):  # a server certificate from an unknown CA
        httpx.get(f"{tls_server.http_url}/v2/health/live", timeout=5)
    assert tls_server.grpc_target is not None
    with (
        grpcclient.InferenceServerClient(tls_server.grpc_target) as client,
        pytest.raises(InferenceServerException),
    ):
        client.is_server_live(client_timeout=5)
    tls_server.assert_healthy()


def test_app_connect_over_https_with_a_ca_bundle(tls_server: ServerProcess, pki: Pki) -> None:
    remote = servekit.connect(tls_server.http_url, ca_file=pki.ca)
    try:
        assert remote.url.startswith("https://")
        assert {row["name"] for row in remote.models} == {"add_sub"}
        out = remote.infer(
            "add_sub",
            {"INPUT0": np.zeros((1, 16), np.float32), "INPUT1": np.ones((1, 16), np.float32)},
        )
        np.testing.assert_array_equal(out["OUTPUT0"], np.ones((1, 16), np.float32))
    finally:
        remote.close()
    with pytest.raises(ConnectionError):  # the system's CAs do not know the test CA
        servekit.connect(tls_server.http_url)


def test_mutual_tls_accepts_a_client_certificate(mtls_server: ServerProcess, pki: Pki) -> None:
    options = {
        "ca_certs": str(pki.ca),
        "certfile": str(pki.client_cert),
        "keyfile": str(pki.client_key),
    }
    with httpclient.InferenceServerClient(
        mtls_server.http_host_port, ssl=True, ssl_options=options
    ) as client:
        assert client.is_server_ready()
        check_infer(client)
    assert mtls_server.grpc_target is not None
    with grpcclient.InferenceServerClient(
        mtls_server.grpc_target,
        ssl=True,
        root_certificates=str(pki.ca),
        private_key=str(pki.client_key),
        certificate_chain=str(pki.client_cert),
    ) as client:
        assert client.is_server_ready()
        check_infer(client)
    remote = servekit.connect(
        mtls_server.http_url, ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key
    )
    try:
        assert {row["name"] for row in remote.models} == {"add_sub"}
    finally:
        remote.close()


@pytest.mark.parametrize("who", ["nobody", "stranger"])
def test_mutual_tls_refuses_clients_without_an_accepted_certificate(
    mtls_server: ServerProcess, pki: Pki, who: str
) -> None:
    """No client certificate, or one from a CA the server does not know: refused on both
    protocols (before any request is read)."""
    options = {"ca_certs": str(pki.ca)}
    grpc_options: dict[str, str] = {}
    if who == "stranger":
        options |= {"certfile": str(pki.stranger_cert), "keyfile": str(pki.stranger_key)}
        grpc_options = {
            "private_key": str(pki.stranger_key),
            "certificate_chain": str(pki.stranger_cert),
        }
    client = httpclient.InferenceServerClient(
        mtls_server.http_host_port, ssl=True, ssl_options=options, connection_timeout=5
    )
    try:
        # The TLS 1.3 handshake ends before the server checks the client: the refusal shows
        # as the connection closing on the request (or an SSL error / reset, by timing).
        with pytest.raises((OSError, http.client.HTTPException, InferenceServerException)):
            client.is_server_live()
    finally:
        client.close()
    context = pki.context()
    if who == "stranger":
        context.load_cert_chain(str(pki.stranger_cert), str(pki.stranger_key))
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{mtls_server.http_url}/v2/health/live", verify=context, timeout=5)
    assert mtls_server.grpc_target is not None
    with grpcclient.InferenceServerClient(
        mtls_server.grpc_target, ssl=True, root_certificates=str(pki.ca), **grpc_options
    ) as grpc_client:
        with pytest.raises(InferenceServerException) as denied:
            grpc_client.is_server_live(client_timeout=5)
        assert denied.value.status() in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")
    mtls_server.assert_healthy()


def fail_handshakes(server: ServerProcess, count: int) -> None:
    """``count`` connections to the gRPC port that speak plain HTTP/2 where TLS is expected:
    each handshake fails, and the server closes the connection."""
    assert server.grpc_target is not None
    host, port = server.grpc_target.rsplit(":", 1)
    for _ in range(count):
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            assert sock.recv(64) == b""  # closed: no TLS, no answer


def handshake_lines(server: ServerProcess) -> int:
    return server.log().count("Handshake failed")


def test_failed_grpc_handshakes_write_a_bounded_log(
    tls_server: ServerProcess, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """grpc core writes one line per failed TLS handshake itself (C++, straight to stderr:
    nothing in Python can throttle it); at the server's default level it writes none, and
    GRPC_VERBOSITY=INFO, set by an operator debugging TLS, brings them back."""
    before = len(tls_server.log().splitlines())
    fail_handshakes(tls_server, 200)
    assert handshake_lines(tls_server) == 0
    assert len(tls_server.log().splitlines()) - before <= 2
    tls_server.assert_healthy()
    monkeypatch.setenv("GRPC_VERBOSITY", "INFO")
    config = write_config(pki, "tls-info.yaml", "{certFile: server.pem, keyFile: server.key}")
    verbose = start_server(config, ssl_context=pki.context())
    try:
        fail_handshakes(verbose, 200)
        wait_until(lambda: handshake_lines(verbose) == 200, what="grpc core's 200 lines")
    finally:
        assert verbose.stop() == 0, verbose.log()


def test_app_serve_with_tls_talks_to_itself(pki: Pki) -> None:
    """The in-process handle reaches its own HTTPS listener (pinned to the server's own
    certificate, whatever names it holds)."""
    config = write_config(pki, "notebook.yaml", "{certFile: server.pem, keyFile: server.key}")
    with servekit.serve(config, name="tls-test") as server:
        assert server.url.startswith("https://127.0.0.1:")
        assert {row["name"] for row in server.models} == {"add_sub"}
        assert server.grpc_target is not None
        channel_credentials = grpc.ssl_channel_credentials(pki.ca.read_bytes())
        with grpc.secure_channel(server.grpc_target, channel_credentials) as channel:
            grpc.channel_ready_future(channel).result(timeout=10)


# -- config errors ---------------------------------------------------------------------------
def validate(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servekit", "validate", config.name],
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )


def encrypted_key(pki: Pki) -> bytes:
    key = serialization.load_pem_private_key(pki.key.read_bytes(), None)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )


@pytest.mark.parametrize(
    ("tls", "key", "message"),
    [
        ("{certFile: nowhere.pem, keyFile: server.key}", "certFile", "cannot read nowhere.pem"),
        ("{certFile: server.pem, keyFile: nowhere.key}", "keyFile", "cannot read nowhere.key"),
        ("{certFile: server.key, keyFile: server.key}", "certFile", "holds no PEM certificate"),
        ("{certFile: server.pem, keyFile: client.key}", "keyFile", "does not match server.pem"),
        ("{certFile: server.pem, keyFile: locked.key}", "keyFile", "is encrypted"),
        (
            "{certFile: server.pem, keyFile: server.key, clientCaFile: server.key}",
            "clientCaFile",
            "holds no PEM certificate",
        ),
    ],
)
def test_unusable_tls_files_are_config_errors_with_their_line(
    pki: Pki, tls: str, key: str, message: str
) -> None:
    (pki.folder / "locked.key").write_bytes(encrypted_key(pki))
    config = pki.folder / "bad-tls.yaml"
    config.write_text(f"models:\n{MODEL}server:\n  tls: {tls}\n")
    done = validate(config)
    assert done.returncode == 1, done.stdout
    assert f"bad-tls.yaml:4: server.tls.{key}: " in done.stderr, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    served = subprocess.run(
        [
            sys.executable,
            "-m",
            "servekit",
            "serve",
            config.name,
            "--http-port",
            "0",
            "--grpc-port",
            "0",
        ],
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert served.returncode == 1 and "Traceback" not in served.stderr
    assert f"server.tls.{key}" in served.stderr and not LISTENING.search(served.stdout)
