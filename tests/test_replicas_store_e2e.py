"""Three replicas on one machine reading one object store, behind HAProxy (issue 41).

Three ``servekit serve`` processes on loopback ports serve a model from one S3 store (moto's
server mode), behind HAProxy (Debian's package) with an HTTP/1.1 frontend for REST and an
HTTP/2 one for gRPC, both checking ``/v2/health/ready`` every 200 ms. REST clients (httpx) and
gRPC clients (tritonclient) send requests through it the whole time:

- rolling update: a new model version is published in the store, then each replica in turn gets
  SIGTERM, exits and starts again (serving the new version);
- scale-down (one replica stopped) and scale-up (one started again);
- no request fails, and every answer is the published version's (the model adds its version
  number to the input: the answer shows which version computed it);
- the pending gauge read from the three replicas rises with the number of clients and returns
  to zero.

The load runs at least ``LOAD_S`` seconds per scenario.
"""

from __future__ import annotations

import signal
import statistics
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from haproxy import statuses
from onnx import TensorProto, helper, numpy_helper
from servers import ServerProcess, start_server
from test_remote_storage import Moto
from test_replicas_e2e import _free_port
from waits import wait_until

pytestmark = pytest.mark.slow  # end to end: servers, moto and HAProxy

LOAD_S = 20.0
"""Seconds of load per scenario at least (the issue's figure)."""
WAIT = 60.0
REST_CLIENTS = 3
GRPC_CLIENTS = 2
SLOW = """\
import time


def slow(x):
    time.sleep(0.05)
    return x
"""


def _adds(version: int) -> bytes:
    """``y = x + version``: an answer shows which version computed it."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["y"])],
        f"adds_{version}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        initializer=[numpy_helper.from_array(np.full(2, version, np.float32), "c")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def _haproxy_config(folder: Path, rest: int, grpc: int, ports: list[tuple[int, int]]) -> str:
    check = "check inter 200ms fall 2 rise 1"
    http = "\n".join(f"    server r{i} 127.0.0.1:{h} {check}" for i, (h, _) in enumerate(ports))
    h2 = "\n".join(
        f"    server r{i} 127.0.0.1:{g} proto h2 {check} port {h} check-proto h1"
        for i, (h, g) in enumerate(ports)
    )
    return f"""\
global
    stats socket {folder}/admin.sock mode 600 level admin
    maxconn 256

defaults
    mode http
    timeout connect 1s
    timeout client 30s
    timeout server 10s
    retries 3
    option redispatch
    retry-on conn-failure empty-response response-timeout

frontend rest
    bind 127.0.0.1:{rest}
    default_backend replicas

frontend grpc
    bind 127.0.0.1:{grpc} proto h2
    default_backend grpc

backend replicas
    balance roundrobin
    option httpchk GET /v2/health/ready
    http-check expect status 200
{http}

