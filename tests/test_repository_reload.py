"""Reloads and unloads under traffic: requests in flight complete, other models never fail.

Client threads (tritonclient.http and tritonclient.grpc, one client each) send requests without
pause to a model that is left alone and to a model being reloaded again and again, from disk and
with pushed files; every request must succeed, and every client must see answers between two
reloads. A slow Python model, which notes each call it starts and ends in a file, shows that an
unload waits for the requests it already accepted.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx_builders
import pytest
from repo_helpers import Repo, onnx_bytes, write_store
from servers import ServerProcess, start_server
from waits import wait_until

pytestmark = pytest.mark.slow


SLOW_MODEL = """
import time
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

CALLS = Path(__file__).with_name("slow_calls.log")


def predict(x: NDArray[np.float32]) -> NDArray[np.float32]:
    with CALLS.open("a") as log:
        log.write("start\\n")
    time.sleep(0.4)
    with CALLS.open("a") as log:
        log.write("end\\n")
    return x + 1
"""
"""repo_helpers' slow model, noting each call it starts and ends (in serve.yaml's folder); it
runs with three instances, so three calls run at once."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("reload")
    config = write_store(root)
    (root / "slow_model.py").write_text(SLOW_MODEL)
    text = config.read_text()
    slow = "entrypoint: 'slow_model:predict'"
    assert slow in text
    config.write_text(text.replace(slow, f"{slow}, instances: 3"))
    return root


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[ServerProcess]:
    process = start_server(folder / "serve.yaml", grpc=True)
    yield process
    assert process.stop() == 0, process.log()


def calls(folder: Path) -> Counter[str]:
    """How many calls of the slow model have started and ended."""
    log = folder / "slow_calls.log"
    return Counter(log.read_text().split()) if log.exists() else Counter()


def _client(server: ServerProcess, transport: str) -> Repo:
    assert server.grpc_target is not None
    return Repo(transport, server.http_url, server.grpc_target)


def test_inference_runs_through_reloads(server: ServerProcess) -> None:
    stop = threading.Event()
    keys = [
        f"{transport}/{model}" for transport in ("http", "grpc") for model in ("mlp", "add_sub")
    ]
    done: Counter[str] = Counter(dict.fromkeys(keys, 0))  # every key exists: safe to copy
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

    def traffic_flows() -> None:
        """Until every client has had two more answers (or a failure, reported below)."""
        before = Counter(done)
        wait_until(
            lambda: failures or all(done[k] >= before[k] + 2 for k in keys),
            what=f"answers on every client, so far {dict(done)}",
        )

    control = _client(server, "http")
    try:
        traffic_flows()
        for round_ in range(6):
            if round_ % 2:
                control.load("add_sub")  # reload from disk
            else:
                control.load(
                    "add_sub",
                    {"backend": "onnxruntime"},
                    {"file:1/model.onnx": onnx_bytes(onnx_builders.add_sub())},
                )
            traffic_flows()
        # A failed reload in the middle of the traffic changes nothing for the clients.
        control.expect_error(
            "INVALID_ARGUMENT",
            control.load,
            "add_sub",
            {"backend": "onnxruntime"},
            {"file:1/model.onnx": b"broken"},
        )
        traffic_flows()
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        control.close()
    assert not failures, failures[:5]
    print("requests completed during the reloads:", dict(done))
    for key in keys:
        assert done[key] >= 16, done  # two per round at least (waited for above)
    server.assert_healthy()


@pytest.mark.parametrize("transport", ["http", "grpc"])
@pytest.mark.parametrize("action", ["unload", "reload"])
def test_requests_in_flight_complete(
    server: ServerProcess, folder: Path, transport: str, action: str
) -> None:
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
        before = calls(folder)
        callers = [threading.Thread(target=call) for _ in range(3)]
        for thread in callers:
            thread.start()
        # Three instances: every call accepted is inside the model (and noted there).
        wait_until(
            lambda: calls(folder)["start"] >= before["start"] + 3, what="all three calls to start"
        )
        control.unload("slow") if action == "unload" else control.load("slow")
        after = calls(folder)
        assert after["end"] == after["start"], f"returned with calls still running: {after}"
        for thread in callers:
            thread.join(30)
        assert len(results) == 3
        for result in results:
            assert isinstance(result, np.ndarray), result
            np.testing.assert_array_equal(result, np.ones(3, np.float32))
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
