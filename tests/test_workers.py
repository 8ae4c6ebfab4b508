"""``servekit serve --workers 2``: one repository state, one set of numbers, restarts, drain.

Real servers (tests/servers.py) and real clients. Every HTTP call here opens a new connection
(``httpx.request``), so the kernel's SO_REUSEPORT spreads the calls over both workers: a state
that only one worker holds shows up as an answer that disagrees with the one before.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import httpx
import numpy as np
import onnx_builders
import pytest
from prometheus_client.parser import text_string_to_metric_families
from repo_helpers import onnx_bytes
from servers import ServerProcess, running_server, start_server
from tritonclient.grpc import service_pb2, service_pb2_grpc
from waits import wait_until

pytestmark = pytest.mark.slow

SLOW_MODULE = """
import time
from pathlib import Path

import numpy as np
from numpy.typing import NDArray


def predict(x: NDArray[np.float32]) -> NDArray[np.float32]:
    with (Path(__file__).parent / "started.txt").open("a") as log:
        log.write("1\\n")
    time.sleep(1.5)
    return x + 1
"""

# drainSeconds: each worker runs "slow" one call at a time (one instance), so a worker's share of
# the SIGTERM test's requests takes longer than the default drain; the supervisor waits for it.
CONFIG = """\
server: {strictReadiness: false, drainSeconds: 30}
models:
  - {name: add_sub, modelFormat: {name: onnx}, storageUri: add_sub.onnx}
  - {name: mlp, modelFormat: {name: onnx}, storageUri: mlp.onnx}
  - {name: slow, modelFormat: {name: python}, entrypoint: "slow_model:predict"}
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("workers")
    (root / "add_sub.onnx").write_bytes(onnx_bytes(onnx_builders.add_sub()))
    (root / "mlp.onnx").write_bytes(onnx_bytes(onnx_builders.mlp()))
    (root / "slow_model.py").write_text(SLOW_MODULE)
    config = root / "serve.yaml"
    config.write_text(CONFIG)
    return config


@pytest.fixture(scope="module")
def server(store: Path) -> Iterator[ServerProcess]:
    with running_server(store, extra=["--workers", "2"]) as running:
        yield running


def call(server: ServerProcess, method: str, path: str, **kwargs: object) -> httpx.Response:
    """One request on a new connection."""
    return httpx.request(method, server.http_url + path, timeout=30.0, **kwargs)


def add_sub_body(value: float = 1.0) -> dict[str, object]:
    data = [value] * 16
    return {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": data},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": data},
        ]
    }


def mlp_body() -> dict[str, object]:
    return {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}


def push_body(model: bytes) -> dict[str, object]:
    """A repository load pushing ``model`` as version 1 (Triton's JSON: files in base64)."""
    config = json.dumps({"backend": "onnxruntime"})
    return {"parameters": {"config": config, "file:1/model.onnx": base64.b64encode(model).decode()}}


def workers_of(server: ServerProcess) -> list[int]:
    """The worker processes (the supervisor's children)."""
    pid = server.process.pid
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def worker_rows(server: ServerProcess) -> dict[int, dict[str, Any]]:
    """``GET /servekit/v1/workers`` by worker index."""
    answer = call(server, "GET", "/servekit/v1/workers")
    assert answer.status_code == 200, answer.text
    return {int(row["index"]): row for row in answer.json()["workers"]}


def samples(server: ServerProcess) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """/metrics as sample name -> labels -> value (parsed by prometheus-client)."""
    text = call(server, "GET", "/metrics").text
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def by_worker(
    metrics: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str
) -> dict[int, float]:
    return {int(dict(labels)["worker"]): value for labels, value in metrics[name].items()}


def total_success(server: ServerProcess) -> int:
    """Successful requests of every model version, from the statistics extension."""
    stats = call(server, "GET", "/v2/models/stats").json()["model_stats"]
    return int(sum(s["inference_stats"]["success"]["count"] for s in stats))


def states(server: ServerProcess, name: str) -> set[str]:
    index = call(server, "POST", "/v2/repository/index").json()
    return {row.get("state", "") for row in index if row["name"] == name}


def test_two_workers_listen_on_the_same_ports(server: ServerProcess) -> None:
    assert "(2 workers)" in "".join(server.stdout_lines)
    assert len(workers_of(server)) == 2
    metrics = call(server, "GET", "/metrics").text
    assert "servekit_workers 2.0" in metrics


