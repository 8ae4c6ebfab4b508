"""Three replicas started from one serve.yaml in object storage, each with ``--watch`` (issue 41).

``servekit serve s3://models/prod/serve.yaml --watch`` on three loopback ports, behind HAProxy
(the helpers of tests/test_replicas_store_e2e.py), reading moto's S3: the config and the model
it names (``storageUri: adds``, relative: ``s3://models/prod/adds``). Under light REST and
gRPC load through HAProxy:

- an edit of the object (a second model added) reaches all three replicas within a bounded
  time;
- a broken edit is refused by all three, which keep serving the configuration before it;
- the store going away is logged by all three, which keep serving;

and no request fails.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from servers import ServerProcess, start_server
from test_remote_storage import Moto
from test_replicas_e2e import _free_port
from test_replicas_store_e2e import Load, _adds, _haproxy_config, _up
from waits import wait_until

pytestmark = pytest.mark.slow  # end to end: servers, moto and HAProxy

WAIT = 60.0
REACH_S = 15.0
"""An edit must reach every replica within this long (pollSeconds is 1 here)."""
URI = "s3://models/prod/serve.yaml"
HEAD = (
    "server: {drainDelaySeconds: 1.5, inlineBelowMicroseconds: 0, strictReadiness: true,"
    " storage: {pollSeconds: 1}}\n"
    "models:\n"
    "  - {name: adds, modelFormat: {name: onnx}, storageUri: adds}\n"
)
ADDED = HEAD + "  - {name: added, modelFormat: {name: onnx}, storageUri: adds}\n"
BROKEN = ADDED + "  - {name: broken, modelFormat: {name: onnx}, maxBatchSize: -3}\n"


@pytest.fixture
def replicas(
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
    moto.s3.put_object(Bucket="models", Key="prod/adds/1/model.onnx", Body=_adds(1))
    moto.s3.put_object(Bucket="models", Key="prod/serve.yaml", Body=HEAD.encode())
    ports = [(_free_port(), _free_port()) for _ in range(3)]
    servers: list[ServerProcess | None] = [None, None, None]
    rest, grpc = _free_port(), _free_port()
    (tmp_path / "haproxy.cfg").write_text(_haproxy_config(tmp_path, rest, grpc, ports))
    log = (tmp_path / "haproxy.log").open("w")
    argv = [haproxy_bin, "-db", "-f", str(tmp_path / "haproxy.cfg")]
    proxy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL)

    def start(i: int) -> None:
        http, grpc_port = ports[i]
        ports_args = ["--http-port", str(http), "--grpc-port", str(grpc_port)]
        command = [sys.executable, "-m", "servekit", "serve", URI, "--watch", "--host",
                   "127.0.0.1", *ports_args]  # fmt: skip
        # The config argument only names the folder for the log and the working directory.
        servers[i] = start_server(tmp_path / "serve.yaml", command=command, timeout=WAIT)

    try:
        starting = [threading.Thread(target=start, args=(i,)) for i in range(3)]
        for thread in starting:
            thread.start()
        for thread in starting:
            thread.join(WAIT * 2)
        assert all(servers), "a replica did not start"
        yield {"moto": moto, "servers": servers, "rest": rest, "grpc": grpc,
               "folder": tmp_path, "ports": ports}  # fmt: skip
    finally:
        for server in servers:
            if server is not None and server.alive():
                server.stop(signal.SIGKILL)
        proxy.terminate()
        proxy.wait(10)
        log.close()
        moto.stop()


def _ready(http: int, model: str) -> bool:
    answer = httpx.get(f"http://127.0.0.1:{http}/v2/models/{model}/ready", timeout=5)
    return answer.status_code == 200


def _adds_answers(http: int, model: str) -> bool:
    """Whether ``model`` on one replica (asked directly) computes version 1's answer."""
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    answer = httpx.post(f"http://127.0.0.1:{http}/v2/models/{model}/infer", json=body, timeout=10)
    return answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [2.0, 3.0]


@pytest.mark.timeout(180)
def test_an_edit_of_a_remote_serve_yaml_reaches_every_watching_replica_and_a_broken_one_none(
    replicas: dict[str, Any],
) -> None:
    folder: Path = replicas["folder"]
    moto: Moto = replicas["moto"]
    servers: list[ServerProcess] = replicas["servers"]
    https = [http for http, _ in replicas["ports"]]
    for i in range(3):
        _up(folder, i)
    assert not any(_ready(http, "added") for http in https)
    load = Load(replicas["rest"], replicas["grpc"])
    load.published.add(1)
    load.start()
    try:
        wait_until(lambda: load.ok() >= 50, WAIT, "load through HAProxy")

        # An edit: a model added. Every replica reads the object again and loads it.
        began = time.monotonic()
        moto.s3.put_object(Bucket="models", Key="prod/serve.yaml", Body=ADDED.encode())
        for http in https:
            wait_until(lambda: _ready(http, "added"), REACH_S, "the added model on a replica")  # noqa: B023
        reached = time.monotonic() - began
        assert all(_adds_answers(http, "added") for http in https)

        # A broken edit: refused by each replica, which keeps the configuration it serves.
        moto.s3.put_object(Bucket="models", Key="prod/serve.yaml", Body=BROKEN.encode())
        for server in servers:
            wait_until(lambda: "edit rejected" in server.log(), REACH_S, "the edit refused")  # noqa: B023
            assert "maxBatchSize" in server.log() and "s3://models/prod/serve.yaml" in server.log()
        for http in https:
            assert _ready(http, "added") and _adds_answers(http, "added")
            assert not _ready(http, "broken")

        # The store goes away: every replica says so once and keeps serving.
        ok = load.ok()
        moto.stop()
        for server in servers:
            wait_until(
                lambda: "still serving the current configuration" in server.log(),  # noqa: B023
                REACH_S,
                "the outage logged",
            )
        wait_until(lambda: load.ok() >= ok + 50, WAIT, "load while the store is down")
        for http in https:
            assert _adds_answers(http, "adds") and _adds_answers(http, "added")
    finally:
        load.stop()
    assert not load.failures, load.failures[:5]
    for server in servers:
        assert server.alive(), server.log()
        assert "testing" not in server.log()  # the secret key (moto takes any)
    print(f"the edit on all three replicas {reached:.1f} s after it was written; "
          f"{dict(load.outcomes)}")  # fmt: skip
