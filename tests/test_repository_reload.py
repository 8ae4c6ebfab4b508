"""Reloads and unloads under traffic: requests in flight complete, other models never fail.

Client threads (tritonclient.http and tritonclient.grpc, one client each) send requests without
pause to a model that is left alone and to a model being reloaded again and again, from disk and
with pushed files; every request must succeed. A slow Python model shows that an unload waits
for the requests it already accepted.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import numpy as np
import onnx_builders
import pytest
from repo_helpers import Repo, onnx_bytes, write_store
from servers import ServerProcess, start_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    config = write_store(tmp_path_factory.mktemp("reload"))
    process = start_server(config, grpc=True)
    yield process
    assert process.stop() == 0, process.log()


def _client(server: ServerProcess, transport: str) -> Repo:
    assert server.grpc_target is not None
    return Repo(transport, server.http_url, server.grpc_target)


def test_inference_runs_through_reloads(server: ServerProcess) -> None:
    stop = threading.Event()
    done: Counter[str] = Counter()
    failures: list[str] = []
    x = np.ones((1, 16), dtype=np.float32)
    pair = {"INPUT0": np.full((1, 16), 3, np.float32), "INPUT1": np.ones((1, 16), np.float32)}

    def hammer(transport: str, model: str) -> None:
        client = _client(server, transport)
        try:
            while not stop.is_set():
                try:
                    if model == "mlp":
                        assert client.infer("mlp", {"input": x})["output"].shape == (1, 4)
                    else:
                        out = client.infer(model, pair)
                        np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 16), 4))
                    done[f"{transport}/{model}"] += 1
                except Exception as exc:
                    failures.append(f"{transport}/{model}: {exc}")
        finally:
            client.close()

    threads = [
        threading.Thread(target=hammer, args=(transport, model))
        for transport in ("http", "grpc")
        for model in ("mlp", "add_sub")
    ]
    for thread in threads:
        thread.start()
    control = _client(server, "http")
    try:
        time.sleep(0.3)
        for round_ in range(6):
            if round_ % 2:
                control.load("add_sub")  # reload from disk
            else:
                control.load(
                    "add_sub",
                    {"backend": "onnxruntime"},
                    {"file:1/model.onnx": onnx_bytes(onnx_builders.add_sub())},
                )
            time.sleep(0.1)
        # A failed reload in the middle of the traffic changes nothing for the clients.
        control.expect_error(
            "INVALID_ARGUMENT",
            control.load,
            "add_sub",
            {"backend": "onnxruntime"},
            {"file:1/model.onnx": b"broken"},
        )
        time.sleep(0.3)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        control.close()
    assert not failures, failures[:5]
    print("requests completed during the reloads:", dict(done))
    for key in ("http/mlp", "grpc/mlp", "http/add_sub", "grpc/add_sub"):
        assert done[key] > 10, done
    server.assert_healthy()


@pytest.mark.parametrize("transport", ["http", "grpc"])
@pytest.mark.parametrize("action", ["unload", "reload"])
def test_requests_in_flight_complete(server: ServerProcess, transport: str, action: str) -> None:
    """The slow model takes 0.4 s a request; unload/reload arrives while requests run."""
    results: list[object] = []

    def call() -> None:
        client = _client(server, transport)
        try:
            results.append(client.infer("slow", {"x": np.zeros(3, np.float32)})["output"])
        except Exception as exc:
            results.append(exc)
        finally:
            client.close()

    control = _client(server, transport)
    try:
        callers = [threading.Thread(target=call) for _ in range(3)]
        for thread in callers:
            thread.start()
        time.sleep(0.15)
        started = time.monotonic()
        control.unload("slow") if action == "unload" else control.load("slow")
        waited = time.monotonic() - started
        for thread in callers:
            thread.join(30)
        assert len(results) == 3
        for result in results:
            assert isinstance(result, np.ndarray), result
            np.testing.assert_array_equal(result, np.ones(3, np.float32))
        assert waited > 0.1, "the unload/reload returned before the requests it waited for"
        if action == "unload":
            assert not control.ready("slow")
            control.expect_error(
                "UNAVAILABLE", control.infer, "slow", {"x": np.zeros(3, np.float32)}
            )
            control.load("slow")
        assert control.ready("slow")
    finally:
        control.close()
    server.assert_healthy()
