"""REST inference benchmark: servekit vs raw onnxruntime vs a do-nothing ASGI app, same run.

    python bench/run.py [--duration 5] [--repeat 2] [--write docs/performance.md]

What it does (2 cores: the server side on CPU 0, the load generator on CPU 1):

1. builds the tiny MLP (16 -> 64 -> 4, ``onnx_builders.mlp``) and a serve.yaml for it in a
   temporary directory;
2. measures raw onnxruntime (``bench/raw_ort.py``: ``session.run``, batch 1, pinned to CPU 0);
3. starts ``servekit serve`` pinned to CPU 0 and checks every request body once against the
   raw onnxruntime output;
4. drives it with ``wrk`` (``bench/wrk/post.lua``, pinned to CPU 1) over REST JSON, REST binary
   (Triton's binary tensor extension, ``Inference-Header-Content-Length``) and the raw binary
   request, at 1 and 16 connections, for a fixed duration each;
5. drives a do-nothing ASGI app (``bench/noop_asgi.py``) the same way as the ceiling, on uvicorn
   the way servekit embeds it, then inside a Litestar app routed like servekit's inference (the
   framework's floor), then on granian / hypercorn when they are importable;
6. repeats steps 2-5 ``--repeat`` times, interleaved, and reports medians; writes the table to
   ``docs/performance.md`` between the ``bench:start`` / ``bench:end`` markers.

Requests/s and latencies are wall-clock and suffer when the machine is busy (read the load
average in the report); the server's CPU microseconds per request are steadier. Compare rows of
one run with each other, not absolute numbers across runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))  # onnx_builders (tests/onnx_builders.py)

from procs import Server, load_average  # noqa: E402
from report import render, write_section  # noqa: E402
from workload import Workload, check_bodies, make_workload  # noqa: E402

SERVER_CPU, CLIENT_CPU = "0", "1"
NOOP_LABELS = {
    "uvicorn": "do-nothing ASGI (uvicorn)",
    "litestar": "do-nothing Litestar route (uvicorn)",
    "granian": "do-nothing ASGI (granian)",
    "hypercorn": "do-nothing ASGI (hypercorn)",
}


def run_wrk(
    url: str,
    body: Path,
    header_length: int | None,
    connections: int,
    seconds: float,
    authorization: str | None = None,
) -> dict[str, Any]:
    """One fixed-duration wrk run; returns the Lua script's BENCH_RESULT object."""
    env = dict(os.environ, BENCH_BODY=str(body), BENCH_AUTHORIZATION=authorization or "")
    env["BENCH_CONTENT_TYPE"] = (
        "application/json" if header_length is None else "application/octet-stream"
    )
    if header_length is not None:
        env["BENCH_HEADER_LENGTH"] = str(header_length)
    argv = [
        "taskset",
        "-c",
        CLIENT_CPU,
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
    ]
    argv += ["--timeout", "5s", "-s", str(HERE / "wrk" / "post.lua"), url]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=seconds + 60)
    for line in done.stdout.splitlines():
        if line.startswith("BENCH_RESULT "):
            result: dict[str, Any] = json.loads(line.removeprefix("BENCH_RESULT "))
            result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
            return result
    raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


def measure(
    server: Server,
    url: str,
    body: Path,
    header_length: int | None,
    connections: int,
    seconds: float,
    authorization: str | None = None,
) -> dict[str, Any]:
    """wrk against ``server`` plus the server's CPU time spent meanwhile."""
    cpu_before = server.cpu_seconds()
    result = run_wrk(url, body, header_length, connections, seconds, authorization)
    cpu = server.cpu_seconds() - cpu_before
    result["cpu_us_per_request"] = cpu * 1e6 / result["requests"] if result["requests"] else None
    errors = sum(result["errors"].values())
    if errors:
        print(f"    warning: {errors} errors {result['errors']}", flush=True)
    return result


