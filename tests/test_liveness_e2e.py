"""Liveness answers while a Python model blocks: a real server, real HTTP and gRPC clients.

The model answers its first calls at once, as a model measured fast does, then one call sleeps
5 s (a lock, a network call, a slow disk: anything Python code may do once in a while). While it
sleeps, every liveness route answers within 0.5 s: HTTP ``/v2/health/live`` (the exported
Kubernetes probe), grps' ``/grps/v1/health/live``, gRPC ServerLive and ``grpc.health.v1``. Before
Python models were kept off the event loop, that call ran on the loop after two fast ones and
held all of them for the whole 5 s (issue 22, finding 5).
"""

from __future__ import annotations

import concurrent.futures
import socket
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from servers import ServerProcess, running_server
from waits import wait_until

from servekit.protos import grpc_service_pb2 as pb
from servekit.protos import grpc_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow

MODULE = """
import time
from pathlib import Path

import numpy as np
from numpy.typing import NDArray


class Sometimes:
    def load(self, marker):
        self.marker = Path(marker)

    def predict(self, x: NDArray[np.float32]) -> NDArray[np.float32]:
        if x.size and x.flat[0] < 0:
            self.marker.touch()  # the test's cue: the slow call has started
            time.sleep(5.0)
        return x + 1
"""
PROBE_S = 0.5
FAST_CALLS = 8
"""More than the two fast calls after which a model used to move onto the event loop."""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    (tmp_path / "sometimes.py").write_text(MODULE)
    config = tmp_path / "serve.yaml"
    config.write_text(
        # a bound no fast call reaches on a busy machine: the model is measured fast for sure
        "server: {inlineBelowMicroseconds: 100000}\n"
        "models:\n"
        "  - {name: sometimes, modelFormat: {name: python}, entrypoint: 'sometimes:Sometimes',\n"
        f"     parameters: {{marker: {str(tmp_path / 'slow_started')!r}}}}}\n"
    )
    with running_server(config) as process:
        yield process


def infer(http: httpx.Client, value: float) -> list[float]:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [value]}]}
    response = http.post("/v2/models/sometimes/infer", json=body)
    assert response.status_code == 200, response.text
    data: list[float] = response.json()["outputs"][0]["data"]
    return data


def test_liveness_answers_while_a_python_model_blocks(server: ServerProcess) -> None:
    marker = Path(server.log_path.parent / "slow_started")
    assert server.grpc_target is not None
    with (
        server.http_client(timeout=30) as http,
        server.http_client(timeout=PROBE_S) as probe,
        grpc.insecure_channel(server.grpc_target) as channel,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        grpc.channel_ready_future(channel).result(timeout=10)  # connected before the slow call
        live = pb_grpc.GRPCInferenceServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        for _ in range(FAST_CALLS):
            assert infer(http, 1.0) == [2.0]
        slow = pool.submit(infer, http, -1.0)
        wait_until(marker.exists, 20, "the model's slow call to start")
        assert not slow.done()
        # Each probe has PROBE_S to answer, while the model still sleeps (5 s).
        assert probe.get("/v2/health/live").json() == {"live": True}
        assert probe.get("/grps/v1/health/live").status_code == 200
        assert live.ServerLive(pb.ServerLiveRequest(), timeout=PROBE_S).live
        answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=PROBE_S)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        assert not slow.done()  # all of that happened during the slow call
        assert slow.result(timeout=30) == [0.0]
    assert server.alive(), server.log()


def test_probes_pass_the_cap_on_requests_in_flight(tmp_path: Path) -> None:
    """With maxRequestsInFlight requests in progress (here: two uploads that never send their
    body), the next inference gets 503 at once but the health probes still answer: a busy
    server is alive, and an orchestrator must not restart it."""
    (tmp_path / "sometimes.py").write_text(MODULE)
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server: {network: {maxRequestsInFlight: 2}}\n"
        "models:\n"
        "  - {name: sometimes, modelFormat: {name: python}, entrypoint: 'sometimes:Sometimes',\n"
        f"     parameters: {{marker: {str(tmp_path / 'slow_started')!r}}}}}\n"
    )
    head = b"POST /v2/models/sometimes/infer HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n"
    with running_server(config, grpc=False) as server, server.http_client(timeout=5) as probe:
        host, port = server.http_host_port.rsplit(":", 1)
        held = [socket.create_connection((host, int(port)), timeout=10) for _ in range(2)]
        try:
            for sock in held:
                sock.sendall(head)
            body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
            wait_until(
                lambda: probe.post("/v2/models/sometimes/infer", json=body).status_code == 503,
                10,
                "the cap to be reached",
            )
            for path in ("/v2/health/live", "/v2/health/ready", "/grps/v1/health/live"):
                assert probe.get(path).status_code == 200, path
        finally:
            for sock in held:
                sock.close()
