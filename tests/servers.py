"""Launch ``servekit serve`` as a real subprocess, the way users and ops run it.

End-to-end tests must exercise the real command line, the real process start-up, the printed
``servekit: listening ...`` line and real signal handling, so nothing here imports the server:
it writes a serve.yaml with small ONNX models (built by :mod:`onnx_builders`), starts
``python -m servekit serve``, waits (bounded) for the listening line and for readiness, and always
stops the process (SIGINT, then SIGKILL) so no test leaves a server behind. SIGINT (Ctrl-C)
drains at once; SIGTERM first keeps serving while unready for ``server.drainDelaySeconds``
(5 s by default, for load balancers): tests of that pass SIGTERM themselves.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import queue
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import onnx
import onnx_builders

DATATYPES: tuple[str, ...] = tuple(onnx_builders.V2_TO_ONNX)
"""The 13 V2 datatypes; the store has one identity model per datatype."""

BROKEN_MODELS: dict[str, str] = {
    "broken_garbage": "not a valid ONNX model",
    "broken_lfs": "Git LFS",
    "broken_missing": "does not exist",
}
"""Models that must be UNAVAILABLE, with a fragment their reason must contain."""

LISTENING = re.compile(r"^servekit: listening (https?://\S+)(?: grpcs?://(\S+))?")
"""The start-up line's first address: its HTTP(S) URL and gRPC ``host:port`` (``grpcs://``:
over TLS). Further addresses follow, each as `` and <url> [<grpc url>]`` (see ``ALSO``)."""
ALSO = re.compile(r" and (https?://\S+)(?: grpcs?://(\S+))?")
LFS_POINTER = (
    "version https://git-lfs.github.com/spec/v1\n"
    "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
    "size 12345\n"
)


def grpc_available() -> bool:
    """Whether the gRPC adapter exists yet (it is built in parallel with these tests)."""
    try:
        return importlib.util.find_spec("servekit.grpc.server") is not None
    except ImportError:
        return False


def identity_name(datatype: str) -> str:
    return f"identity_{datatype.lower()}"


def _save(model: onnx.ModelProto, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def write_model_store(root: Path) -> Path:
    """Write the test models and a serve.yaml serving them under ``root``; return the yaml."""
    models = root / "models"
    entries: list[str] = []
    for datatype in DATATYPES:
        name = identity_name(datatype)
        _save(onnx_builders.identity(datatype), models / f"{name}.onnx")
        entries.append(
            f"  - {{name: {name}, modelFormat: {{name: onnx}}, storageUri: {name}.onnx}}"
        )
    _save(onnx_builders.add_sub(), models / "add_sub" / "1" / "model.onnx")
    entries.append("  - {name: add_sub, modelFormat: {name: onnx}, storageUri: add_sub}")
    for version in (1, 2):
        _save(onnx_builders.mlp(seed=version), models / "mlp" / str(version) / "model.onnx")
    entries.append(
        "  - {name: mlp, modelFormat: {name: onnx}, storageUri: mlp, versionPolicy: {all: {}}}"
    )
    (models / "broken_garbage.onnx").write_bytes(bytes(range(256)) * 8)
    (models / "broken_lfs.onnx").write_text(LFS_POINTER)
    for name, uri in (
        ("broken_garbage", "broken_garbage.onnx"),
        ("broken_lfs", "broken_lfs.onnx"),
        ("broken_missing", "nowhere.onnx"),
    ):
        entries.append(f"  - {{name: {name}, modelFormat: {{name: onnx}}, storageUri: {uri}}}")
    config = models / "serve.yaml"
    # The broken models are there on purpose, and every test expects the server to answer
    # ready (assert_healthy): readiness must not wait for them (tests/test_readiness.py
    # covers strict readiness, the default).
    config.write_text(
        "server: {name: servekit, strictReadiness: false}\nmodels:\n" + "\n".join(entries) + "\n"
    )
    return config


@dataclass
class ServerProcess:
    """A running ``servekit serve`` subprocess and where it listens."""

    process: subprocess.Popen[str]
    http_url: str
    grpc_target: str | None
    log_path: Path
    stdout_lines: list[str] = field(default_factory=list)
    pump: threading.Thread | None = None
    ssl_context: ssl.SSLContext | None = None
    """How HTTPS clients of the helpers here verify the server (and present a client cert)."""
    also: list[tuple[str, str | None]] = field(default_factory=list)
    """The further (HTTP URL, gRPC target) pairs of the listening line, when several
    addresses are bound."""

    @property
    def tls(self) -> bool:
        return self.http_url.startswith("https://")

    @property
    def http_host_port(self) -> str:
        return self.http_url.split("://", 1)[1]

    def http_client(self, **kwargs: Any) -> httpx.Client:
        """An httpx client on the server (verifying it with ``ssl_context`` over HTTPS)."""
        verify = self.ssl_context if self.ssl_context is not None else True
        return httpx.Client(base_url=self.http_url, verify=verify, **kwargs)

    def alive(self) -> bool:
        return self.process.poll() is None

    def assert_healthy(self) -> None:
        """Alive, live and ready: checked after every bad request a test sends."""
        assert self.alive(), self.log()
        with self.http_client(timeout=10) as client:
            assert client.get("/v2/health/live").json() == {"live": True}
            assert client.get("/v2/health/ready").json() == {"ready": True}

    def log(self) -> str:
        """What the server wrote (stdout lines and its stderr log), for failure messages."""
        err = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "".join(self.stdout_lines) + err

    def stop(self, sig: int = signal.SIGINT, timeout: float = 20.0) -> int:
        """Send ``sig`` and wait (bounded); SIGKILL if it does not exit. Returns the exit code.
        SIGINT by default: SIGTERM would keep the server up for ``server.drainDelaySeconds``."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        _release(self.process, self.pump)
        return self.process.returncode


