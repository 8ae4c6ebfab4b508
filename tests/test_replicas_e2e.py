"""A rolling restart behind a real load balancer loses nothing (issue 41).

Two replicas of a fast Python model (``servekit serve`` processes on loopback ports) behind
HAProxy (Debian's package), which checks ``/v2/health/ready`` every 200 ms, redispatches and
retries on connection failures, empty responses and timeouts, as an ingress in front of
replicas does. Eight clients send inference requests through HAProxy while each replica in turn
gets SIGTERM, exits, and is started again on its port; not one request may fail. On SIGTERM a
replica turns unready but keeps serving for ``server.drainDelaySeconds`` (HAProxy's next checks
take it out of rotation meanwhile), then drains. Refusing at once, as ``drainDelaySeconds: 0``
does, failed about 1% of the requests here: the ones HAProxy sent before its next check.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from haproxy import statuses
from servers import ServerProcess, start_server
from waits import wait_until

pytestmark = pytest.mark.slow  # end to end: server processes and HAProxy

MODEL = """\
def echo(x):
    return x
"""
CLIENTS = 8
WAIT = 60.0
DELAY = 2.0
"""``server.drainDelaySeconds`` of the replicas: HAProxy's checks (every 200 ms, down after
two failures) see the replica unready well within it."""
BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}]}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _haproxy_config(folder: Path, port: int, replicas: list[int]) -> str:
    servers = "\n".join(
        f"    server r{i} 127.0.0.1:{p} check inter 200ms fall 2 rise 1"
        for i, p in enumerate(replicas)
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

frontend front
    bind 127.0.0.1:{port}
    default_backend replicas

backend replicas
    balance roundrobin
    option httpchk GET /v2/health/ready
    http-check expect status 200
{servers}
"""


def _status(folder: Path) -> dict[str, str]:
    """Each replica's status as HAProxy sees it (UP, DOWN, ...)."""
    return {server: state for (backend, server), state in statuses(folder).items()
            if backend == "replicas"}  # fmt: skip


def _all_up(folder: Path) -> bool:
    return (folder / "admin.sock").exists() and set(_status(folder).values()) == {"UP"}


@pytest.fixture(params=[1, 2], ids=["one process", "workers 2"])
def workers(request: pytest.FixtureRequest) -> list[str]:
    """The replicas' ``--workers`` flag: a replica of several workers withdraws as one."""
    return ["--workers", str(request.param)]


@pytest.fixture
def replicas(tmp_path: Path, workers: list[str]) -> Iterator[tuple[Path, list[ServerProcess]]]:
    (tmp_path / "replica_models.py").write_text(MODEL)
    config = tmp_path / "serve.yaml"
    config.write_text(
        f"server: {{drainDelaySeconds: {DELAY}}}\nmodels:\n"
        "  - name: echo\n    modelFormat: {name: python}\n"
        "    entrypoint: replica_models:echo\n"
        "    inputs: [{name: x, datatype: FP32, shape: [-1]}]\n"
        "    outputs: [{name: x, datatype: FP32, shape: [-1]}]\n"
    )
    started = [start_server(config, grpc=False, extra=workers) for _ in range(2)]
    yield config, started
    for server in started:
        server.stop(signal.SIGKILL)


def test_rolling_restart_behind_haproxy_fails_no_request(
    tmp_path: Path,
    haproxy_bin: str,
    replicas: tuple[Path, list[ServerProcess]],
    workers: list[str],
) -> None:
    config, servers = replicas
    ports = [int(s.http_url.rsplit(":", 1)[1]) for s in servers]
    front = _free_port()
    (tmp_path / "haproxy.cfg").write_text(_haproxy_config(tmp_path, front, ports))
    with (tmp_path / "haproxy.log").open("w") as log:
        proxy = subprocess.Popen(
            [haproxy_bin, "-db", "-f", str(tmp_path / "haproxy.cfg")],
            stdout=subprocess.DEVNULL,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
    outcomes: Counter[str] = Counter()
    failures: list[str] = []
    lock = threading.Lock()
    done = threading.Event()

    def client() -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{front}", timeout=20) as http:
            while not done.is_set():
                try:
                    answer = http.post("/v2/models/echo/infer", json=BODY)
                    ok = answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [
                        1.0,
                        2.0,
                    ]
                    what = "ok" if ok else f"{answer.status_code} {answer.text[:120]}"
                except httpx.HTTPError as exc:
                    what = f"{type(exc).__name__}: {exc}"
                with lock:
                    outcomes["ok" if what == "ok" else "failed"] += 1
                    if what != "ok":
                        failures.append(what)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
    try:
        wait_until(lambda: _all_up(tmp_path), WAIT, "HAProxy to see both replicas UP")
        for thread in threads:
            thread.start()
        wait_until(lambda: outcomes["ok"] >= 200, WAIT, "load through HAProxy")
        for i in range(len(servers)):
            name = f"r{i}"
            servers[i].process.send_signal(signal.SIGTERM)
            wait_until(lambda: _status(tmp_path)[name] != "UP", WAIT, f"HAProxy to drop {name}")  # noqa: B023
            assert servers[i].alive()  # unready, still serving: HAProxy left it first
            assert servers[i].process.wait(WAIT) == 0, servers[i].log()
            servers[i].stop()  # exited: collects its output
            before = outcomes["ok"]
            servers[i] = start_server(
                config, grpc=False, extra=[*workers, "--http-port", str(ports[i])], timeout=WAIT
            )
            wait_until(lambda: _status(tmp_path)[name] == "UP", WAIT, f"{name} back UP")  # noqa: B023
            wait_until(lambda: outcomes["ok"] >= before + 200, WAIT, "load after it")  # noqa: B023
    finally:
        done.set()
        for thread in threads:
            thread.join(WAIT)
        proxy.terminate()
        proxy.wait(10)
    assert not failures, f"{len(failures)} of {sum(outcomes.values())} failed: {failures[:5]}"
    assert outcomes["ok"] >= 1000, outcomes
    print(f"{outcomes['ok']} requests through HAProxy, none failed")
