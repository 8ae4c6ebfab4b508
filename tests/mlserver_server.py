"""A real MLServer 1.7.1 (the test extra) started on a project folder, for the tests that
compare servekit's answers with MLServer's (tests/test_mlserver_*.py).

``mlserver start FOLDER`` runs with ``MLSERVER_PARALLEL_WORKERS=0`` (its inference worker
processes do not start under this environment's uvloop), which changes where MLServer runs the
model, not what it answers, on free loopback ports. MLServer's package is never imported in the
test's own process: its ``__init__`` cannot be imported beside servekit's protos
(tests/mlserver_codecs.py); its gRPC client runs in a process of its own
(tests/mlserver_grpc_client.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from needs import missing
from waits import wait_until

MLSERVER_RUNTIMES_INSTALL = (
    'pip install -e ".[test]" && pip install --no-deps mlserver-xgboost==1.7.1 '
    "mlserver-mlflow==1.7.1"
)
"""mlserver-sklearn and mlserver-lightgbm come with the test extra; MLServer's xgboost and
mlflow runtimes are installed without their dependencies, which would bring xgboost's CUDA
build and the whole of MLflow where xgboost-cpu and mlflow-skinny are the same modules."""
GRPC_CLIENT = Path(__file__).with_name("mlserver_grpc_client.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class MLServer:
    """A running MLServer's addresses."""

    url: str
    """Its REST API, ``http://127.0.0.1:PORT``."""
    grpc_target: str
    """Its gRPC API, ``127.0.0.1:PORT``."""
    metrics_url: str
    """Its Prometheus metrics, ``http://127.0.0.1:PORT/metrics`` (a port of their own)."""


@contextmanager
def mlserver_started(folder: Path) -> Iterator[MLServer]:
    """``mlserver start FOLDER`` on free loopback ports, stopped on leaving."""
    import httpx

    for runtime in ("mlserver_sklearn", "mlserver_xgboost", "mlserver_lightgbm", "mlserver_mlflow"):
        if importlib.util.find_spec(runtime) is None:  # found, not imported: see the docstring
            missing(f"MLServer's runtime {runtime}", MLSERVER_RUNTIMES_INSTALL)

    http, grpc, metrics = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "MLSERVER_HTTP_PORT": str(http),
        "MLSERVER_GRPC_PORT": str(grpc),
        "MLSERVER_METRICS_PORT": str(metrics),
        "MLSERVER_HOST": "127.0.0.1",
        "MLSERVER_PARALLEL_WORKERS": "0",
    }
    log_path = folder.parent / f"mlserver-{folder.name}.log"
    log = log_path.open("w")
    command = [sys.executable, "-c", "from mlserver.cli import main; main()", "start", "."]
    process = subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{http}"

    def ready() -> bool:
        assert process.poll() is None, log_path.read_text()
        try:
            return httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, timeout=120, what="MLServer's readiness")
        yield MLServer(url, f"127.0.0.1:{grpc}", f"http://127.0.0.1:{metrics}/metrics")
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()


def grpc_answers(target: str, model: str, requests: list[dict[str, Any]]) -> dict[str, Any]:
    """Each request sent over gRPC to ``target`` by MLServer's own client code (its protobuf
    stubs and converters, tests/mlserver_grpc_client.py), and the model's metadata: what an
    MLServer gRPC client reads back, as JSON."""
    sent = json.dumps({"target": target, "model": model, "requests": requests})
    done = subprocess.run(
        [sys.executable, str(GRPC_CLIENT)],
        input=sent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answers: dict[str, Any] = json.loads(done.stdout)
    return answers