backend grpc
    balance roundrobin
    option httpchk GET /v2/health/ready
    http-check expect status 200
{h2}
"""


def _status(folder: Path) -> dict[str, str]:
    """ "backend/replica" -> status as HAProxy sees it (UP, DOWN, ...)."""
    return {f"{backend}/{server}": state for (backend, server), state in statuses(folder).items()
            if backend in ("replicas", "grpc") and server.startswith("r")}  # fmt: skip


def _states(folder: Path, replica: str) -> set[str]:
    if not (folder / "admin.sock").exists():
        return set()
    found = _status(folder)
    return {found.get(f"replicas/{replica}", ""), found.get(f"grpc/{replica}", "")}


class Load:
    """REST and gRPC clients through HAProxy until stopped; every answer checked against the
    versions published so far."""

    def __init__(self, rest_port: int, grpc_port: int) -> None:
        self.rest_port, self.grpc_port = rest_port, grpc_port
        self.published: set[int] = set()
        self.outcomes: Counter[str] = Counter()
        self.versions: Counter[int] = Counter()
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._threads = [threading.Thread(target=self._rest, daemon=True)
                         for _ in range(REST_CLIENTS)]  # fmt: skip
        self._threads += [threading.Thread(target=self._grpc, daemon=True)
                          for _ in range(GRPC_CLIENTS)]  # fmt: skip

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._done.set()
        for thread in self._threads:
            thread.join(WAIT)

    def ok(self) -> int:
        return self.outcomes["rest ok"] + self.outcomes["grpc ok"]

    def _record(self, kind: str, version: int | None, data: list[float], error: str) -> None:
        if not error:
            published = version in self.published
            expected = None if version is None else [1.0 + version, 2.0 + version]
            if not published or data != expected:
                error = f"version {version} answered {data} (published: {self.published})"
        with self._lock:
            self.outcomes[f"{kind} {'failed' if error else 'ok'}"] += 1
            if error:
                self.failures.append(f"{kind}: {error}")
            else:
                assert version is not None
                self.versions[version] += 1

    def _rest(self) -> None:
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
        with httpx.Client(base_url=f"http://127.0.0.1:{self.rest_port}", timeout=20) as http:
            while not self._done.is_set():
                version, data, error = None, [], ""
                try:
                    answer = http.post("/v2/models/adds/infer", json=body)
                    if answer.status_code == 200:
                        reply = answer.json()
                        version = int(reply["model_version"])
                        data = [float(v) for v in reply["outputs"][0]["data"]]
                    else:
                        error = f"{answer.status_code} {answer.text[:160]}"
                except httpx.HTTPError as exc:
                    error = f"{type(exc).__name__}: {exc}"
                self._record("rest", version, data, error)

    def _grpc(self) -> None:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        client = grpcclient.InferenceServerClient(f"127.0.0.1:{self.grpc_port}")
        try:
            while not self._done.is_set():
                tensor = grpcclient.InferInput("x", [1, 2], "FP32")
                tensor.set_data_from_numpy(np.array([[1, 2]], np.float32))
                version, data, error = None, [], ""
                try:
                    result = client.infer("adds", [tensor], client_timeout=20)
                    version = int(result.get_response().model_version)
                    data = [float(v) for v in result.as_numpy("y").ravel()]
                except InferenceServerException as exc:
                    error = f"{exc.status()} {exc.message()}"[:200]
                self._record("grpc", version, data, error)
        finally:
            client.close()


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    haproxy_bin: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[dict[str, Any]]:
    moto = Moto(tmp_path / "moto.log")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    moto.s3.create_bucket(Bucket="models")
    moto.s3.put_object(Bucket="models", Key="adds/1/model.onnx", Body=_adds(1))
    (tmp_path / "replica_slow.py").write_text(SLOW)
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server: {drainDelaySeconds: 1.5, inlineBelowMicroseconds: 0, strictReadiness: true,"
        " storage: {pollSeconds: 1}}\n"
        "models:\n"
        "  - {name: adds, modelFormat: {name: onnx}, storageUri: 's3://models/adds'}\n"
        "  - name: slow\n    modelFormat: {name: python}\n"
        "    entrypoint: replica_slow:slow\n"
        "    inputs: [{name: x, datatype: FP32, shape: [-1]}]\n"
        "    outputs: [{name: x, datatype: FP32, shape: [-1]}]\n"
    )
    ports = [(_free_port(), _free_port()) for _ in range(3)]
    servers: list[ServerProcess | None] = [None, None, None]
    rest, grpc = _free_port(), _free_port()
    (tmp_path / "haproxy.cfg").write_text(_haproxy_config(tmp_path, rest, grpc, ports))
    log = (tmp_path / "haproxy.log").open("w")
    argv = [haproxy_bin, "-db", "-f", str(tmp_path / "haproxy.cfg")]
    proxy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL)

    def start(i: int) -> ServerProcess:
        http, grpc_port = ports[i]
        extra = ["--http-port", str(http), "--grpc-port", str(grpc_port)]
        extra += getattr(request, "param", [])  # e.g. --watch
        server = start_server(config, extra=extra, timeout=WAIT)
        servers[i] = server
        return server

    try:
        starting = [threading.Thread(target=start, args=(i,)) for i in range(3)]
        for thread in starting:
            thread.start()
        for thread in starting:
            thread.join(WAIT * 2)
        assert all(servers), "a replica did not start"
        yield {"moto": moto, "servers": servers, "start": start, "rest": rest, "grpc": grpc,
               "folder": tmp_path, "ports": ports}  # fmt: skip
    finally:
        for server in servers:
            if server is not None and server.alive():
                server.stop(signal.SIGKILL)
        proxy.terminate()
        proxy.wait(10)
        log.close()
        moto.stop()


def _stop(folder: Path, servers: list[ServerProcess | None], i: int) -> None:
    """SIGTERM replica ``i``: HAProxy drops it while it still serves, then it exits."""
    server = servers[i]
    assert server is not None
    server.process.send_signal(signal.SIGTERM)
    wait_until(lambda: "UP" not in _states(folder, f"r{i}"), WAIT, f"HAProxy to drop r{i}")
    assert server.process.wait(WAIT) == 0, server.log()
    server.stop()
    servers[i] = None


def _up(folder: Path, i: int) -> None:
    wait_until(lambda: _states(folder, f"r{i}") == {"UP"}, WAIT, f"r{i} UP in HAProxy")


def _pending(ports: list[tuple[int, int]]) -> float:
    """``servekit_pending_requests`` of the slow model, summed over the three replicas."""
    total = 0.0
    for http, _ in ports:
        text = httpx.get(f"http://127.0.0.1:{http}/metrics", timeout=5).text
        for line in text.splitlines():
            if line.startswith('servekit_pending_requests{model="slow"'):
                total += float(line.split()[-1])
    return total


def _slow_load(rest: int, clients: int, seconds: float, ports: list[tuple[int, int]]) -> float:
    """``clients`` callers of the slow model through HAProxy for ``seconds``: the mean of the
    pending gauge over the replicas meanwhile."""
    done = threading.Event()
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]}
    errors: list[str] = []
    answered: list[int] = []

    def call() -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{rest}", timeout=20) as http:
            while not done.is_set():
                answer = http.post("/v2/models/slow/infer", json=body)
                answered.append(answer.status_code)
                if answer.status_code != 200:
                    errors.append(answer.text[:160])

    threads = [threading.Thread(target=call, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(answered) >= 2 * clients, WAIT, "the callers' steady state")
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        samples.append(_pending(ports))
    done.set()
    for thread in threads:
        thread.join(WAIT)
    assert not errors, errors[:3]
    return statistics.mean(samples)


@pytest.mark.timeout(300)  # four starts of a replica under load: ~80 s on 2 idle cores
def test_three_replicas_on_one_store_roll_scale_and_report_pending_without_a_failure(
    cluster: dict[str, Any],
) -> None:
    folder: Path = cluster["folder"]
    servers: list[ServerProcess | None] = cluster["servers"]
    moto: Moto = cluster["moto"]
    for i in range(3):
        _up(folder, i)

    # The pending gauge over the three replicas: one slow caller per replica queues nothing,
    # three per replica queue about two each; once the callers stop, nothing is pending.
    few = _slow_load(cluster["rest"], 3, 2.0, cluster["ports"])
    many = _slow_load(cluster["rest"], 9, 2.0, cluster["ports"])
    assert many > few + 2, (few, many)
    wait_until(lambda: _pending(cluster["ports"]) == 0, WAIT, "nothing pending")

    load = Load(cluster["rest"], cluster["grpc"])
    load.published.add(1)
    load.start()
    try:
        wait_until(lambda: load.ok() >= 100, WAIT, "load through HAProxy")
        # Rolling update, twice: publish a version, restart each replica in turn.
        began = time.monotonic()
        load.published.add(2)
        moto.s3.put_object(Bucket="models", Key="adds/2/model.onnx", Body=_adds(2))
        for i in range(3):
            _stop(folder, servers, i)
            cluster["start"](i)
            _up(folder, i)
        wait_until(lambda: time.monotonic() - began >= LOAD_S, LOAD_S, "the rolling load time")
        rolled = time.monotonic() - began
        # Every replica now serves version 2.
        before = load.versions[2]
        wait_until(lambda: load.versions[2] >= before + 50, WAIT, "answers of version 2")

        # Scale down (replica 2 stopped), then up (started again), under load.
        began = time.monotonic()
        _stop(folder, servers, 2)
        ok = load.ok()
        wait_until(lambda: load.ok() >= ok + 100, WAIT, "load on two replicas")
        cluster["start"](2)
        _up(folder, 2)
        wait_until(lambda: time.monotonic() - began >= LOAD_S, LOAD_S, "the scaling load time")
        scaled = time.monotonic() - began
    finally:
        load.stop()
    assert not load.failures, (
        f"{len(load.failures)} of {sum(load.outcomes.values())} failed: {load.failures[:5]}"
    )
    assert load.outcomes["rest ok"] >= 200 and load.outcomes["grpc ok"] >= 100, load.outcomes
    assert set(load.versions) == {1, 2}, load.versions
    print(f"rolling {rolled:.1f} s, scaling {scaled:.1f} s: {dict(load.outcomes)}, by version "
          f"{dict(load.versions)}; pending over 3 replicas {few:.2f} -> {many:.2f}")  # fmt: skip


def _serves(http: int) -> int:
    """The version a replica answers with (asked directly, not through HAProxy)."""
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    answer = httpx.post(f"http://127.0.0.1:{http}/v2/models/adds/infer", json=body, timeout=10)
    return int(answer.json()["model_version"]) if answer.status_code == 200 else 0


@pytest.mark.parametrize("cluster", [["--watch"]], indirect=True, ids=["watch"])
def test_a_version_published_in_the_store_reaches_every_watching_replica_under_load(
    cluster: dict[str, Any],
) -> None:
    """Replicas under ``--watch`` look at the store every ``server.storage.pollSeconds``: a
    version published once reaches all three, and no request fails meanwhile."""
    folder: Path = cluster["folder"]
    for i in range(3):
        _up(folder, i)
    load = Load(cluster["rest"], cluster["grpc"])
    load.published.update({1, 2})
    load.start()
    try:
        wait_until(lambda: load.ok() >= 100, WAIT, "load through HAProxy")
        began = time.monotonic()
        cluster["moto"].s3.put_object(Bucket="models", Key="adds/2/model.onnx", Body=_adds(2))
        for http, _ in cluster["ports"]:
            wait_until(lambda: _serves(http) == 2, WAIT, "every replica on version 2")  # noqa: B023
        reached = time.monotonic() - began
        before = load.versions[2]
        wait_until(lambda: load.versions[2] >= before + 50, WAIT, "answers of version 2")
    finally:
        load.stop()
    assert not load.failures, load.failures[:5]
    print(f"version 2 on all three replicas {reached:.1f} s after it was published")
