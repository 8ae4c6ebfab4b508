"""Process isolation of Python models (``isolation: process``), end to end with real clients.

A real server serves an ONNX model, an in-process Python model and isolated Python models that
crash (a null pointer read through ctypes), hang, run out of their memory limit and serve BYTES
from two processes. Each failure answers 503 / UNAVAILABLE naming its cause, leaves the other
models serving, and the model is READY again once its process is back. Unload, stop and a
killed server leave no model process behind (checked in /proc).
"""

from __future__ import annotations

import concurrent.futures
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx_builders
import pytest
from repo_helpers import Repo, onnx_bytes
from servers import ServerProcess, start_server
from waits import wait_until

pytestmark = pytest.mark.slow

USER_MODULE = """
import ctypes
import os
import time

import numpy as np
from numpy.typing import NDArray


def add_one(x: NDArray[np.float32]) -> NDArray[np.float32]:
    return x + 1


class Crashy:
    def load(self, marker):
        if os.path.exists(marker):  # a model that also crashes while loading, while it exists
            ctypes.string_at(0)

    def predict(self, x: NDArray[np.float32]) -> NDArray[np.float32]:
        if x.size and x.flat[0] < 0:
            ctypes.string_at(0)  # reads address 0: SIGSEGV
        return x * 2


def hang(x: NDArray[np.float32]) -> NDArray[np.float32]:
    if x.size and x.flat[0] < 0:
        time.sleep(3600)
    return x


def hog(megabytes: NDArray[np.int64]) -> NDArray[np.int64]:
    block = np.ones(int(megabytes[0]) * 1024 * 1024, dtype=np.uint8)
    return np.array([block.sum() // (1024 * 1024)])


class Greeter:
    def load(self, greeting):
        self.greeting = greeting.encode()

    def predict(self, name: NDArray[np.object_]) -> NDArray[np.object_]:
        return np.array([self.greeting + b" " + n for n in name], dtype=object)


def whoami(x: NDArray[np.int64]) -> NDArray[np.int64]:
    return np.array([os.getpid()])
"""

CONFIG = """\
server: {strictReadiness: false}
models:
  - {name: add_sub, modelFormat: {name: onnx}, storageUri: add_sub.onnx}
  - {name: local, modelFormat: {name: python}, entrypoint: "iso_models:add_one"}
  - {name: isolated, modelFormat: {name: python}, entrypoint: "iso_models:add_one",
     isolation: process}
  - {name: crashy, modelFormat: {name: python}, entrypoint: "iso_models:Crashy",
     isolation: process, parameters: {marker: crash_on_load}}
  - {name: hang, modelFormat: {name: python}, entrypoint: "iso_models:hang",
     isolation: process, timeoutSeconds: 1}
  - {name: hog, modelFormat: {name: python}, entrypoint: "iso_models:hog",
     isolation: process, memoryLimitBytes: 268435456}
  - name: greeter
    modelFormat: {name: python}
    entrypoint: "iso_models:Greeter"
    isolation: process
    instances: 2
    parameters: {greeting: bonjour}
  - {name: whoami, modelFormat: {name: python}, entrypoint: "iso_models:whoami",
     isolation: process}
"""
CHILD = "servekit.runtimes.isolated_child"
ONES = np.ones((1, 16), np.float32)


