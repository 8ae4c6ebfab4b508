"""Isolated models under hostile clients, end to end: a real server (strict readiness, the
default), real tritonclient gRPC clients and httpx (issue 22, finding 6).

* A client whose 0.1 s deadline is shorter than the model's 0.3 s call gets DEADLINE_EXCEEDED,
  and that is all: the model's process is not killed (same pid throughout), the model's other
  clients are all answered, and server readiness never drops. Before, each such call killed
  the process: good clients failed and the server was not ready most of the time.
* One poison request a second (it crashes the process) never makes the server not ready; after
  ``BREAKER_CRASHES`` crashes the model's circuit breaker trips: it is UNAVAILABLE with the
  reason, its process is not restarted, and a repository load brings it back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from servers import ServerProcess, running_server
from test_isolation import model_processes
from tritonclient.utils import InferenceServerException
from waits import wait_until

from servekit.runtimes.isolated import BREAKER_CRASHES

pytestmark = pytest.mark.slow

MODULE = """
import ctypes
import os
import time

import numpy as np
from numpy.typing import NDArray


def third_of_a_second(x: NDArray[np.int64]) -> NDArray[np.int64]:
    time.sleep(0.3)
    return np.array([os.getpid()])


def poisoned(x: NDArray[np.float32]) -> NDArray[np.float32]:
    if x.size and x.flat[0] < 0:
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    return x * 2
"""
CONFIG = """\
models:
  - {name: slow, modelFormat: {name: python}, entrypoint: "restart_models:third_of_a_second",
     isolation: process}
  - {name: poisoned, modelFormat: {name: python}, entrypoint: "restart_models:poisoned",
     isolation: process}
  - {name: local, modelFormat: {name: python}, entrypoint: "restart_models:poisoned"}
"""
ZERO = np.zeros(1, np.int64)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    (tmp_path / "restart_models.py").write_text(MODULE)
    config = tmp_path / "serve.yaml"
    config.write_text(CONFIG)
    with running_server(config) as process:
        yield process


class Readiness:
    """Samples server readiness in a thread until stopped; keeps every answer."""

    def __init__(self, server: ServerProcess) -> None:
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(server,), daemon=True)
        self._thread.start()

    def _run(self, server: ServerProcess) -> None:
        with server.http_client(timeout=10) as http:
            while not self._stop.wait(0.05):
                self.samples.append(http.get("/v2/health/ready").status_code)

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join(20)
        return self.samples


def grpc_infer(
    client: grpcclient.InferenceServerClient,
    model: str,
    x: np.ndarray,
    timeout: float | None = None,
) -> np.ndarray:
    datatype = "INT64" if x.dtype == np.int64 else "FP32"
    tensor = grpcclient.InferInput("x", list(x.shape), datatype)
    tensor.set_data_from_numpy(x)
    answer = client.infer(model, [tensor], client_timeout=timeout).as_numpy("output")
    assert answer is not None
    return answer


def connected(target: str) -> grpcclient.InferenceServerClient:
    """A client whose channel is connected: a call's deadline then counts the call only."""
    client = grpcclient.InferenceServerClient(target)
    assert client.is_server_live()
    return client


def impatient(target: str, calls: int) -> tuple[list[str], list[int]]:
    """``calls`` calls of the 0.3 s model with a 0.1 s deadline, each followed by one without
    (so that each impatient call finds the process idle and starts): the status codes of the
    impatient calls and the pids that answered the others."""
    codes, pids = [], []
    with connected(target) as client:
        for _ in range(calls):
            try:
                grpc_infer(client, "slow", ZERO, timeout=0.1)
                codes.append("OK")
            except InferenceServerException as exc:
                codes.append(str(exc.status()))
            pids.append(int(grpc_infer(client, "slow", ZERO)[0]))
    return codes, pids


def patient(target: str, calls: int) -> list[int]:
    """``calls`` calls of the 0.3 s model without a deadline; the pids that answered."""
    with connected(target) as client:
        return [int(grpc_infer(client, "slow", ZERO)[0]) for _ in range(calls)]


def row(http: httpx.Client, name: str) -> dict[str, str]:
    rows = http.post("/v2/repository/index", json={}).json()
    found: dict[str, str] = next(r for r in rows if r["name"] == name)
    return found


def test_a_short_client_deadline_abandons_the_call_and_keeps_the_process(
    server: ServerProcess,
) -> None:
    target = server.grpc_target
    assert target is not None
    (pid,) = patient(target, 1)
    readiness = Readiness(server)
    try:
        with ThreadPoolExecutor(3) as pool:
            bad = pool.submit(impatient, target, 8)
            good = [pool.submit(patient, target, 5) for _ in range(2)]
            codes, pids = bad.result(timeout=120)
            pids += [p for future in good for p in future.result(timeout=120)]
    finally:
        samples = readiness.stop()
    assert codes == ["StatusCode.DEADLINE_EXCEEDED"] * 8
    assert pids == [pid] * 18  # every good call answered, by the same process
    assert samples and set(samples) == {200}, samples
    assert pid in model_processes(server.process.pid)
    with server.http_client(timeout=10) as http:
        assert row(http, "slow")["state"] == "READY"
        assert "killed" not in server.log()


def test_poison_requests_keep_the_server_ready_and_trip_the_breaker(
    server: ServerProcess,
) -> None:
    target = server.grpc_target
    assert target is not None
    x = np.ones(2, np.float32)
    client = connected(target)
    np.testing.assert_array_equal(grpc_infer(client, "poisoned", x), x * 2)
    before = set(model_processes(server.process.pid))
    readiness = Readiness(server)
    tripped = threading.Event()
    try:
        with server.http_client(timeout=10) as http:
            for _ in range(60):  # one poison request a second until the breaker trips
                with pytest.raises(InferenceServerException) as failed:
                    grpc_infer(client, "poisoned", -x)
                assert str(failed.value.status()) == "StatusCode.UNAVAILABLE"
                if "crashed" in row(http, "poisoned")["reason"]:
                    tripped.set()
                    break
                np.testing.assert_array_equal(grpc_infer(client, "local", x), x * 2)
                tripped.wait(1.0)  # the pace of the poison, not a wait for a condition
    finally:
        samples = readiness.stop()
    assert samples and set(samples) == {200}, samples  # ready throughout
    assert tripped.is_set(), server.log()
    with server.http_client(timeout=10) as http:
        state = row(http, "poisoned")
        assert state["state"] == "UNAVAILABLE"
        assert f"crashed {BREAKER_CRASHES} times in 60 s: " in state["reason"]
        assert "SIGSEGV" in state["reason"], state
        assert http.get("/v2/models/poisoned/ready").status_code != 200  # per model: not ready
        assert http.get("/v2/health/ready").status_code == 200
        with pytest.raises(InferenceServerException, match="crashed"):
            grpc_infer(client, "poisoned", x)  # a good request too: the model is out
        # its process is gone and none is being started: only the other isolated model's runs
        alive = set(model_processes(server.process.pid))
        assert len(alive) == 1 and alive < before | alive, (before, alive)
        assert "not restarted" in state["reason"]
        assert http.post("/v2/repository/models/poisoned/load", json={}).status_code == 200
        wait_until(lambda: row(http, "poisoned")["state"] == "READY", 60, "poisoned loaded")
    np.testing.assert_array_equal(grpc_infer(client, "poisoned", x), x * 2)
    client.close()
