"""The ``client`` fixtures: each conformance test runs over every transport (and encoding).

Transports are HTTP and gRPC through ``tritonclient``; gRPC joins automatically as soon as
``app/servekit/grpc/server.py`` exists (it is built in parallel), so no test is skipped for good.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from servers import ServerProcess, grpc_available

from .adapter import ENCODINGS, Client

TRANSPORTS = ["http", "grpc"] if grpc_available() else ["http"]
ENCODED = [(t, e) for t in TRANSPORTS for e in ENCODINGS[t]]


def _connect(server: ServerProcess, transport: str, encoding: str | None = None) -> Client:
    if transport == "http":
        return Client("http", server.http_host_port, encoding)
    assert server.grpc_target is not None, "server started without gRPC"
    return Client("grpc", server.grpc_target, encoding)


@pytest.fixture(params=TRANSPORTS)
def client(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Client]:
    """A tritonclient of each transport, with its default tensor encoding."""
    connected = _connect(server, request.param)
    yield connected
    connected.close()


@pytest.fixture(params=ENCODED, ids=[f"{t}-{e}" for t, e in ENCODED])
def encoded_client(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Client]:
    """A tritonclient of each transport and each way it carries tensors (binary/JSON, raw/typed)."""
    transport, encoding = request.param
    connected = _connect(server, transport, encoding)
    yield connected
    connected.close()