def model_processes(parent: int) -> list[int]:
    """Pids of isolated-model processes whose parent is ``parent`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and CHILD.encode() in cmdline:
            found.append(int(entry.name))
    return found


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("isolation")
    (root / "iso_models.py").write_text(USER_MODULE)
    (root / "add_sub.onnx").write_bytes(onnx_bytes(onnx_builders.add_sub()))
    (root / "serve.yaml").write_text(CONFIG)
    return root


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[ServerProcess]:
    process = start_server(folder / "serve.yaml", grpc=True)
    yield process
    assert process.stop() == 0, process.log()


def others_serve(repo: Repo) -> None:
    """The ONNX model, the in-process Python model and another isolated one all answer."""
    out = repo.infer("add_sub", {"INPUT0": ONES, "INPUT1": ONES})
    np.testing.assert_array_equal(out["OUTPUT0"], ONES * 2)
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(repo.infer("local", {"x": x})["output"], x + 1)
    np.testing.assert_array_equal(repo.infer("isolated", {"x": x})["output"], x + 1)


def test_isolated_model_answers_like_the_in_process_one(repo: Repo, server: ServerProcess) -> None:
    assert repo.metadata("isolated")["inputs"] == repo.metadata("local")["inputs"]
    assert repo.metadata("isolated")["platform"] == "python"
    x = np.linspace(-1, 1, 1000, dtype=np.float32)
    assert repo.infer("isolated", {"x": x})["output"].tobytes() == (x + 1).tobytes()
    pid = int(repo.infer("whoami", {"x": np.zeros(1, np.int64)})["output"][0])
    assert pid != server.process.pid and pid in model_processes(server.process.pid)


def test_bytes_parameters_and_two_processes(repo: Repo, server: ServerProcess) -> None:
    names = np.array([b"ada", b"", "zo\u00e9".encode()], dtype=object)
    out = repo.infer("greeter", {"name": names})
    texts = [v if isinstance(v, bytes) else v.encode() for v in out["output"].tolist()]
    assert texts == [b"bonjour ada", b"bonjour ", "bonjour zo\u00e9".encode()]
    # 2 instances: 2 processes for greeter, one each for the other 5 isolated models
    assert len(model_processes(server.process.pid)) == 7


def test_segfault_is_unavailable_others_serve_and_it_comes_back(repo: Repo, folder: Path) -> None:
    x = np.ones(2, np.float32)
    np.testing.assert_array_equal(repo.infer("crashy", {"x": x})["output"], x * 2)
    marker = folder / "crash_on_load"
    marker.touch()  # restarts crash while loading too: the model stays down until it goes
    try:
        message = repo.expect_error("UNAVAILABLE", repo.infer, "crashy", {"x": -x})
        assert "SIGSEGV" in message and "restarting" in message
        row = repo.row("crashy")
        assert row["state"] == "UNAVAILABLE" and "SIGSEGV" in row["reason"], row
        assert not repo.ready("crashy")
        message = repo.expect_error("UNAVAILABLE", repo.infer, "crashy", {"x": x})
        assert "SIGSEGV" in message
        others_serve(repo)
    finally:
        marker.unlink()
    wait_until(lambda: repo.ready("crashy"), 60, "crashy READY again after restarts")
    assert repo.row("crashy") == {"name": "crashy", "version": "1", "state": "READY", "reason": ""}
    np.testing.assert_array_equal(repo.infer("crashy", {"x": x})["output"], x * 2)


def hang_forever(transport: str, http_url: str, grpc_target: str) -> tuple[str, float]:
    """Call ``hang`` so that it hangs, with a client of its own (tritonclient.http clients
    belong to the thread that made them); returns the error message and how long it took."""
    client = Repo(transport, http_url, grpc_target)
    try:
        started = time.monotonic()
        message = client.expect_error(
            "UNAVAILABLE", client.infer, "hang", {"x": -np.ones(1, np.float32)}
        )
        return message, time.monotonic() - started
    finally:
        client.close()


def test_hang_is_killed_at_its_timeout_while_others_serve(
    repo: Repo, server: ServerProcess
) -> None:
    before = set(model_processes(server.process.pid))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        hung = pool.submit(hang_forever, repo.transport, repo.http_url, repo.grpc_target)
        others_serve(repo)  # while the call hangs
        message, took = hung.result(timeout=30)
    assert "timeoutSeconds (1 s)" in message and "killed" in message
    assert 0.9 < took < 15
    wait_until(lambda: repo.ready("hang"), 60, "hang READY again")
    np.testing.assert_array_equal(repo.infer("hang", {"x": np.ones(1, np.float32)})["output"], [1])
    after = set(model_processes(server.process.pid))
    assert len(after) == len(before) and before - after  # the hung process was replaced


def test_memory_limit(repo: Repo) -> None:
    small = repo.infer("hog", {"megabytes": np.array([16], np.int64)})
    assert small["output"].tolist() == [16]
    message = repo.expect_error(
        "UNAVAILABLE", repo.infer, "hog", {"megabytes": np.array([1024], np.int64)}
    )
    assert "ran out of memory (memoryLimitBytes: 268435456)" in message
    others_serve(repo)
    wait_until(lambda: repo.ready("hog"), 60, "hog READY again")
    assert repo.infer("hog", {"megabytes": np.array([16], np.int64)})["output"].tolist() == [16]


def test_unload_ends_the_process_and_load_starts_one(repo: Repo, server: ServerProcess) -> None:
    pid = int(repo.infer("whoami", {"x": np.zeros(1, np.int64)})["output"][0])
    repo.unload("whoami")
    wait_until(lambda: not running(pid), 20, "the unloaded model's process to end")
    repo.load("whoami")
    fresh = int(repo.infer("whoami", {"x": np.zeros(1, np.int64)})["output"][0])
    assert fresh != pid and running(fresh)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_process_outlives_the_server(folder: Path, sig: int) -> None:
    server = start_server(folder / "serve.yaml", grpc=False)
    try:
        children = model_processes(server.process.pid)
        assert len(children) == 7, server.log()
    finally:
        server.stop(sig)
    for pid in children:
        wait_until(lambda pid=pid: not running(pid), 20, f"model process {pid} to end")


def test_a_load_request_cannot_lift_the_isolation(repo: Repo, server: ServerProcess) -> None:
    entry = {"modelFormat": {"name": "python"}, "entrypoint": "iso_models:whoami"}
    for change in ({"isolation": "none"}, {"isolation": "process", "memoryLimitBytes": 1 << 40}):
        message = repo.expect_error("PERMISSION_DENIED", repo.load, "whoami", {**entry, **change})
        assert "only serve.yaml can" in message
    repo.load("whoami", {"instance_group": [{"count": 1, "kind": "KIND_CPU"}]})  # Triton config
    pid = int(repo.infer("whoami", {"x": np.zeros(1, np.int64)})["output"][0])
    assert pid != server.process.pid and pid in model_processes(server.process.pid)
