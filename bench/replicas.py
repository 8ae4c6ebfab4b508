"""1, 2 and 3 replicas behind HAProxy on this machine: requests/s and p99, and HAProxy's own cost.

    python bench/replicas.py [--duration 10] [--connections 16] [--replicas 1 2 3]

Each replica is a ``servekit serve`` process (one worker) serving the tiny 16 -> 64 -> 4 MLP of
bench/workload.py over REST JSON, pinned to a core (replica i on core i mod the core count);
HAProxy (Debian's package, one thread, the health checks of tests/test_replicas_e2e.py) shares
the last core, and wrk the client core of bench/run.py. First one replica is measured without
HAProxy (the baseline), then behind it with 1, 2 and 3 replicas: the difference between the
first two is what the extra hop costs; the others show what more replicas bring on a machine
whose cores they share. Every run must finish without a failed request. The figures in
docs/performance.md come from this script; on a shared machine only the ratios within one run
mean anything.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))  # onnx_builders

import procs  # noqa: E402
import run as rest  # noqa: E402
from onnx_builders import mlp  # noqa: E402
from procs import Server  # noqa: E402

SERVE_YAML = """\
server: {name: bench-replicas}
models:
  - {name: mlp, modelFormat: {name: onnx}, storageUri: mlp.onnx}
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _haproxy_config(port: int, replicas: list[int]) -> str:
    servers = "\n".join(
        f"    server r{i} 127.0.0.1:{p} check inter 200ms fall 2 rise 1"
        for i, p in enumerate(replicas)
    )
    return f"""\
global
    maxconn 512
    nbthread 1

defaults
    mode http
    timeout connect 1s
    timeout client 30s
    timeout server 10s
    option http-keep-alive

frontend front
    bind 127.0.0.1:{port}
    default_backend replicas

backend replicas
    balance roundrobin
    option httpchk GET /v2/health/ready
    http-check expect status 200
{servers}
"""


def _ready(url: str, path: str = "/v2/health/ready", timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} not ready within {timeout} s")


def _round(url: str, body: Path, args: argparse.Namespace) -> dict[str, Any]:
    rest.run_wrk(url, body, None, args.connections, 2)  # warm-up, not counted
    result = rest.run_wrk(url, body, None, args.connections, args.duration)
    errors = sum(result["errors"].values())
    if errors:
        raise SystemExit(f"{errors} failed requests: {result['errors']}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 3])
    args = parser.parse_args()
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(haproxy).exists() or shutil.which("wrk") is None:
        raise SystemExit("needs haproxy and wrk (apt-get install haproxy wrk)")
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} cores, load average {procs.load_average()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        onnx.save(mlp(16, 64, 4), folder / "mlp.onnx")
        (folder / "serve.yaml").write_text(SERVE_YAML)
        data = np.random.default_rng(1).standard_normal(16).astype(np.float32).tolist()
        body = folder / "tiny.json"
        body.write_text(
            '{"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": '
            + str(data)
            + "}]}"
        )
        replicas: list[Server] = []
        rows: list[tuple[str, dict[str, Any]]] = []
        try:
            for i in range(max(args.replicas)):
                argv = [sys.executable, "-m", "servekit", "serve", str(folder / "serve.yaml"),
                        "--http-port", "0", "--no-grpc", "--host", "127.0.0.1",
                        "--log-level", "warning"]  # fmt: skip
                listening = r"listening http://127\.0\.0\.1:(\d+)"
                replicas.append(Server(argv, str(i % cores), listening, cwd=folder))
            for server in replicas:
                _ready(f"http://127.0.0.1:{server.port}")
            direct = f"http://127.0.0.1:{replicas[0].port}/v2/models/mlp/infer"
            rows.append(("1 replica, no HAProxy", _round(direct, body, args)))
            for count in args.replicas:
                front = _free_port()
                config = folder / f"haproxy-{count}.cfg"
                config.write_text(_haproxy_config(front, [s.port for s in replicas[:count]]))
                proxy = subprocess.Popen(
                    ["taskset", "-c", str(cores - 1), haproxy, "-db", "-f", str(config)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                try:
                    url = f"http://127.0.0.1:{front}"
                    _ready(url, "/v2/health/ready")
                    time.sleep(1.0)  # every backend's first check has passed (200 ms apart)
                    rows.append((f"{count} behind HAProxy",
                                 _round(f"{url}/v2/models/mlp/infer", body, args)))  # fmt: skip
                finally:
                    proxy.terminate()
                    proxy.wait(10)
        finally:
            for server in replicas:
                server.stop()
    print(f"\n| replicas | requests/s | p50 ms | p99 ms |  ({args.connections} connections, "
          f"{args.duration:.0f} s each, load average {procs.load_average()})")  # fmt: skip
    print("|---|---|---|---|")
    for name, result in rows:
        latency = result["latency_us"]
        print(f"| {name} | {result['rps']:.0f} | {latency['p50'] / 1000:.2f} | "
              f"{latency['p99'] / 1000:.2f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
