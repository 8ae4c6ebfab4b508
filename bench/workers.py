"""1 worker against 2 (``servekit serve --workers N``): requests/s and server CPU per request.

    python bench/workers.py [--duration 10] [--workers 1 2] [--connections 16]
    python bench/workers.py --requests 20000 [--connections 4]   # CPU per request only

Each worker count gets its own server, unpinned (the workers may use every core), with the load
generator sharing the cores, as on a real machine: wrk for tiny REST JSON (the 16 -> 64 -> 4
MLP of bench/workload.py) and medium REST binary (a 16384 -> 64 -> 4 MLP: 64 KiB of FP32 per
request, binary tensor data extension), h2load for gRPC (raw contents, the tiny MLP). The
server's CPU time counts the supervisor and every worker. Before and after each run the
server's own statistics (totalled across workers) are read: they must count at least every
request the load generator saw succeed, and no failure. The figures for docs/performance.md
come from a quiet machine; on a shared one only the ratio within one run means anything.

``--requests N`` sends exactly N requests per workload instead (h2load, HTTP/1.1 for REST,
after 500 uncounted ones) and reports the server's CPU per request over them: the figure that
shows a cost one worker pays for the others (a lock, a pipe write, statistics shipped per
request), with the contention of a saturated machine left out as far as the load allows.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))  # onnx_builders

import grpc_load  # noqa: E402
import procs  # noqa: E402
import run as rest  # noqa: E402
from onnx_builders import mlp  # noqa: E402
from procs import Server  # noqa: E402

MEDIUM_INPUTS = 16384
SERVE_YAML = """\
server: {name: bench-workers}
models:
  - {name: mlp, modelFormat: {name: onnx}, storageUri: mlp.onnx}
  - {name: medium, modelFormat: {name: onnx}, storageUri: medium.onnx}