def test_200_control_and_infer_calls_see_one_state(server: ServerProcess) -> None:
    """load, index, infer, unload, index, infer in turn, 200 calls, each on a new connection:
    every answer agrees with the last change, whichever worker gives it."""
    name, inputs = "mlp", mlp_body()
    try:
        for step in range(200):
            kind = step % 6
            if kind in (0, 3):
                action = "load" if kind == 0 else "unload"
                answer = call(server, "POST", f"/v2/repository/models/{name}/{action}")
                assert answer.status_code == 200, (step, answer.text)
            elif kind in (1, 4):
                expected = {"READY"} if kind == 1 else {"UNAVAILABLE"}
                assert states(server, name) == expected, step
            else:
                answer = call(server, "POST", f"/v2/models/{name}/infer", json=inputs)
                if kind == 2:
                    assert answer.status_code == 200, (step, answer.text)
                else:
                    assert answer.status_code != 200 and "error" in answer.json(), step
    finally:
        call(server, "POST", f"/v2/repository/models/{name}/load")


def test_a_push_reaches_every_worker_and_an_unload_removes_it_everywhere(
    server: ServerProcess,
) -> None:
    name = "pushed_add_sub"
    body = push_body(onnx_bytes(onnx_builders.add_sub()))
    assert call(server, "POST", f"/v2/repository/models/{name}/load", json=body).status_code == 200
    for _ in range(20):
        answer = call(server, "POST", f"/v2/models/{name}/infer", json=add_sub_body(2.0))
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["data"][0] == 4.0
    assert call(server, "POST", f"/v2/repository/models/{name}/unload").status_code == 200
    for _ in range(20):
        assert call(server, "POST", f"/v2/models/{name}/infer", json=add_sub_body()).status_code
        assert name not in {r["name"] for r in call(server, "POST", "/v2/repository/index").json()}


def test_a_failed_load_answers_the_error_and_changes_nothing(server: ServerProcess) -> None:
    body = push_body(b"garbage" * 40)
    answer = call(server, "POST", "/v2/repository/models/add_sub/load", json=body)
    assert answer.status_code == 400
    assert "error" in answer.json()
    for _ in range(10):
        assert states(server, "add_sub") == {"READY"}


def test_statistics_add_up_across_workers(server: ServerProcess) -> None:
    def success(text: str) -> int:
        stats = json.loads(text)["model_stats"]
        return int(sum(s["inference_stats"]["success"]["count"] for s in stats))

    before = success(call(server, "GET", "/v2/models/add_sub/stats").text)
    sent = 40
    for _ in range(sent):
        answer = call(server, "POST", "/v2/models/add_sub/infer", json=add_sub_body())
        assert answer.status_code == 200
    assert server.grpc_target is not None
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="add_sub")
        for name in ("INPUT0", "INPUT1"):
            tensor = request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
            tensor.contents.fp32_contents.extend([1.0] * 16)
        for _ in range(10):
            stub.ModelInfer(request)
        sent += 10
        for _ in range(6):  # every answer, from either worker, is the total
            grpc_stats = stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name="add_sub"))
            assert grpc_stats.model_stats[0].inference_stats.success.count == before + sent
    for _ in range(6):
        assert success(call(server, "GET", "/v2/models/add_sub/stats").text) == before + sent
        metrics = call(server, "GET", "/metrics").text
        line = next(
            row for row in metrics.splitlines()
            if row.startswith('servekit_inference_success_total{model="add_sub"')
        )  # fmt: skip
        assert float(line.rsplit(" ", 1)[1]) == before + sent


