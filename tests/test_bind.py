"""Where the server listens, and that the start-up line says exactly that.

Loopback by default; ``--host`` opts in to more. 127.0.0.2 is a loopback address too, but a
socket bound to 127.0.0.1 does not answer there while one bound to 0.0.0.0 does: that tells the
two binds apart without any network beyond this machine. A name standing for several addresses
binds every one on one port and lists each in the line after the first pair (which keeps the
format scripts parse).
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import onnx_builders
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from loops import run_in_own_loop
from repo_helpers import onnx_bytes
from servers import ALSO, LISTENING, ServerProcess, start_server

import servekit
from servekit.config.overrides import Overrides, load_plan
from servekit.listen import Addresses, resolve_host
from servekit.server import ServeKit

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bind")
    (root / "add_sub.onnx").write_bytes(onnx_bytes(onnx_builders.add_sub()))
    path = root / "serve.yaml"
    path.write_text(
        "models:\n  - {name: add_sub, modelFormat: {name: onnx}, storageUri: add_sub.onnx}\n"
    )
    return path


def serve(config: Path, *host: str) -> ServerProcess:
    """``servekit serve`` on free ports, with ``--host`` only when given."""
    flags = ["--host", *host] if host else []
    argv = [sys.executable, "-m", "servekit", "serve", str(config), "--http-port", "0",
            "--grpc-port", "0", *flags]  # fmt: skip
    return start_server(config, command=argv)


@pytest.fixture()
def started() -> Iterator[list[ServerProcess]]:
    servers: list[ServerProcess] = []
    yield servers
    for server in servers:
        assert server.stop() == 0, server.log()


def listening_line(server: ServerProcess) -> str:
    return next(line for line in server.stdout_lines if LISTENING.match(line)).rstrip("\n")


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def http_answers(host: str, port: int) -> bool:
    bracketed = f"[{host}]" if ":" in host else host
    try:
        reply = httpx.get(f"http://{bracketed}:{port}/v2/health/live", timeout=5)
    except httpx.ConnectError:
        return False
    return reply.json() == {"live": True}


def grpc_answers(host: str, port: int) -> bool:
    bracketed = f"[{host}]" if ":" in host else host
    with grpc.insecure_channel(f"{bracketed}:{port}") as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=3)
        except grpc.FutureTimeoutError:
            return False
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
        return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def test_the_default_is_loopback(config: Path, started: list[ServerProcess]) -> None:
    server = serve(config)
    started.append(server)
    http, grpc_port = port_of(server.http_url), port_of(str(server.grpc_target))
    assert listening_line(server) == (
        f"servekit: listening http://127.0.0.1:{http} grpc://127.0.0.1:{grpc_port}"
    )
    assert http_answers("127.0.0.1", http) and grpc_answers("127.0.0.1", grpc_port)
    assert not http_answers("127.0.0.2", http) and not grpc_answers("127.0.0.2", grpc_port)


def test_every_ipv4_interface_is_said_so(config: Path, started: list[ServerProcess]) -> None:
    server = serve(config, "0.0.0.0")
    started.append(server)
    http, grpc_port = port_of(server.http_url), port_of(str(server.grpc_target))
    assert listening_line(server) == (
        f"servekit: listening http://0.0.0.0:{http} grpc://0.0.0.0:{grpc_port}"
    )
    for host in ("127.0.0.1", "127.0.0.2"):
        assert http_answers(host, http) and grpc_answers(host, grpc_port), host


def test_every_interface_dual_stack(config: Path, started: list[ServerProcess]) -> None:
    server = serve(config, "::")
    started.append(server)
    http, grpc_port = port_of(server.http_url), port_of(str(server.grpc_target))
    assert (
        listening_line(server) == f"servekit: listening http://[::]:{http} grpc://[::]:{grpc_port}"
    )
    for host in ("::1", "127.0.0.1", "127.0.0.2"):
        assert http_answers(host, http) and grpc_answers(host, grpc_port), host


def test_ipv6_loopback_in_brackets(config: Path, started: list[ServerProcess]) -> None:
    server = serve(config, "::1")
    started.append(server)
    assert server.http_url.startswith("http://[::1]:")
    assert server.grpc_target is not None and server.grpc_target.startswith("[::1]:")
    http, grpc_port = port_of(server.http_url), port_of(server.grpc_target)
    assert http_answers("::1", http) and grpc_answers("::1", grpc_port)
    assert not http_answers("127.0.0.1", http)
    remote = servekit.connect(server.http_url)
    try:
        assert remote.grpc_target == server.grpc_target
    finally:
        remote.close()


def test_a_host_name_binds_what_it_resolves_to(config: Path, started: list[ServerProcess]) -> None:
    server = serve(config, "localhost")
    started.append(server)
    addresses, _ = resolve_host("localhost")
    bound = [(server.http_url, server.grpc_target), *server.also]
    assert [url.split("://")[1].rsplit(":", 1)[0].strip("[]") for url, _ in bound] == addresses
    for url, target in bound:
        host = url.split("://")[1].rsplit(":", 1)[0].strip("[]")
        assert http_answers(host, port_of(url)) and grpc_answers(host, port_of(str(target)))


def test_several_addresses_share_one_port_and_all_are_printed(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name resolving to 127.0.0.1 and ::1 (the resolver is asked for a made-up name)."""
    real = socket.getaddrinfo

    def resolver(host: object, *args: object, **kwargs: object) -> list[object]:
        if host != "both.servekit.test":
            return real(host, *args, **kwargs)  # type: ignore[arg-type]
        stream = socket.SOCK_STREAM
        return [
            (socket.AF_INET6, stream, 6, "", ("::1", 0, 0, 0)),
            (socket.AF_INET, stream, 6, "", ("127.0.0.1", 0)),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    plan = load_plan(
        config, Overrides({"http_port": 0, "grpc_port": 0, "host": "both.servekit.test"})
    )

    async def scenario() -> tuple[Addresses, dict[str, bool]]:
        kit = ServeKit(plan)
        addresses = await kit.start(wait_for_models=True)
        try:
            answers = {}
            for host in ("127.0.0.1", "::1"):
                answers[f"http {host}"] = await asyncio.to_thread(
                    http_answers, host, addresses.http_port
                )
                answers[f"grpc {host}"] = await asyncio.to_thread(
                    grpc_answers, host, addresses.grpc_port or 0
                )
            return addresses, answers
        finally:
            await kit.stop()

    addresses, answers = run_in_own_loop(scenario)
    assert addresses.hosts == ("127.0.0.1", "::1")  # IPv4 first: the pair scripts read
    assert set(answers.values()) == {True}, answers
    line = addresses.listening_line()
    http, grpc_port = addresses.http_port, addresses.grpc_port
    assert line == (
        f"servekit: listening http://127.0.0.1:{http} grpc://127.0.0.1:{grpc_port}"
        f" and http://[::1]:{http} grpc://[::1]:{grpc_port}"
    )
    first = LISTENING.match(line)
    assert first is not None and first[1] == f"http://127.0.0.1:{http}"
    assert [(m[1], m[2]) for m in ALSO.finditer(line, first.end())] == [
        (f"http://[::1]:{http}", f"[::1]:{grpc_port}")
    ]


def test_addresses_tell_bound_from_local_client() -> None:
    wildcard = Addresses(("0.0.0.0",), 8000, 8001)
    assert wildcard.bound_http_urls() == ["http://0.0.0.0:8000"]
    assert wildcard.http_url == "http://127.0.0.1:8000" and wildcard.grpc_target == "127.0.0.1:8001"
    six = Addresses(("::",), 8000, None, tls=True)
    assert six.http_url == "https://[::1]:8000" and six.grpc_target is None
    assert six.listening_line() == "servekit: listening https://[::]:8000 (gRPC disabled)"


def test_app_serve_listens_on_loopback(config: Path) -> None:
    with servekit.serve(config, name="bind-test") as server:
        assert server.url.startswith("http://127.0.0.1:")
        assert server._thread.addresses is not None
        assert server._thread.addresses.hosts == ("127.0.0.1",)


@pytest.mark.parametrize(
    ("host", "message"),
    [("192.0.2.1", "cannot listen on 192.0.2.1:0"), ("", "server.host is empty")],
)
def test_an_address_that_cannot_be_bound_is_a_message(
    config: Path, host: str, message: str
) -> None:
    argv = [sys.executable, "-m", "servekit", "serve", str(config), "--http-port", "0", "--no-grpc",
            "--host", host]  # fmt: skip
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not LISTENING.search(done.stdout)
