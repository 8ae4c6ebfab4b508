"""Shared fixtures: one real ``servekit serve`` subprocess for the whole test session, and the
hooks of the two test tiers (tests/tiers.py: ``slow`` marks end-to-end tests).

Starting the server costs about a second, so end-to-end tests share one (tests that need
their own process, e.g. to signal it, start it with :mod:`tests.servers`). gRPC is enabled
whenever the gRPC adapter exists (``app/servekit/grpc/server.py``).
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
import tiers
from haproxy import haproxy_bin  # noqa: F401  (a fixture of the replica tests)
from inprocess import Serve, services_factory
from podman_image import podman_env, servekit_image  # noqa: F401  (fixtures of the image tests)
from repo_helpers import Repo
from servers import ServerProcess, grpc_available, start_server, write_model_store


def pytest_configure(config: pytest.Config) -> None:
    tiers.install_guard()
    # A developer's SERVEKIT_TOKEN (set for clients) would protect every server the tests
    # start (`servekit serve` reads it); tests that want one set it themselves.
    os.environ.pop("SERVEKIT_TOKEN", None)
    # Servers, CLIs and notebooks the tests start as subprocesses run this checkout's code
    # (app/ is the source root), not whatever servekit an editable install points at: a
    # worktree's tests must test the worktree.
    source_root = str(Path(__file__).resolve().parent.parent / "app")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (source_root, os.environ.get("PYTHONPATH")) if p
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    return True if tiers.skip_module(collection_path, config) else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tiers.check_markers(items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    tiers.enter(item)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    tiers.leave()


@pytest.fixture(scope="session")
def model_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A serve.yaml with the test models (identities, add_sub, mlp v1+v2, broken ones)."""
    return write_model_store(tmp_path_factory.mktemp("store"))


@pytest.fixture(scope="session")
def server(model_store: Path) -> Iterator[ServerProcess]:
    """The session's server; stopping it with SIGTERM must be clean (exit code 0)."""
    process = start_server(model_store, grpc=grpc_available())
    yield process
    code = process.stop(signal.SIGTERM)  # unready first for server.drainDelaySeconds
    assert code == 0, f"server exited with {code}\n{process.log()}"


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    """An httpx client on the shared server; after each test the server must still be healthy."""
    with httpx.Client(base_url=server.http_url, timeout=30) as client:
        yield client
    server.assert_healthy()


@pytest.fixture(scope="module")
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    """A gRPC channel to the shared server, ready before the first test of the module uses it."""
    assert server.grpc_target is not None
    with grpc.insecure_channel(server.grpc_target) as opened:
        grpc.channel_ready_future(opened).result(timeout=10)
        yield opened


@pytest.fixture(params=["http", "grpc"])
def repo(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Repo]:
    """The repository API of the module's server, once over each transport (tritonclient)."""
    assert server.grpc_target is not None
    client = Repo(request.param, server.http_url, server.grpc_target)
    yield client
    client.close()
    server.assert_healthy()


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """In-process async tests (``pytest.mark.anyio``) run on asyncio, as the server does."""
    return "asyncio"


@pytest.fixture
async def serve(anyio_backend: str, tmp_path: Path) -> AsyncIterator[Serve]:
    """``await serve(yaml_text)``: the services of a server in this process, models loaded, no
    listener (tests/inprocess.py); ``tmp_path`` is serve.yaml's folder. Stopped afterwards."""
    async with services_factory(tmp_path) as factory:
        yield factory
