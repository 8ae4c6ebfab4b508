"""A pipeline against the client calling its three models, and against one Python model.

    python bench/pipeline.py [--duration 5] [--write docs/performance.md]

The data scientist's model of issue 29: featurise (Python) -> an ONNX MLP -> post-process
(Python), served as the models of tests/pipeline_models.py by one ``servekit serve`` pinned to
CPU 0, and driven over REST JSON at 1 and 16 requests in flight from CPU 1 four ways:

- **three client calls**: the client posts to featurise, reads its JSON, posts the features to
  the MLP, then the scores to post-process (what users do without pipelines);
- **pipeline**: one request to ``classify``, whose steps run in the server;
- **model calls**: one request to ``calling``, a Python model calling the three models with
  ``servekit.models.infer``;
- **one Python model**: one request to ``combined``, which featurises, runs its own
  onnxruntime session and post-processes in one ``predict``.

One client for all four (threads over keep-alive ``http.client`` connections, one row of 8
floats per request), so the client's own cost per request is the same, and the three client
calls pay their three round trips. Every answer is checked against the pipeline's first one.
Figures are answers (full classifications) per second, the median latency of one answer, and
the server's CPU time per answer (user + system of its process: what one answer costs the
server, which waiting for a busy CPU does not inflate, so it compares ways on a shared machine).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))

from pipeline_models import rows, write_project  # noqa: E402
from procs import Server, load_average  # noqa: E402
from report import machine, write_section  # noqa: E402

SERVER_CPU, CLIENT_CPU = "0", "1"
START, END = "<!-- pipeline:start -->", "<!-- pipeline:end -->"
RAW = rows(1, seed=11)


def body(name: str, data: Any, shape: list[int]) -> bytes:
    tensor = {"name": name, "datatype": "FP32", "shape": shape, "data": data}
    return json.dumps({"inputs": [tensor]}).encode()


Call = Callable[[http.client.HTTPConnection], Any]


def post(conn: http.client.HTTPConnection, model: str, payload: bytes) -> dict[str, Any]:
    conn.request("POST", f"/v2/models/{model}/infer", payload, {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"{model}: {response.status} {data[:200]!r}")
    answer: dict[str, Any] = json.loads(data)
    return answer


def outputs(answer: dict[str, Any]) -> dict[str, Any]:
    return {o["name"].lower(): o["data"] for o in answer["outputs"]}


def three_calls(conn: http.client.HTTPConnection) -> Any:
    raw = body("raw", RAW.ravel().tolist(), [1, 8])
    features = outputs(post(conn, "featurise", raw))["features"]
    scores = outputs(post(conn, "mlp", body("input", features, [1, 16])))["output"]
    return outputs(post(conn, "postprocess", body("scores", scores, [1, 4])))


def one_request(model: str, name: str) -> Call:
    payload = body(name, RAW.ravel().tolist(), [1, 8])
    return lambda conn: outputs(post(conn, model, payload))


WAYS: dict[str, Call] = {
    "three client calls": three_calls,
    "pipeline": one_request("classify", "RAW"),
    "model calls": one_request("calling", "raw"),
    "one Python model": one_request("combined", "raw"),
}


def drive(server: Server, call: Call, in_flight: int, seconds: float) -> dict[str, float]:
    """``in_flight`` threads calling in a loop for ``seconds``: answers/s, p50 latency, and the
    server's CPU time per answer (user + system, which waits for the CPU do not inflate: on a
    shared machine the one figure that load moves little)."""
    port = server.port
    latencies: list[list[float]] = [[] for _ in range(in_flight)]
    errors: list[BaseException] = []
    start = threading.Barrier(in_flight + 1)
    stop_at = [0.0]

    def worker(index: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            call(conn)  # warm the connection
            start.wait()
            while (now := time.perf_counter()) < stop_at[0]:
                call(conn)
                latencies[index].append(time.perf_counter() - now)
        except BaseException as exc:  # reported after the run
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(in_flight)]
    for thread in threads:
        thread.start()
    stop_at[0] = time.perf_counter() + seconds + 0.5
    start.wait()
    began = time.perf_counter()
    cpu_before = server.cpu_seconds()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    cpu = server.cpu_seconds() - cpu_before
    if errors:
        raise SystemExit(f"failed: {errors[0]!r}")
    flat = [x for part in latencies for x in part]
    return {
        "rps": len(flat) / elapsed,
        "p50_ms": statistics.median(flat) * 1e3,
        "cpu_us": cpu / max(1, len(flat)) * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--write", type=Path, help="write the table into this markdown file")
    args = parser.parse_args()
    os.sched_setaffinity(0, {int(CLIENT_CPU)})
    before = load_average()
    with tempfile.TemporaryDirectory() as folder:
        config = write_project(Path(folder))
        argv = [sys.executable, "-m", "servekit", "serve", str(config), "--http-port", "0",
                "--grpc-port", "0", "--host", "127.0.0.1", "--log-level", "warning"]  # fmt: skip
        os.environ["PYTHONPATH"] = str(ROOT / "app")  # this checkout's servekit
        server = Server(argv, SERVER_CPU, r"listening http://127\.0\.0\.1:(\d+)", cwd=ROOT)
        try:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            wait_ready(conn)
            reference = WAYS["pipeline"](conn)
            for name, call in WAYS.items():
                got = call(conn)
                if got["label"] != reference["label"]:
                    raise SystemExit(f"{name} answers {got}, the pipeline {reference}")
            conn.close()
            results = {
                (name, c): drive(server, call, c, args.duration)
                for c in (1, 16)
                for name, call in WAYS.items()
            }
        finally:
            server.stop()
    section = render(results, before, load_average(), args.duration)
    print(section)
    if args.write:
        write_section(args.write, section, START, END)


def wait_ready(conn: http.client.HTTPConnection, timeout: float = 120.0) -> None:
    """Until every model has loaded (the server listens before its models are ready)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conn.request("GET", "/v2/health/ready")
        response = conn.getresponse()
        response.read()
        if response.status == 200:
            return
        time.sleep(0.2)
    raise SystemExit("the server did not become ready")


def render(
    results: dict[tuple[str, int], dict[str, float]], before: str, after: str, seconds: float
) -> str:
    lines = [
        START,
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}; load average {before} before, "
        f"{after} after.",
        f"`python bench/pipeline.py --duration {seconds:g}`",
        "",
        "| way | in flight | answers/s | p50 | x three client calls | server CPU / answer "
        "| CPU x one Python model |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in (1, 16):
        base = results[("three client calls", c)]["rps"]
        single = results[("one Python model", c)]["cpu_us"]
        for name in WAYS:
            cell = results[(name, c)]
            lines.append(
                f"| {name} | {c} | {cell['rps']:,.0f} | {cell['p50_ms']:.2f} ms | "
                f"{cell['rps'] / base:.2f} | {cell['cpu_us']:,.0f} us | "
                f"{cell['cpu_us'] / single:.2f} |"
            )
    lines += ["", END]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