def test_each_workers_share_adds_up_to_the_totals_and_to_what_was_sent(
    server: ServerProcess,
) -> None:
    """The shares count every request since start, models unloaded since included (the
    per-model totals forget those), so it is their growth that is compared."""

    def success_sums() -> tuple[float, float]:
        metrics = samples(server)
        shares = by_worker(metrics, "servekit_worker_inference_success_total")
        return sum(shares.values()), sum(metrics["servekit_inference_success_total"].values())

    before = worker_rows(server)
    assert set(before) == {0, 1}
    assert {row["pid"] for row in before.values()} == set(workers_of(server))
    assert all(row["state"] == "serving" and row["restarts"] == 0 for row in before.values())
    assert all(str(row["upSince"]).endswith("Z") for row in before.values())
    total_before, (shares_before, models_before) = total_success(server), success_sums()
    sent = 40
    for _ in range(sent):  # each on a new connection: the kernel spreads them over both
        answer = call(server, "POST", "/v2/models/add_sub/infer", json=add_sub_body())
        assert answer.status_code == 200
    for _ in range(6):  # every answer, from either worker, is the same
        after = worker_rows(server)
        grown = {i: after[i]["inferenceSuccess"] - before[i]["inferenceSuccess"] for i in after}
        assert sum(grown.values()) == sent, grown
        assert all(n > 0 for n in grown.values()), f"one worker served everything: {grown}"
        assert total_success(server) == total_before + sent
        shares, models = success_sums()
        assert (shares - shares_before, models - models_before) == (sent, sent)
        metrics = samples(server)
        success = by_worker(metrics, "servekit_worker_inference_success_total")
        assert success == {i: float(row["inferenceSuccess"]) for i, row in after.items()}
        failure = by_worker(metrics, "servekit_worker_inference_failure_total")
        assert failure == {i: float(row["inferenceFailure"]) for i, row in after.items()}
        assert by_worker(metrics, "servekit_worker_up") == {0: 1.0, 1: 1.0}
        assert by_worker(metrics, "servekit_worker_restarts_by_worker_total") == {0: 0.0, 1: 0.0}
        assert set(by_worker(metrics, "servekit_worker_start_time_seconds")) == {0, 1}


def test_sigkill_of_a_worker_under_load_is_survived(store: Path) -> None:
    with running_server(store, extra=["--workers", "2"]) as server:
        # A pushed model: the restarted worker must hold it too (it replays the journal).
        body = push_body(onnx_bytes(onnx_builders.add_sub()))
        load = call(server, "POST", "/v2/repository/models/kept/load", json=body)
        assert load.status_code == 200
        stop = threading.Event()
        answers: list[int] = []
        refused: list[str] = []

        def load_loop() -> None:
            while not stop.is_set():
                try:
                    answer = call(server, "POST", "/v2/models/add_sub/infer", json=add_sub_body())
                    answers.append(answer.status_code)
                except httpx.TransportError as exc:  # a connection the dead worker held
                    refused.append(repr(exc))

        thread = threading.Thread(target=load_loop)
        thread.start()
        try:
            wait_until(lambda: len(answers) >= 20, 30, "requests before the kill")
            victim, survivor = workers_of(server)
            index = next(i for i, row in worker_rows(server).items() if row["pid"] == victim)
            os.kill(victim, signal.SIGKILL)
            wait_until(
                lambda: len(workers_of(server)) == 2 and victim not in workers_of(server),
                60,
                "the supervisor to restart the worker",
            )
            count = len(answers)
            wait_until(lambda: len(answers) >= count + 40, 60, "requests after the restart")
        finally:
            stop.set()
            thread.join(30)
        assert survivor in workers_of(server)
        assert set(answers) == {200}, "a request answered by a live worker failed"
        assert len(refused) <= 5, refused
        log = server.log()
        assert "restarting it" in log
        wait_until(
            lambda: "servekit_worker_restarts_total 1.0" in call(server, "GET", "/metrics").text,
            30,
            "the restart counted",
        )
        # ... per worker too: the victim's position restarted once, under a new process.
        wait_until(
            lambda: worker_rows(server)[index]["state"] == "serving", 30, "the new worker serving"
        )
        rows = worker_rows(server)
        assert rows[index]["restarts"] == 1 and rows[1 - index]["restarts"] == 0
        assert rows[index]["pid"] not in (victim, survivor) and rows[1 - index]["pid"] == survivor
        metrics = samples(server)
        restarts = by_worker(metrics, "servekit_worker_restarts_by_worker_total")
        assert restarts == {index: 1.0, 1 - index: 0.0}
        assert by_worker(metrics, "servekit_worker_up") == {0: 1.0, 1: 1.0}
        # What the dead worker counted (up to the last read) stays, in its share and the total.
        shares = sum(int(row["inferenceSuccess"]) for row in rows.values())
        assert shares == total_success(server)
        # Both the survivor and the new worker serve the pushed model.
        for _ in range(20):
            answer = call(server, "POST", "/v2/models/kept/infer", json=add_sub_body())
            assert answer.status_code == 200, answer.text


