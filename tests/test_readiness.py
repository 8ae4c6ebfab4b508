"""Strict readiness (the default, as Triton): the server is ready only while every model asked
for is READY, on every surface: V2 HTTP, gRPC ServerReady, grpc.health.v1 (overall), grps over
HTTP and gRPC, and the dashboard's header.

"Asked for": the start-up set, models a serve.yaml edit adds that ``startupModels`` selects, and
models a client loaded, minus models a client unloaded or serve.yaml no longer has. One real
``servekit serve --watch`` subprocess; each test starts and ends ready.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import onnx_builders
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from repo_helpers import onnx_bytes
from servers import ServerProcess, start_server

from servekit.protos import grps_pb2, grps_pb2_grpc

pytestmark = pytest.mark.slow

HEAD = "server: {startupModels: all}\nmodels:\n"
GOOD = "  - {name: good, modelFormat: {name: onnx}, storageUri: models/good.onnx}\n"
FLAKY = "  - {name: flaky, modelFormat: {name: onnx}, storageUri: models/flaky.onnx}\n"
GATED = (
    "  - {name: gated, modelFormat: {name: python}, entrypoint: 'gated_model:Gated', "
    "parameters: {gate: GATE}}\n"
)
GATED_MODEL = '''
import time
from pathlib import Path

import numpy as np
from numpy.typing import NDArray


class Gated:
    """Loads only once the gate file exists (bounded), so a test sees it LOADING."""

    def load(self, gate: str) -> None:
        deadline = time.monotonic() + 60
        while not Path(gate).exists():
            if time.monotonic() > deadline:
                raise RuntimeError("the gate never opened")
            time.sleep(0.05)

    def predict(self, x: NDArray[np.float32]) -> NDArray[np.float32]:
        return x
'''
WAIT_S = 30.0


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("readiness")
    (root / "models").mkdir()
    (root / "models" / "good.onnx").write_bytes(onnx_bytes(onnx_builders.add_sub()))
    (root / "models" / "flaky.onnx").write_bytes(b"not an onnx model" * 16)
    (root / "gated_model.py").write_text(GATED_MODEL)
    (root / "serve.yaml").write_text(HEAD + GOOD + FLAKY)
    return root


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[ServerProcess]:
    """Started with ``flaky`` broken: it never becomes ready, so readiness is not awaited."""
    process = start_server(folder / "serve.yaml", extra=["--watch"], wait_ready=False)
    yield process
    assert process.stop() == 0, process.log()


class Surfaces:
    """Server readiness as each protocol reports it."""

    def __init__(self, server: ServerProcess) -> None:
        assert server.grpc_target is not None
        self.http = httpx.Client(base_url=server.http_url, timeout=10)
        self.channel = grpc.insecure_channel(server.grpc_target)
        self.triton = grpcclient.InferenceServerClient(server.grpc_target)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.grps = grps_pb2_grpc.GrpsServiceStub(self.channel)

    def close(self) -> None:
        self.triton.close()
        self.channel.close()
        self.http.close()

    def all(self) -> dict[str, bool]:
        v2 = self.http.get("/v2/health/ready")
        assert v2.status_code == (200 if v2.json()["ready"] else 503)
        grps_http = self.http.get("/grps/v1/health/ready").json()["status"]
        grps_grpc = self.grps.CheckReadiness(grps_pb2.GrpsMessage(), timeout=10).status
        health = self.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        dashboard = self.http.get("/dashboard/api/overview").json()
        answers = {
            "v2 http": v2.json()["ready"],
            "v2 grpc": self.triton.is_server_ready(),
            "grpc.health": health.status == health_pb2.HealthCheckResponse.SERVING,
            "grps http": grps_http["code"] == 200,
            "grps grpc": grps_grpc.code == 200,
            "dashboard": dashboard["ready"],
        }
        return answers

    def wait(self, ready: bool) -> None:
        """Until every surface answers ``ready`` (bounded); fails naming those that do not."""
        deadline = time.monotonic() + WAIT_S
        while True:
            answers = self.all()
            if set(answers.values()) == {ready}:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"expected ready={ready} everywhere, got {answers}")
            time.sleep(0.1)


@pytest.fixture()
def surfaces(server: ServerProcess) -> Iterator[Surfaces]:
    answers = Surfaces(server)
    yield answers
    answers.close()


def state(server: ServerProcess, name: str) -> str:
    rows = httpx.post(f"{server.http_url}/v2/repository/index", json={}).json()
    return next((r["state"] for r in rows if r["name"] == name), "ABSENT")


def wait_state(server: ServerProcess, name: str, wanted: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while (found := state(server, name)) != wanted:
        assert time.monotonic() < deadline, f"{name} is {found}, expected {wanted}"
        time.sleep(0.05)


def rewrite(config: Path, text: str) -> None:
    temporary = config.with_name(".serve.yaml.swp")
    temporary.write_text(text)
    temporary.replace(config)


def test_a_start_up_model_that_failed_holds_readiness_until_fixed(
    server: ServerProcess, surfaces: Surfaces, folder: Path
) -> None:
    wait_state(server, "flaky", "UNAVAILABLE")
    wait_state(server, "good", "READY")
    surfaces.wait(ready=False)
    grps = surfaces.http.get("/grps/v1/health/ready").json()["status"]
    assert grps["code"] == 503 and "1 model(s) asked for are not READY" in grps["msg"]
    assert "flaky" not in grps["msg"]  # readiness is open to anyone: no model names
    # Per-model readiness is unchanged: the good model is ready, the failed one is not.
    assert surfaces.http.get("/v2/models/good/ready").status_code == 200
    assert surfaces.http.get("/v2/models/flaky/ready").status_code == 503
    # The model's file is fixed: --watch reloads it (it is asked for) and the server is ready.
    (folder / "models" / "flaky.onnx").write_bytes(onnx_bytes(onnx_builders.add_sub()))
    wait_state(server, "flaky", "READY")
    surfaces.wait(ready=True)


def test_a_model_added_to_serve_yaml_is_waited_for_while_it_loads(
    server: ServerProcess, surfaces: Surfaces, folder: Path
) -> None:
    surfaces.wait(ready=True)
    gate = folder / "gate.open"
    config = folder / "serve.yaml"
    rewrite(config, HEAD + GOOD + FLAKY + GATED.replace("GATE", str(gate)))
    try:
        wait_state(server, "gated", "LOADING")
        assert set(surfaces.all().values()) == {False}
    finally:
        gate.touch()
    wait_state(server, "gated", "READY")
    surfaces.wait(ready=True)
    # Removed from serve.yaml: no longer asked for (and gone).
    rewrite(config, HEAD + GOOD + FLAKY)
    wait_state(server, "gated", "ABSENT")
    surfaces.wait(ready=True)


def test_a_broken_model_added_then_unloaded_or_removed(
    server: ServerProcess, surfaces: Surfaces, folder: Path
) -> None:
    config = folder / "serve.yaml"
    missing = "  - {name: missing, modelFormat: {name: onnx}, storageUri: models/nowhere.onnx}\n"
    rewrite(config, HEAD + GOOD + FLAKY + missing)
    wait_state(server, "missing", "UNAVAILABLE")
    surfaces.wait(ready=False)
    # A client unloads it: it is no longer asked for.
    unloaded = surfaces.http.post("/v2/repository/models/missing/unload", json={})
    assert unloaded.status_code == 200, unloaded.text
    surfaces.wait(ready=True)
    # A client's failed load does not make it asked for again...
    failed = surfaces.http.post("/v2/repository/models/missing/load", json={})
    assert failed.status_code == 400
    surfaces.wait(ready=True)
    # ... a client's successful load of another does, and its unload ends that again.
    surfaces.http.post("/v2/repository/models/good/unload", json={}).raise_for_status()
    surfaces.wait(ready=True)
    surfaces.http.post("/v2/repository/models/good/load", json={}).raise_for_status()
    surfaces.wait(ready=True)
    # Asked for again by a new serve.yaml entry, then removed from the file: ready again.
    rewrite(config, HEAD + GOOD + FLAKY)
    wait_state(server, "missing", "ABSENT")
    rewrite(config, HEAD + GOOD + FLAKY + missing.replace("missing", "missing2"))
    wait_state(server, "missing2", "UNAVAILABLE")
    surfaces.wait(ready=False)
    rewrite(config, HEAD + GOOD + FLAKY)
    wait_state(server, "missing2", "ABSENT")
    surfaces.wait(ready=True)


def test_strict_readiness_false_answers_ready_without_them(
    server: ServerProcess, surfaces: Surfaces, folder: Path
) -> None:
    """The switch applies live; a model that is not asked for never holds readiness."""
    config = folder / "serve.yaml"
    missing = "  - {name: lost, modelFormat: {name: onnx}, storageUri: models/nowhere.onnx}\n"
    rewrite(config, HEAD + GOOD + FLAKY + missing)
    wait_state(server, "lost", "UNAVAILABLE")
    surfaces.wait(ready=False)
    relaxed = HEAD.replace("startupModels: all", "startupModels: all, strictReadiness: false")
    rewrite(config, relaxed + GOOD + FLAKY + missing)
    surfaces.wait(ready=True)
    rewrite(config, HEAD + GOOD + FLAKY + missing)
    surfaces.wait(ready=False)
    rewrite(config, HEAD + GOOD + FLAKY)
    wait_state(server, "lost", "ABSENT")
    surfaces.wait(ready=True)


def test_models_not_selected_at_start_are_not_waited_for(tmp_path: Path) -> None:
    """startupModels names what is asked for: a broken model left out does not count."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "good.onnx").write_bytes(onnx_bytes(onnx_builders.add_sub()))
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server: {startupModels: [good]}\nmodels:\n"
        + GOOD
        + "  - {name: lost, modelFormat: {name: onnx}, storageUri: models/nowhere.onnx}\n"
    )
    server = start_server(config, grpc=False)  # waits for readiness
    try:
        server.assert_healthy()
    finally:
        assert server.stop() == 0, server.log()
