"""The OpenAI-compatible routes under load: embeddings with batching on and off, chat streams.

    python bench/openai.py [--duration 5] [--write docs/performance.md]

One ``servekit serve`` pinned to CPU 0 per configuration, driven from CPU 1 by threads over
keep-alive ``http.client`` connections posting OpenAI JSON, as an application's client does:

- **embeddings**: ``POST /openai/v1/embeddings`` with one text per request (a search query),
  at 1 and 32 connections, against the same model with ``dynamicBatching`` (maxBatchSize 64)
  and without it. The model is the example's bag-of-words embedder (examples/openai) followed
  by three dense layers (64 -> 2048 -> 2048 -> 384, 20 MB of FP32 weights), so that, as with a
  real transformer embedder, one call reads all the weights whatever its rows: a batch reads
  them once for all its requests.
- **chat streaming**: ``POST /openai/v1/chat/completions`` with ``stream: true`` to the
  example's character generator (``instances: 2``, 32 characters per answer), at 1 and 16
  connections: time to the first content chunk, and to the last.

Figures: requests (or streams) per second, the median latency, and the server's CPU time per
request (user + system, which waits for a busy CPU do not inflate).
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXAMPLE = ROOT / "examples" / "openai"
sys.path.insert(0, str(HERE))

from procs import Server, load_average  # noqa: E402
from report import machine, write_section  # noqa: E402

SERVER_CPU, CLIENT_CPU = "0", "1"
START, END = "<!-- openai:start -->", "<!-- openai:end -->"
WIDTHS = (2048, 2048, 384)
CONFIG = """
server: {{name: bench}}
models:
  - name: embedder
    modelFormat: {{name: onnx}}
    storageUri: ./models/embedder
    maxBatchSize: 64
{batching}
    openai: embedding
  - name: chargen-chat
    modelFormat: {{name: python}}
    entrypoint: "chargen:ChatModel"
    instances: 2
    openai: chat
    inputs:
      - {{name: messages, datatype: BYTES, shape: [1]}}
      - {{name: parameters, datatype: BYTES, shape: [1], optional: true}}
    outputs:
      - {{name: text_output, datatype: BYTES, shape: [-1]}}
"""


def heavy_embedder(folder: Path) -> Path:
    """The example's embedder with three dense layers after its bag of words."""
    spec = importlib.util.spec_from_file_location("build_embedder", EXAMPLE / "build_embedder.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model: onnx.ModelProto = module.build()
    graph = model.graph
    graph.node[-1].output[0] = "bag"
    rng = np.random.default_rng(7)
    previous, width_in = "bag", module.DIMENSIONS
    for index, width in enumerate(WIDTHS):
        weight = (rng.standard_normal((width_in, width)) / np.sqrt(width_in)).astype(np.float32)
        graph.initializer.append(numpy_helper.from_array(weight, f"w{index}"))
        out = f"h{index}"
        graph.node.append(helper.make_node("MatMul", [previous, f"w{index}"], [out]))
        if index < len(WIDTHS) - 1:
            graph.node.append(helper.make_node("Relu", [out], [f"r{index}"]))
            out = f"r{index}"
        previous, width_in = out, width
    graph.node.extend(
        [
            helper.make_node("Mul", [previous, previous], ["sq"]),
            helper.make_node("ReduceSum", ["sq", "axis_last"], ["n2"], keepdims=1),
            helper.make_node("Max", ["n2", "tiny"], ["n2safe"]),
            helper.make_node("Sqrt", ["n2safe"], ["n"]),
            helper.make_node("Div", [previous, "n"], ["embedding"]),
        ]
    )
    graph.output[0].type.tensor_type.shape.dim[1].dim_value = WIDTHS[-1]
    onnx.checker.check_model(model)
    path = folder / "models" / "embedder" / "1" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


Call = Callable[[http.client.HTTPConnection], float | None]
"""One request; returns the time to the first content chunk of a stream (None otherwise)."""


def post(conn: http.client.HTTPConnection, path: str, body: dict[str, Any]) -> bytes:
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"{path}: {response.status} {data[:200]!r}")
    return data


def embed(conn: http.client.HTTPConnection) -> None:
    body = {"model": "embedder", "input": "how does a quick brown fox find the river"}
    answer = json.loads(post(conn, "/openai/v1/embeddings", body))
    if len(answer["data"][0]["embedding"]) != WIDTHS[-1]:
        raise RuntimeError("wrong embedding size")
    return None