def _release(process: subprocess.Popen[str], pump: threading.Thread | None) -> None:
    """Once the child has exited: let the reader reach EOF, then close the pipe."""
    if pump is not None:
        pump.join(10)
    if process.stdout is not None:
        process.stdout.close()


def server_command(config: Path, *, grpc: bool = True, extra: Sequence[str] = ()) -> list[str]:
    """The argv of ``python -m servekit serve`` on free ports of the loopback interface."""
    ports = ["--grpc-port", "0"] if grpc else ["--no-grpc"]
    return [
        sys.executable, "-m", "servekit", "serve", str(config),
        "--http-port", "0", *ports, "--host", "127.0.0.1", *extra,
    ]  # fmt: skip


def _pump(stream: IO[str], lines: list[str], out: queue.Queue[str | None]) -> None:
    """Drain the child's stdout so it never blocks on a full pipe; hand lines to the waiter."""
    for line in stream:
        lines.append(line)
        out.put(line)
    out.put(None)


def _message_of(line: str) -> str:
    """A stdout line's text: the line itself, or a JSON line's ``message``
    (``server.logging.format: json`` writes the listening line as a JSON object)."""
    if line.startswith("{"):
        try:
            record = json.loads(line)
        except ValueError:
            return line
        if isinstance(record, dict) and isinstance(record.get("message"), str):
            return record["message"]
    return line


def start_server(
    config: Path,
    *,
    grpc: bool = True,
    extra: Sequence[str] = (),
    command: Sequence[str] | None = None,
    timeout: float = 60.0,
    wait_ready: bool = True,
    ssl_context: ssl.SSLContext | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> ServerProcess:
    """Start a server and wait (bounded) for its listening line and, by default, readiness
    (``ssl_context``: how to verify a server serving HTTPS; ``preexec_fn``: run in the child
    before it starts, e.g. to lower its open-file limit)."""
    log_path = config.parent / f"server-{os.getpid()}-{time.monotonic_ns()}.log"
    argv = list(command) if command is not None else server_command(config, grpc=grpc, extra=extra)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=log_file,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=config.parent,
            preexec_fn=preexec_fn,
        )
    lines: list[str] = []
    incoming: queue.Queue[str | None] = queue.Queue()
    assert process.stdout is not None
    pump = threading.Thread(target=_pump, args=(process.stdout, lines, incoming), daemon=True)
    pump.start()
    deadline = time.monotonic() + timeout
    match = None
    try:
        while match is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no listening line within {timeout} s")
            try:
                line = incoming.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"server exited with {process.wait(10)} before listening")
            line = _message_of(line)
            match = LISTENING.match(line)
        also = [(m[1], m[2]) for m in ALSO.finditer(line, match.end())]
        server = ServerProcess(
            process, match[1], match[2], log_path, lines, pump, ssl_context, also
        )
        if wait_ready:
            wait_until_ready(server, deadline)
        return server
    except BaseException as exc:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        _release(process, pump)
        text = "".join(lines) + log_path.read_text(errors="replace")
        raise RuntimeError(f"servekit did not start: {exc}\n--- server output ---\n{text}") from exc


def wait_until_ready(server: ServerProcess, deadline: float) -> None:
    """Poll /v2/health/ready until 200, the process dies, or the deadline passes."""
    with server.http_client(timeout=5.0) as client:
        while True:
            if not server.alive():
                raise RuntimeError("server exited while loading models")
            with contextlib.suppress(httpx.TransportError):
                if client.get("/v2/health/ready").status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError("server did not become ready in time")
            time.sleep(0.05)


@contextlib.contextmanager
def running_server(config: Path, **kwargs: object) -> Iterator[ServerProcess]:
    """``start_server`` as a context manager that always stops the process."""
    server = start_server(config, **kwargs)  # type: ignore[arg-type]
    try:
        yield server
    finally:
        server.stop()