def test_sigterm_drains_every_worker(store: Path) -> None:
    started = store.parent / "started.txt"
    started.unlink(missing_ok=True)
    server = start_server(store, extra=["--workers", "2"])
    try:
        pids = workers_of(server)
        results: list[int | str] = []
        body = {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}

        def one() -> None:
            try:
                results.append(call(server, "POST", "/v2/models/slow/infer", json=body).status_code)
            except httpx.HTTPError as exc:
                results.append(repr(exc))

        threads = [threading.Thread(target=one) for _ in range(8)]
        for thread in threads:
            thread.start()

        def in_flight() -> int:
            return len(started.read_text().splitlines()) if started.exists() else 0

        wait_until(lambda: in_flight() >= 4, 30, "slow requests in flight")
        server.process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(60)
        assert server.process.wait(60) == 0
        # Every request a worker had started finished; one not yet accepted may be refused.
        assert results.count(200) >= in_flight(), results
        assert all(r == 200 or "Connect" in str(r) for r in results), results
        wait_until(lambda: not any(Path(f"/proc/{p}").exists() for p in pids), 10, "workers gone")
    finally:
        server.stop()


def test_workers_setting_in_serve_yaml_and_auto(tmp_path: Path) -> None:
    (tmp_path / "add_sub.onnx").write_bytes(onnx_bytes(onnx_builders.add_sub()))
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server: {workers: auto}\n"
        "models:\n  - {name: add_sub, modelFormat: {name: onnx}, storageUri: add_sub.onnx}\n"
    )
    cores = len(os.sched_getaffinity(0))
    with running_server(config) as server:
        if cores > 1:
            assert f"({cores} workers)" in "".join(server.stdout_lines)
            assert len(workers_of(server)) == cores
        answer = call(server, "POST", "/v2/models/add_sub/infer", json=add_sub_body())
        assert answer.status_code == 200
        assert np.allclose(answer.json()["outputs"][0]["data"], [2.0] * 16)


def test_a_serve_yaml_edit_under_watch_reaches_every_worker(tmp_path: Path) -> None:
    (tmp_path / "add_sub.onnx").write_bytes(onnx_bytes(onnx_builders.add_sub()))
    (tmp_path / "mlp.onnx").write_bytes(onnx_bytes(onnx_builders.mlp()))
    config = tmp_path / "serve.yaml"
    both = (
        "models:\n"
        "  - {name: add_sub, modelFormat: {name: onnx}, storageUri: add_sub.onnx}\n"
        "  - {name: mlp, modelFormat: {name: onnx}, storageUri: mlp.onnx}\n"
    )
    config.write_text(both)
    with running_server(config, extra=["--workers", "2", "--watch"]) as server:
        config.write_text(both.rsplit("  - {name: mlp", 1)[0])

        def names() -> set[str]:
            return {r["name"] for r in call(server, "POST", "/v2/repository/index").json()}

        wait_until(lambda: "mlp" not in names(), 30, "the edit applied")
        for _ in range(20):  # every worker applied it
            assert names() == {"add_sub"}


ONCE_MODULE = """
import os
from pathlib import Path

import numpy as np
from numpy.typing import NDArray


class Once:
    # Loads in one process only: the first to claim the marker file.

    def load(self):
        fd = os.open(Path(__file__).parent / "claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        os.close(fd)

    def predict(self, x: NDArray[np.float32]) -> NDArray[np.float32]:
        return x
"""


def test_a_model_that_loads_on_one_worker_only_is_unavailable_everywhere(tmp_path: Path) -> None:
    (tmp_path / "add_sub.onnx").write_bytes(onnx_bytes(onnx_builders.add_sub()))
    (tmp_path / "once_model.py").write_text(ONCE_MODULE)
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server: {strictReadiness: false}\nmodels:\n"
        "  - {name: add_sub, modelFormat: {name: onnx}, storageUri: add_sub.onnx}\n"
        '  - {name: once, modelFormat: {name: python}, entrypoint: "once_model:Once"}\n'
    )

    def once_rows() -> list[dict[str, str]]:
        rows = call(server, "POST", "/v2/repository/index").json()
        return [r for r in rows if r["name"] == "once"]

    with running_server(config, extra=["--workers", "2"]) as server:
        for _ in range(10):  # at start: loaded on one worker, failed on the other
            (row,) = once_rows()
            assert row["state"] == "UNAVAILABLE" and "worker" in row["reason"], row
        (tmp_path / "claimed").unlink()
        answer = call(server, "POST", "/v2/repository/models/once/load")
        assert answer.status_code == 400
        assert "worker" in answer.json()["error"], answer.text
        for _ in range(10):  # a load that worked on one worker only: unavailable everywhere
            (row,) = once_rows()
            assert row["state"] == "UNAVAILABLE" and "worker" in row["reason"], row
            assert call(server, "GET", "/v2/models/once/ready").status_code != 200


