"""The ``servekit`` command line as users and ops run it: validate, schema, serve, signals."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema  # type: ignore[import-untyped]
import numpy as np
import pytest
import yaml
from servers import LISTENING, ServerProcess, grpc_available, server_command, start_server
from waits import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SERVEKIT = shutil.which("servekit") or "servekit"
HEADER = "Inference-Header-Content-Length"


def run(*argv: str, cwd: Path = ROOT, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_validate_the_example_config() -> None:
    done = run(SERVEKIT, "validate", "serve.yaml")
    assert done.returncode == 0, done.stderr
    assert "OK, 3 model(s)" in done.stdout
    for name in ("mlp", "add_sub", "text_identity"):
        assert f"  {name}: format onnx" in done.stdout
    assert "versions 1,2" in done.stdout


BAD = """\
server:
  httpPort: 99999
models:
  - name: tiny
    modelFormat: {name: onnx}
    storageURI: ./models/tiny
"""


def test_validate_names_every_bad_key_and_its_line(tmp_path: Path) -> None:
    (tmp_path / "serve.yaml").write_text(BAD)
    done = run(SERVEKIT, "validate", "serve.yaml", cwd=tmp_path)
    assert done.returncode == 1
    assert "serve.yaml:2: server.httpPort" in done.stderr
    assert "serve.yaml:6: models[0].storageURI: unknown key" in done.stderr
    assert "Traceback" not in done.stderr


def test_validate_a_missing_file(tmp_path: Path) -> None:
    done = run(SERVEKIT, "validate", "nothing.yaml", cwd=tmp_path)
    assert done.returncode == 1
    assert "nothing.yaml" in done.stderr and "Traceback" not in done.stderr


MISSING_STORAGE = """\
models:
  - name: here
    modelFormat: {name: onnx}
    storageUri: here.onnx
  - name: gone
    modelFormat: {name: onnx}
    storageUri: ./nowhere
"""


def test_validate_fails_on_a_missing_storage_uri_naming_its_line(tmp_path: Path) -> None:
    """`servekit serve` serves such a model as UNAVAILABLE; validate, run before a deploy,
    says it is wrong."""
    (tmp_path / "here.onnx").write_bytes(b"checked by the runtime, not by validate")
    (tmp_path / "serve.yaml").write_text(MISSING_STORAGE)
    done = run(SERVEKIT, "validate", "serve.yaml", cwd=tmp_path)
    assert done.returncode == 1, done.stdout
    assert "serve.yaml:7: models[1].storageUri: ./nowhere does not exist" in done.stderr
    assert "models[0]" not in done.stderr and "Traceback" not in done.stderr


CLEAR_TOKENS = """\
server:
  auth:
    default: {env: SERVEKIT_TEST_TOKEN}
    admin: s3cret-admin-token
    repository: {file: token.txt}
