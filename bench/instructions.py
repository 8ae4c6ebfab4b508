"""Instructions per request, counted by valgrind: a regression check that noise cannot move.

    git worktree add ../base 664e9ed
    python bench/instructions.py base=../base main=. [--body "REST JSON"|"REST binary"|gRPC]
        [--requests 2000]

This machine is shared and its speed varies from minute to minute, so timed A/B runs
(bench/ab.py) need many rounds to see a 5% change. Counting instructions does not: each
checkout's ``servekit serve`` runs under ``valgrind --tool=callgrind`` with counting off; after
a warm-up the counter is switched on (``callgrind_control -i on``), one client sends
``--requests`` requests on one keep-alive connection, the counter is dumped, and the total is
divided by the request count. Repeated runs agree within about 1%; the figure is work done
(instructions), not time (it does not see cache misses or lock waits), so confirm a found
difference with bench/ab.py.
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # onnx_builders

from run import wait_ready  # noqa: E402
from workload import make_workload  # noqa: E402

LISTENING = re.compile(r"listening http://127\.0\.0\.1:(\d+)")


GRPC = b"gRPC"
"""The body value that selects gRPC ModelInfer calls instead of an HTTP body."""


def count(tree: Path, config: Path, body: bytes, header_length: int | None, requests: int,
          out_dir: Path, name: str) -> float:  # fmt: skip
    """Instructions per request of one checkout's server (started here, stopped here)."""
    # Since the move to app/servekit/, the source root is app/ (no symlink at the top).
    root = tree / "app" if (tree / "app" / "servekit").is_dir() else tree
    env = dict(os.environ, PYTHONPATH=str(root.resolve()), PYTHONMALLOC="malloc")
    out_file = out_dir / f"callgrind.{name}.out"
    prefix = f"--vgdb-prefix={out_dir / name}-vgdb"
    # A checkout from before the package was called servekit (issue 16) serves as `app`.
    package = "servekit" if (root / "servekit").exists() else "app"
    argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--vgdb=yes", prefix,
            f"--callgrind-out-file={out_file}", sys.executable, "-m", package, "serve",
            str(config), "--http-port", "0", "--host", "127.0.0.1",
            "--log-level", "warning"]  # fmt: skip
    argv += ["--grpc-port", "0"] if body == GRPC else ["--no-grpc"]
    log_path = out_dir / f"{name}.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(argv, cwd=tree, env=env, stderr=log_file, stdout=log_file)
    try:
        port = _wait_port(proc, log_path)
        wait_ready(f"http://127.0.0.1:{port}/v2/models/mlp/ready", timeout=300)
        send = _grpc_sender(log_path) if body == GRPC else _http_sender(port, body, header_length)
        send(200)  # warm-up: first calls, caches, lazy imports
        _control(prefix, proc.pid, "on")
        send(requests)
        _control(prefix, proc.pid, "off")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    total = 0
    for dump in out_dir.glob(f"callgrind.{name}.out*"):
        for line in dump.read_text(errors="replace").splitlines():
            if line.startswith("summary:") or line.startswith("totals:"):
                total = max(total, int(line.split()[1]))
    return total / requests


def _control(prefix: str, pid: int, state: str) -> None:
    """Switch the server's instruction counting on or off (vgdb reaches it while it waits)."""
    done = subprocess.run(["callgrind_control", prefix, "-i", state, str(pid)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    if done.returncode != 0 or "OK" not in done.stdout:
        raise RuntimeError(f"callgrind_control failed: {done.stdout}{done.stderr}")


def _http_sender(port: int, body: bytes, header_length: int | None) -> Callable[[int], None]:
    """Sends ``n`` requests in turn on one keep-alive connection."""
    headers = {"Content-Type": "application/json"}
    if header_length is not None:
        headers = {"Content-Type": "application/octet-stream",
                   "Inference-Header-Content-Length": str(header_length)}  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def send(n: int) -> None:
        for _ in range(n):
            conn.request("POST", "/v2/models/mlp/infer", body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"server answered {response.status}")

    return send


def _grpc_sender(log_path: Path) -> Callable[[int], None]:
    """Sends ``n`` ModelInfer calls in turn on one channel (tritonclient.grpc, raw contents)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    match = re.search(r"grpc://127\.0\.0\.1:(\d+)", log_path.read_text())
    if match is None:
        raise RuntimeError("the server printed no gRPC address")
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{match.group(1)}")
    x = np.random.default_rng(1).standard_normal((1, 16)).astype(np.float32)
    infer_input = grpcclient.InferInput("input", list(x.shape), "FP32")
    infer_input.set_data_from_numpy(x)

    def send(n: int) -> None:
        for _ in range(n):
            client.infer("mlp", [infer_input])

    return send


def _wait_port(proc: subprocess.Popen[bytes], log_path: Path) -> int:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        match = LISTENING.search(log_path.read_text(errors="replace"))
        if match:
            return int(match.group(1))
        if proc.poll() is not None:
            raise RuntimeError(f"server exited before listening: {log_path.read_text()[-2000:]}")
        time.sleep(0.2)
    raise RuntimeError("server did not listen within 300 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", help="NAME=PATH of a servekit checkout")
    parser.add_argument("--body", default="REST JSON", help="REST JSON, REST binary, gRPC, ...")
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    trees = dict(item.split("=", 1) for item in args.trees)
    with tempfile.TemporaryDirectory(prefix="servekit-instr-") as tmp:
        workload = make_workload(Path(tmp))
        if args.body == "gRPC":
            body, header_length = GRPC, None
        else:
            body_path, header_length = workload.bodies[args.body]
            body = body_path.read_bytes()
        results = {}
        for name, tree in trees.items():
            results[name] = count(Path(tree), workload.config, body, header_length,
                                  args.requests, Path(tmp), name)  # fmt: skip
            print(f"{name:>10}  {results[name]:>12,.0f} instructions/request", flush=True)
        first = next(iter(results.values()))
        for name, value in results.items():
            print(f"{name:>10}  {value / first:.3f} x {next(iter(results))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