def test_worker_figures_need_the_admin_token(tmp_path: Path) -> None:
    """Process ids, restarts and request counts are admin data, on every surface."""
    token = "admin-token-for-workers"
    (tmp_path / "add_sub.onnx").write_bytes(onnx_bytes(onnx_builders.add_sub()))
    config = tmp_path / "serve.yaml"
    config.write_text(
        f"server: {{auth: {{admin: {token}}}}}\n"
        "models:\n  - {name: add_sub, modelFormat: {name: onnx}, storageUri: add_sub.onnx}\n"
    )
    bearer = {"Authorization": f"Bearer {token}"}
    with running_server(config, grpc=False, extra=["--workers", "2"]) as server:
        refused = call(server, "GET", "/servekit/v1/workers")
        assert refused.status_code == 401 and "error" in refused.json()
        listed = call(server, "GET", "/servekit/v1/workers", headers=bearer).json()["workers"]
        assert [row["index"] for row in listed] == [0, 1]
        overview = call(server, "GET", "/dashboard/api/overview").json()
        assert overview["workers"] == []
        overview = call(server, "GET", "/dashboard/api/overview", headers=bearer).json()
        assert [row["pid"] for row in overview["workers"]] == [row["pid"] for row in listed]
        home = call(server, "GET", "/").text
        assert 'id="worker-table"' not in home and 'data-gated="admin"' in home
        assert 'id="worker-table"' in call(server, "GET", "/", headers=bearer).text


# -- heartbeats: a stopped worker is found, named, killed and restarted -----------------------
# The supervisor pings every worker each second, shows one silent for 3 s ``unresponsive`` and
# kills it (SIGKILL) past 10 s (app/servekit/workers/supervisor.py). These bounds leave slack for
# a busy machine; a hang (the code before heartbeats) exceeds every one of them.
UNRESPONSIVE_WITHIN = 10.0
KILLED_WITHIN = 25.0
CONTROL_ANSWERED_WITHIN = 10.0


@pytest.fixture(scope="module")
def stoppable(store: Path) -> Iterator[ServerProcess]:
    """A server of its own: its workers get stopped and restarted."""
    with running_server(store, extra=["--workers", "2"]) as running:
        yield running
        pids = workers_of(running)
    wait_until(lambda: not any(Path(f"/proc/{p}").exists() for p in pids), 30, "workers gone")