"""
GRPC_TARGET = re.compile(r"grpc://(\S+)")


def write_workload(folder: Path) -> dict[str, tuple[str, Path, int | None]]:
    """serve.yaml, the models and the bodies: name -> (model, body file, header length)."""
    onnx.save(mlp(16, 64, 4), folder / "mlp.onnx")
    onnx.save(mlp(MEDIUM_INPUTS, 64, 4), folder / "medium.onnx")
    (folder / "serve.yaml").write_text(SERVE_YAML)
    rng = np.random.default_rng(1)
    tiny = rng.standard_normal((1, 16)).astype(np.float32)
    tiny_json = {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32",
                             "data": tiny.reshape(-1).tolist()}]}  # fmt: skip
    (folder / "tiny.json").write_text(json.dumps(tiny_json))
    medium = rng.standard_normal((1, MEDIUM_INPUTS)).astype(np.float32)
    header = json.dumps(
        {
            "inputs": [{"name": "input", "shape": [1, MEDIUM_INPUTS], "datatype": "FP32",
                        "parameters": {"binary_data_size": medium.nbytes}}],
            "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
        }
    ).encode()  # fmt: skip
    (folder / "medium.body").write_bytes(header + medium.tobytes())
    (folder / "grpc.bin").write_bytes(grpc_load.frame(grpc_load.request("raw")))
    return {
        "tiny REST JSON": ("mlp", folder / "tiny.json", None),
        "medium REST binary": ("medium", folder / "medium.body", len(header)),
        "tiny gRPC": ("mlp", folder / "grpc.bin", None),
    }


def counts(http_url: str, model: str) -> tuple[int, int]:
    stats = httpx.get(f"{http_url}/v2/models/{model}/stats", timeout=30).json()["model_stats"]
    inference = stats[0]["inference_stats"]
    return int(inference["success"]["count"]), int(inference["fail"]["count"])


def h2load_count(
    url: str, body: Path, headers: list[str], requests: int, connections: int, cpus: str
) -> int:
    """Send exactly ``requests`` requests with h2load; the number that succeeded."""
    grpc_call = not headers
    extra = ["-H", "content-type: application/grpc", "-H", "te: trailers"] if grpc_call else []
    for header in headers:
        extra += ["-H", header]
    argv = ["taskset", "-c", cpus, "h2load", "-n", str(requests), "-c", str(connections),
            "-m", "1", "-d", str(body), *([] if grpc_call else ["--h1"]), *extra, url]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    done = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed",
                     text)  # fmt: skip
    if done is None or int(done[2]) or "status codes: " not in text:
        raise SystemExit(f"h2load failed:\n{text}")
    if not grpc_call and not re.search(r"status codes: (\d+) 2xx, 0 3xx, 0 4xx, 0 5xx", text):
        raise SystemExit(f"h2load: answers other than 2xx:\n{text}")
    return int(done[1])


def measure_count(
    server: Server, http_url: str, grpc_target: str, workload: str,
    spec: tuple[str, Path, int | None], args: argparse.Namespace, cpus: str,
) -> dict[str, Any]:  # fmt: skip
    """Server CPU per request over exactly ``args.requests`` requests."""
    model, body, header_length = spec
    if workload.endswith("gRPC"):
        url, headers = f"http://{grpc_target}{grpc_load.SERVICE}/ModelInfer", []
    else:
        url = f"{http_url}/v2/models/{model}/infer"
        headers = ["content-type: application/json"]
        if header_length is not None:
            headers = ["content-type: application/octet-stream",
                       f"inference-header-content-length: {header_length}"]  # fmt: skip
    h2load_count(url, body, headers, 500, args.connections, cpus)  # warm-up, not counted
    ok_before, fail_before = counts(http_url, model)
    cpu_before, top_before = server.cpu_seconds(), procs.cpu_seconds_of(server.proc.pid)
    succeeded = h2load_count(url, body, headers, args.requests, args.connections, cpus)
    cpu = server.cpu_seconds() - cpu_before
    top = procs.cpu_seconds_of(server.proc.pid) - top_before
    ok_after, fail_after = counts(http_url, model)
    served = ok_after - ok_before
    if fail_after != fail_before or served < succeeded:
        raise SystemExit(f"{workload}: failures or uncounted requests")
    return {"rps": 0.0, "cpu_us_per_request": cpu * 1e6 / max(1, served), "served": served,
            "top_us_per_request": top * 1e6 / max(1, served)}  # fmt: skip


def measure(
    server: Server, http_url: str, grpc_target: str, workload: str,
    spec: tuple[str, Path, int | None], args: argparse.Namespace, cpus: str,
) -> dict[str, Any]:  # fmt: skip
    model, body, header_length = spec
    ok_before, fail_before = counts(http_url, model)
    cpu_before = server.cpu_seconds()
    if workload.endswith("gRPC"):
        url = f"http://{grpc_target}{grpc_load.SERVICE}/ModelInfer"
        out = grpc_load.h2load(url, body, args.connections, args.connections, args.duration,
                               cpus)  # type: ignore[arg-type]  # fmt: skip
        succeeded, failed, rps = int(out["succeeded"]), int(out["failed"]), float(out["rps"])
    else:
        url = f"{http_url}/v2/models/{model}/infer"
        out = rest.run_wrk(url, body, header_length, args.connections, args.duration)
        failed = sum(out["errors"].values())
        succeeded, rps = int(out["requests"]) - failed, float(out["rps"])
    cpu = server.cpu_seconds() - cpu_before
    ok_after, fail_after = counts(http_url, model)
    served = ok_after - ok_before
    if failed or fail_after != fail_before or served < succeeded:
        raise SystemExit(f"{workload}: failures or uncounted requests: {out}")
    return {"rps": rps, "cpu_us_per_request": cpu * 1e6 / max(1, served), "served": served}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--requests", type=int, help="exactly N requests per workload (CPU only)")
    parser.add_argument("--only", nargs="+", help="workloads to run (default: all)")
    args = parser.parse_args(argv)
    cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    rest.CLIENT_CPU = cpus  # the load generator shares every core with the server
    results: dict[int, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="servekit-workers-bench-") as tmp:
        folder = Path(tmp)
        workloads = write_workload(folder)
        for workers in args.workers:
            argv_ = [sys.executable, "-m", "servekit", "serve", str(folder / "serve.yaml"),
                     "--http-port", "0", "--grpc-port", "0", "--host", "127.0.0.1",
                     "--workers", str(workers), "--log-level", "warning"]  # fmt: skip
            server = Server(argv_, cpus, r"listening http://127\.0\.0\.1:(\d+)", cwd=ROOT)
            try:
                http_url = f"http://127.0.0.1:{server.port}"
                target = GRPC_TARGET.search("".join(server.output))
                assert target is not None, server.output
                rest.wait_ready(f"{http_url}/v2/health/ready")
                results[workers] = {}
                for name, spec in workloads.items():
                    if args.only and name not in args.only:
                        continue
                    how = measure_count if args.requests else measure
                    cell = how(server, http_url, target[1], name, spec, args, cpus)
                    results[workers][name] = cell
                    rate = f"{cell['rps']:10,.0f} req/s" if not args.requests else ""
                    top = cell.get("top_us_per_request")
                    # the supervisor's part (with one worker, the server itself: all of it)
                    part = f" (top process {top:.1f})" if top is not None and workers > 1 else ""
                    cpu = cell["cpu_us_per_request"]
                    print(f"workers={workers} {name:20} {rate} server CPU {cpu:7.1f} us/req{part}",
                          flush=True)  # fmt: skip
            finally:
                server.stop()
    if 1 in results and len(results) > 1:
        for workers in sorted(w for w in results if w != 1):
            for name in results[1]:
                if args.requests:
                    cpu = [results[w][name]["cpu_us_per_request"] for w in (workers, 1)]
                    print(f"{workers} workers / 1 worker, {name}: {cpu[0] / cpu[1]:.3f}x CPU "
                          "per request")  # fmt: skip
                    continue
                ratio = results[workers][name]["rps"] / max(1e-9, results[1][name]["rps"])
                print(f"{workers} workers / 1 worker, {name}: {ratio:.2f}x requests/s")
    print("BENCH_RESULT " + json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