def chat_stream(conn: http.client.HTTPConnection) -> float:
    body = {
        "model": "chargen-chat",
        "messages": [{"role": "user", "content": "tell me about the cat"}],
        "stream": True,
        "max_tokens": 32,
    }
    began = time.perf_counter()
    conn.request("POST", "/openai/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})  # fmt: skip
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"chat: {response.status} {response.read()[:200]!r}")
    first = None
    done = False
    while line := response.readline():
        if first is None and b'"content":"' in line and b'"content":""' not in line:
            first = time.perf_counter() - began
        if line.startswith(b"data: [DONE]"):
            done = True
    if first is None or not done:
        raise RuntimeError("a stream without content or without [DONE]")
    return first


def drive(server: Server, call: Call, in_flight: int, seconds: float) -> dict[str, float]:
    """``in_flight`` threads calling in a loop for ``seconds``."""
    port = server.port
    latencies: list[list[float]] = [[] for _ in range(in_flight)]
    firsts: list[list[float]] = [[] for _ in range(in_flight)]
    errors: list[BaseException] = []
    start = threading.Barrier(in_flight + 1)
    stop_at = [0.0]

    def worker(index: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            call(conn)  # warm the connection
            start.wait()
            while (now := time.perf_counter()) < stop_at[0]:
                first = call(conn)
                latencies[index].append(time.perf_counter() - now)
                if first is not None:
                    firsts[index].append(first)
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
    first = [x for part in firsts for x in part]
    return {
        "rps": len(flat) / elapsed,
        "p50_ms": statistics.median(flat) * 1e3,
        "first_ms": statistics.median(first) * 1e3 if first else 0.0,
        "cpu_us": cpu / max(1, len(flat)) * 1e6,
    }


def serve(folder: Path, batching: bool) -> Server:
    text = "    dynamicBatching: {maxQueueDelayMicroseconds: 500}" if batching else ""
    config = folder / ("on.yaml" if batching else "off.yaml")
    config.write_text(CONFIG.format(batching=text))
    argv = [sys.executable, "-m", "servekit", "serve", str(config), "--http-port", "0",
            "--no-grpc", "--host", "127.0.0.1", "--log-level", "warning"]  # fmt: skip
    server = Server(argv, SERVER_CPU, r"listening http://127\.0\.0\.1:(\d+)", cwd=folder)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        conn.request("GET", "/v2/health/ready")
        answer = conn.getresponse()
        answer.read()
        if answer.status == 200:
            conn.close()
            return server
        time.sleep(0.2)
    server.stop()
    raise SystemExit("the server did not become ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--write", type=Path, help="write the table into this markdown file")
    args = parser.parse_args()
    os.sched_setaffinity(0, {int(CLIENT_CPU)})
    os.environ["PYTHONPATH"] = str(ROOT / "app")  # this checkout's servekit
    before = load_average()
    results: dict[tuple[str, int], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        shutil.copy(EXAMPLE / "chargen.py", folder / "chargen.py")
        heavy_embedder(folder)
        for batching in (False, True):
            server = serve(folder, batching)
            try:
                label = "embeddings, batching " + ("on" if batching else "off")
                for connections in (1, 32):
                    results[(label, connections)] = drive(server, embed, connections, args.duration)
                if batching:
                    for connections in (1, 16):
                        results[("chat stream", connections)] = drive(
                            server, chat_stream, connections, args.duration
                        )
            finally:
                server.stop()
    section = render(results, before, load_average(), args.duration)
    print(section)
    if args.write:
        write_section(args.write, section, START, END)


def render(
    results: dict[tuple[str, int], dict[str, float]], before: str, after: str, seconds: float
) -> str:
    lines = [
        START,
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}; load average {before} before, "
        f"{after} after.",
        f"`python bench/openai.py --duration {seconds:g}`",
        "",
        "| what | connections | requests/s | p50 | first chunk p50 | server CPU / request |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for (what, connections), cell in results.items():
        first = f"{cell['first_ms']:.1f} ms" if cell["first_ms"] else "-"
        lines.append(
            f"| {what} | {connections} | {cell['rps']:,.0f} | {cell['p50_ms']:.2f} ms | "
            f"{first} | {cell['cpu_us']:,.0f} us |"
        )
    on, off = results[("embeddings, batching on", 32)], results[("embeddings, batching off", 32)]
    ratio = on["rps"] / off["rps"]
    lines += ["", f"Embeddings at 32 connections: batching on / off = {ratio:.2f}x.", "", END]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