models: []
"""


def test_validate_warns_about_each_token_written_in_clear(tmp_path: Path) -> None:
    (tmp_path / "token.txt").write_text("from-a-file\n")
    (tmp_path / "serve.yaml").write_text(CLEAR_TOKENS)
    env = {
        **os.environ,
        "SERVEKIT_TEST_TOKEN": "from-the-environment",
        "SERVEKIT_SERVER__AUTH__INFERENCE": "set-by-the-environment",  # not in the file
    }
    done = subprocess.run(
        [SERVEKIT, "validate", "serve.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "serve.yaml:4: warning: server.auth.admin: token written in clear; "
        "use {env: VAR} or {file: PATH}"
    ]
    assert "s3cret" not in done.stdout + done.stderr


def test_schema_is_json_schema_with_descriptions() -> None:
    done = run(SERVEKIT, "schema")
    assert done.returncode == 0, done.stderr
    schema = json.loads(done.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    undocumented = [
        f"{name}.{key}"
        for name, definition in schema["$defs"].items()
        for key, prop in definition.get("properties", {}).items()
        if not prop.get("description")
    ]
    assert undocumented == []
    assert {"server", "models", "runtimes"} <= set(schema["properties"])
    example = yaml.safe_load((ROOT / "serve.yaml").read_text())
    jsonschema.validate(example, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(yaml.safe_load(BAD), schema)


def test_python_dash_m_app_is_servekit() -> None:
    for args in (["--version"], ["validate", "serve.yaml"]):
        console, module = run(SERVEKIT, *args), run(sys.executable, "-m", "servekit", *args)
        assert (console.returncode, console.stdout) == (module.returncode, module.stdout), args
        assert console.returncode == 0 and console.stdout.startswith(("servekit ", "serve.yaml"))


@pytest.mark.parametrize("use_console_script", [False, True])
def test_serve_with_a_bad_config_exits_without_listening(
    tmp_path: Path, use_console_script: bool
) -> None:
    (tmp_path / "serve.yaml").write_text(BAD)
    argv = server_command(tmp_path / "serve.yaml", grpc=False)
    if use_console_script:
        argv = [SERVEKIT, *argv[3:]]
    done = run(*argv, cwd=tmp_path)
    assert done.returncode != 0
    assert not LISTENING.search(done.stdout)
    assert "serve.yaml:6: models[0].storageURI: unknown key" in done.stderr


def test_serve_on_a_busy_port_exits_with_a_message(
    server: ServerProcess, model_store: Path
) -> None:
    port = server.http_url.rsplit(":", 1)[1]
    argv = [sys.executable, "-m", "servekit", "serve", str(model_store), "--http-port", port,
            "--no-grpc", "--host", "127.0.0.1"]  # fmt: skip
    done = run(*argv, cwd=model_store.parent)
    assert done.returncode != 0
    assert "cannot listen" in done.stderr and "Traceback" not in done.stderr
    assert not LISTENING.search(done.stdout)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--http-port", "70000"],
            "--http-port 70000: Input should be less than or equal to 65535",
        ),
        (["--grpc-port", "-1"], "--grpc-port -1: Input should be greater than or equal to 0"),
    ],
)
def test_serve_refuses_an_out_of_range_port_flag(
    model_store: Path, flags: list[str], message: str
) -> None:
    """Flags are checked like the file: a message naming the flag, not a traceback at bind."""
    argv = [
        sys.executable,
        "-m",
        "servekit",
        "serve",
        str(model_store),
        "--host",
        "127.0.0.1",
        *flags,
    ]
    done = run(*argv, cwd=model_store.parent, timeout=30)
    assert done.returncode == 1
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not LISTENING.search(done.stdout)


# -- graceful shutdown ---------------------------------------------------------------------
ROWS, COLUMNS, CHUNKS, PAUSE = 256, 2048, 10, 0.1  # 2 MB per request, sent over ~1 s


def _slow_body(payload: bytes, header: bytes, sent_first: threading.Event) -> Iterator[bytes]:
    """A chunked upload: provably in flight (first bytes sent) long before it ends."""
    step = len(payload) // CHUNKS
    yield header + payload[:step]
    sent_first.set()  # httpx asks for the next chunk only after writing the previous one
    for start in range(step, len(payload), step):
        time.sleep(PAUSE)
        yield payload[start : start + step]


@pytest.fixture
def small_store(model_store: Path, tmp_path: Path) -> Path:
    """A serve.yaml with one model: a server of its own starts faster than the full store."""
    model = model_store.parent / "identity_fp32.onnx"
    config = tmp_path / "serve.yaml"
    entry = f"{{name: identity_fp32, modelFormat: {{name: onnx}}, storageUri: '{model}'}}"
    config.write_text(f"models:\n  - {entry}\n")
    return config


@pytest.fixture
def own_server() -> Iterator[list[ServerProcess]]:
    """Servers a test starts for itself; always stopped even when the test fails."""
    started: list[ServerProcess] = []
    yield started
    for process in started:
        process.stop(signal.SIGKILL)


@pytest.mark.parametrize(
    ("sig", "use_console_script"),
    [(signal.SIGTERM, False), (signal.SIGINT, True)],
    ids=["SIGTERM", "SIGINT"],
)
def test_signal_lets_in_flight_requests_finish(
    small_store: Path,
    own_server: list[ServerProcess],
    sig: signal.Signals,
    use_console_script: bool,
) -> None:
    # Refused at once, no window serving while unready (tests/test_replicas_e2e.py has that)
    small_store.write_text("server: {drainDelaySeconds: 0}\n" + small_store.read_text())
    argv = server_command(small_store, grpc=grpc_available())
    if use_console_script:
        argv = [SERVEKIT, *argv[3:]]
    server = start_server(small_store, command=argv)
    own_server.append(server)
    url = f"{server.http_url}/v2/models/identity_fp32/infer"
    rng = np.random.default_rng(5)
    results: list[tuple[np.ndarray, httpx.Response | BaseException]] = []
    lock = threading.Lock()

    def upload(sent_first: threading.Event) -> None:
        data = rng.standard_normal((ROWS, COLUMNS)).astype(np.float32)
        entry = {"name": "INPUT0", "shape": [ROWS, COLUMNS], "datatype": "FP32",
                 "parameters": {"binary_data_size": data.nbytes}}  # fmt: skip
        header = json.dumps(
            {"inputs": [entry], "parameters": {"binary_data_output": True}}
        ).encode()
        outcome: httpx.Response | BaseException
        try:
            body = _slow_body(data.tobytes(), header, sent_first)
            outcome = httpx.post(url, content=body, headers={HEADER: str(len(header))}, timeout=30)
        except BaseException as exc:  # reported by the main thread
            outcome = exc
        with lock:
            results.append((data, outcome))

    events = [threading.Event() for _ in range(4)]
    threads = [threading.Thread(target=upload, args=(e,)) for e in events]
    for thread in threads:
        thread.start()
    assert all(e.wait(15) for e in events), "uploads did not start"
    port = int(server.http_url.rsplit(":", 1)[1])
    wait_until(lambda: _all_read(port, len(threads)), what="the server to read the uploads")
    server.process.send_signal(sig)
    refused_while_draining = _refused_while(server, threads)
    for thread in threads:
        thread.join(30)
    code = server.process.wait(30)
    assert len(results) == len(threads)
    for data, outcome in results:
        assert isinstance(outcome, httpx.Response), repr(outcome)
        assert outcome.status_code == 200, outcome.text
        size = int(outcome.headers[HEADER])
        assert np.frombuffer(outcome.content[size:], dtype=np.float32).tobytes() == data.tobytes()
    assert refused_while_draining, "new connections were still accepted during shutdown"
    assert code == 0, server.log()
    assert "stopping" in "".join(server.stdout_lines)


def _all_read(port: int, connections: int) -> bool:
    """Whether the server has read every byte sent so far on ``connections`` connections to
    ``port`` (so it has their request headers): the kernel's view, /proc/net/tcp. Every client
    socket has had all it sent acknowledged (nothing in flight) and every server socket has an
    empty receive queue (nothing waiting for the server to read, nor to accept)."""
    sent: list[int] = []  # per client socket: bytes not yet acknowledged
    unread: list[int] = []  # per server socket: bytes received and not yet read
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = row.split()
        local, remote, state, queues = fields[1], fields[2], fields[3], fields[4]
        if state != "01":  # ESTABLISHED
            continue
        tx_queue, rx_queue = (int(q, 16) for q in queues.split(":"))
        if int(local.rsplit(":", 1)[1], 16) == port:
            unread.append(rx_queue)
        elif int(remote.rsplit(":", 1)[1], 16) == port:
            sent.append(tx_queue)
    return len(sent) == len(unread) == connections and not any(sent) and not any(unread)


def _refused_while(server: ServerProcess, threads: list[threading.Thread]) -> bool:
    """Whether a new connection is refused while the slow uploads are still running."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{server.http_url}/v2/health/live", timeout=1)
        except httpx.TransportError:
            return any(t.is_alive() for t in threads)
        time.sleep(0.03)
    return False