class Pinned:
    """One keep-alive HTTP connection: every request on it reaches the worker that accepted it
    (asserted: a reconnect would land on either worker)."""

    def __init__(self, server: ServerProcess) -> None:
        url = urlsplit(server.http_url)
        assert url.hostname is not None and url.port is not None
        self.server_port = url.port
        self.connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        self.connection.connect()
        assert self.connection.sock is not None
        self.local = self.connection.sock.getsockname()

    def request(self, method: str, path: str, body: object = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {} if data is None else {"Content-Type": "application/json"}
        self.connection.request(method, path, body=data, headers=headers)
        answer = self.connection.getresponse()
        payload = json.loads(answer.read() or b"null")
        sock = self.connection.sock
        assert sock is not None and sock.getsockname() == self.local, "the connection was closed"
        return answer.status, payload

    def rows(self) -> dict[int, dict[str, Any]]:
        status, payload = self.request("GET", "/servekit/v1/workers")
        assert status == 200, payload
        rows = {int(row["index"]): row for row in payload["workers"]}
        assert set(rows) == {0, 1}, f"a worker is missing from the list: {payload}"
        return rows

    def holder(self, server: ServerProcess) -> int:
        """The worker process that accepted this connection (its socket's inode in /proc)."""
        self.request("GET", "/v2/health/live")  # accepted by now
        inodes = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, remote = (int(f.rsplit(":", 1)[1], 16) for f in fields[1:3])
                if (local, remote) == (self.server_port, self.local[1]):
                    inodes.add(f"socket:[{fields[9]}]")
        for pid in workers_of(server):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return pid
        raise AssertionError("no worker holds the connection")

    def close(self) -> None:
        self.connection.close()


def stop_the_other_worker(server: ServerProcess, pinned: Pinned) -> tuple[int, int, int]:
    """SIGSTOP the worker that does not hold ``pinned``: (its pid, its index, the other's)."""
    wait_until(
        lambda: all(r["state"] == "serving" for r in pinned.rows().values()), 60, "both serving"
    )
    live = pinned.holder(server)
    (victim,) = [pid for pid in workers_of(server) if pid != live]
    rows = pinned.rows()
    index = next(i for i, row in rows.items() if row["pid"] == victim)
    os.kill(victim, signal.SIGSTOP)
    return victim, index, 1 - index


def resume(pid: int) -> None:
    """SIGCONT a worker a test stopped, should it still exist (no stopped process is left)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


def test_a_stopped_worker_is_shown_unresponsive_then_killed_and_restarted(
    stoppable: ServerProcess,
) -> None:
    server = stoppable
    pinned = Pinned(server)
    victim = -1
    try:
        restarts = pinned.rows()
        victim, index, other = stop_the_other_worker(server, pinned)
        stopped = time.monotonic()
        seen: list[tuple[int | None, str]] = []

        def unresponsive() -> bool:
            row = pinned.rows()[index]
            seen.append((row["pid"], row["state"]))
            return row["state"] == "unresponsive"

        wait_until(unresponsive, UNRESPONSIVE_WITHIN, "the stopped worker shown unresponsive")
        row = pinned.rows()[index]
        assert row["pid"] == victim and row["heartbeatAgeSeconds"] >= 3.0, row
        assert pinned.rows()[other]["state"] == "serving"
        assert pinned.rows()[other]["heartbeatAgeSeconds"] < 3.0
        wait_until(
            lambda: not Path(f"/proc/{victim}").exists(),
            KILLED_WITHIN - (time.monotonic() - stopped),
            "the supervisor to kill the stopped worker",
        )

        def serving_again() -> bool:
            row = pinned.rows()[index]
            seen.append((row["pid"], row["state"]))
            return row["state"] == "serving" and row["pid"] != victim

        wait_until(serving_again, 60, "the restarted worker serving")
        states_seen = [state for _, state in seen]
        assert states_seen.index("unresponsive") < len(states_seen) - 1
        rows = pinned.rows()
        assert rows[index]["restarts"] == restarts[index]["restarts"] + 1
        assert rows[other]["restarts"] == restarts[other]["restarts"]
        assert "answered no heartbeat" in server.log()
        # New connections reach both workers again, every one answered.
        for _ in range(20):
            assert call(server, "GET", "/v2/health/ready").json() == {"ready": True}
            answer = call(server, "POST", "/v2/models/add_sub/infer", json=add_sub_body())
            assert answer.status_code == 200, answer.text
        assert server.grpc_target is not None
        for _ in range(10):
            with grpc.insecure_channel(server.grpc_target) as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                assert stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=10).ready
    finally:
        resume(victim)
        pinned.close()


def test_a_repository_load_while_a_worker_is_stopped_answers_naming_it(
    stoppable: ServerProcess,
) -> None:
    server = stoppable
    pinned = Pinned(server)
    victim = -1
    name = "pushed_while_stopped"
    try:
        victim, index, other = stop_the_other_worker(server, pinned)
        started = time.monotonic()
        status, payload = pinned.request(
            "POST",
            f"/v2/repository/models/{name}/load",
            push_body(onnx_bytes(onnx_builders.add_sub())),
        )
        took = time.monotonic() - started
        assert took < CONTROL_ANSWERED_WITHIN, f"the load took {took:.1f} s"
        assert status == 503, payload
        message = payload["error"]
        assert f"worker {index} has not answered" in message, message
        assert f"applied on worker {other}" in message, message
        # What the live worker did stands ...
        status, answer = pinned.request("POST", f"/v2/models/{name}/infer", add_sub_body(2.0))
        assert status == 200 and answer["outputs"][0]["data"][0] == 4.0, answer
        # ... and the silent one, killed, replays it as it starts again.
        wait_until(
            lambda: not Path(f"/proc/{victim}").exists(), KILLED_WITHIN, "the stopped worker killed"
        )
        wait_until(
            lambda: pinned.rows()[index]["state"] == "serving", 60, "the restarted worker serving"
        )
        for _ in range(20):  # new connections: both workers serve the model
            answer = call(server, "POST", f"/v2/models/{name}/infer", json=add_sub_body(2.0))
            assert answer.status_code == 200, answer.text
    finally:
        resume(victim)
        pinned.close()