def raw_ort(workload: Workload, seconds: float) -> dict[str, Any]:
    argv = ["taskset", "-c", SERVER_CPU, sys.executable, str(HERE / "raw_ort.py")]
    argv += [str(workload.config), str(workload.input_npy), "--duration", str(seconds)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"raw onnxruntime run failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def start_servekit(workload: Workload) -> Server:
    argv = [sys.executable, "-m", "servekit", "serve", str(workload.config), "--http-port", "0"]
    argv += ["--no-grpc", "--host", "127.0.0.1", "--log-level", "warning"]
    return Server(argv, SERVER_CPU, r"listening http://127\.0\.0\.1:(\d+)", cwd=ROOT)


def start_noop(kind: str) -> Server:
    argv = [sys.executable, str(HERE / "noop_asgi.py"), "--server", kind]
    return Server(argv, SERVER_CPU, r"listening (\d+)")


def wait_ready(url: str, timeout: float = 60.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of every configuration")
    parser.add_argument("--connections", default="1,16")
    parser.add_argument("--write", type=Path, help="markdown file to update (docs/performance.md)")
    parser.add_argument(
        "--others",
        default="granian,hypercorn",
        help="other ASGI servers for the noop ceiling, if installed",
    )
    args = parser.parse_args()
    for tool in ("wrk", "taskset"):
        if shutil.which(tool) is None:
            print(
                f"bench: {tool} is not installed (apt-get install -y wrk util-linux)",
                file=sys.stderr,
            )
            return 2
    connections = [int(c) for c in args.connections.split(",")]
    others = [s for s in args.others.split(",") if s and importlib.util.find_spec(s) is not None]
    load_before = load_average()
    runs: list[dict[str, Any]] = []
    ort_runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="servekit-bench-") as tmp:
        workload = make_workload(Path(tmp))
        for round_no in range(1, args.repeat + 1):
            print(f"round {round_no}/{args.repeat} (load average {load_average()})", flush=True)
            ort = raw_ort(workload, min(args.duration, 3.0))
            ort_runs.append(ort)
            print(f"  raw onnxruntime: {ort['calls_per_s']:.0f} calls/s, ", end="")
            print(f"p50 {ort['latency_us']['p50']:.1f} us", flush=True)
            for run in servekit_round(workload, ort["output"], connections, args.duration):
                runs.append({"round": round_no, **run})
            for kind in ["uvicorn", "litestar", *others]:
                for run in noop_round(workload, kind, connections, args.duration):
                    runs.append({"round": round_no, **run})
    meta = {
        "command": "python bench/run.py " + " ".join(sys.argv[1:]),
        "load_before": load_before,
        "load_after": load_average(),
        "duration": args.duration,
        "repeat": args.repeat,
        "intra_op_threads": ort_runs[0].get("intra_op_threads"),
    }
    text = render(runs, ort_runs, meta)
    print(text)
    if args.write:
        write_section(args.write, text)
        print(f"bench: wrote {args.write}")
    return 0


def servekit_round(
    workload: Workload, expected: list[float], connections: list[int], seconds: float
) -> list[dict[str, Any]]:
    """Start servekit, check its answers, then every body at every concurrency."""
    runs: list[dict[str, Any]] = []
    server = start_servekit(workload)
    try:
        base = f"http://127.0.0.1:{server.port}"
        wait_ready(f"{base}/v2/health/ready")
        check_bodies(base, workload, expected)
        url = f"{base}/v2/models/mlp/infer"
        for name, (body, header_length) in workload.bodies.items():
            run_wrk(url, body, header_length, 16, 1.0)  # warm-up
            for c in connections:
                result = measure(server, url, body, header_length, c, seconds)
                runs.append({"target": name, "connections": c, **result})
                _print(runs[-1])
    finally:
        server.stop()
    return runs


def noop_round(
    workload: Workload, kind: str, connections: list[int], seconds: float
) -> list[dict[str, Any]]:
    """One do-nothing server, driven with the JSON body at every concurrency."""
    runs: list[dict[str, Any]] = []
    noop = start_noop(kind)
    try:
        url = f"http://127.0.0.1:{noop.port}/v2/models/mlp/infer"
        body, _ = workload.bodies["REST JSON"]
        wait_for_port(url)
        run_wrk(url, body, None, 16, 1.0)
        for c in connections:
            result = measure(noop, url, body, None, c, seconds)
            runs.append({"target": NOOP_LABELS[kind], "connections": c, **result})
            _print(runs[-1])
    finally:
        noop.stop()
    return runs


def wait_for_port(url: str, timeout: float = 30.0) -> None:
    """The noop servers answer any path; wait until one POST gets through."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=b"{}"), timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


def _print(run: dict[str, Any]) -> None:
    lat = run["latency_us"]
    cpu = run["cpu_us_per_request"]
    print(
        f"  {run['target']:32s} c={run['connections']:<3d} {run['rps']:9.0f} req/s  "
        f"p50 {lat['p50']:6d} us  p99 {lat['p99']:7d} us  cpu {cpu or 0:6.1f} us/req",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
