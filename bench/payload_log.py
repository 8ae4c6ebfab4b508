"""What the payload log costs the request path: off, to a live sink, to two dead ones.

    python bench/payload_log.py [--duration 5] [--repeat 3] [--write docs/performance.md]

One server per variant, pinned to CPU 0, the tiny MLP (bench/workload.py) posted as REST JSON
by ``wrk`` over 16 connections from CPU 1, in one run, the variants interleaved ``--repeat``
rounds (medians). The variants, each with ``sampleRatio: 1`` (every request logged, inputs and
outputs: two events a request) where the log is on:

* ``off``: no ``server.payloadLog`` (the baseline);
* ``live``: ``sink: http`` to a CloudEvents receiver run by this script on CPU 1 (HTTP/1.1
  keep-alive, answers 200), which counts the events;
* ``refused``: ``sink: http`` to a port where nothing listens;
* ``never answers``: to a socket that listens and never accepts (connections complete in
  the kernel's backlog, the events are sent, no answer comes: the sink's 2 s timeout).

Before a variant's figures count, every wrk request must have been answered 200 and counted by
the statistics. The table gives requests/s, the server's CPU time per request (from /proc: the
steadier figure on a shared machine) and the payload log's own counts (logged, dropped). The
variants run in a new random order each round.

Then what the request path itself pays, in process and steadier than any figure of a loaded
machine: the CPU time per call of the payload log's wrapper around ``DataPlane.infer``
(app/servekit/services/payload_log.py) over an answer made at once, minus the bare call, for a
marked model not drawn (``sampleRatio: 0``) and for the two dead sinks (min of 7 x 20,000
calls). Off, there is no wrapper.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # onnx_builders
sys.path.insert(0, str(HERE.parent / "app"))  # this checkout's servekit

import grpc_load  # noqa: E402
from procs import load_average  # noqa: E402
from report import write_section  # noqa: E402
from run import run_wrk  # noqa: E402
from workload import make_workload  # noqa: E402

START, END = "<!-- payload-log-bench:start -->", "<!-- payload-log-bench:end -->"
VARIANTS = ("off", "live", "refused", "never answers")
"""No sink; a live one; a dead one refusing connections; a dead one that never answers."""


SERVER_CPU, CLIENT_CPU = 0, 1
LISTENING = re.compile(r"servekit: listening (http://\S+) grpc://(\S+)")


def start(folder: Path, text: str) -> tuple[subprocess.Popen[str], str]:
    """A server for serve.yaml ``text`` (written in ``folder``), pinned to CPU 0, ready."""
    (folder / "serve.yaml").write_text(text)
    env = {**os.environ, "PYTHONPATH": str(HERE.parent / "app")}  # this checkout's servekit
    argv = ["taskset", "-c", str(SERVER_CPU), sys.executable, "-m", "servekit", "serve",
            str(folder / "serve.yaml"), "--http-port", "0", "--grpc-port", "0",
            "--host", "127.0.0.1", "--log-level", "warning"]  # fmt: skip
    process = subprocess.Popen(argv, cwd=folder, stdout=subprocess.PIPE, text=True, env=env,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    assert process.stdout is not None
    deadline = time.monotonic() + 120
    while not (match := LISTENING.match(process.stdout.readline() or "-")):
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            raise SystemExit("server did not start")
    threading.Thread(target=process.stdout.read, daemon=True).start()  # drain the rest
    while httpx.get(f"{match[1]}/v2/health/ready").status_code != 200:
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            raise SystemExit("server did not become ready")
        time.sleep(0.1)
    return process, match[1]


@dataclass
class Cell:
    rps: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)
    logged: list[float] = field(default_factory=list)
    dropped: list[float] = field(default_factory=list)


class LiveSink:
    """A CloudEvents receiver that counts POSTs and answers 200, keep-alive."""

    def __init__(self) -> None:
        self.events = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                sink.events += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def sink_url(variant: str, live: LiveSink, silent: socket.socket) -> str | None:
    if variant == "live":
        return live.url
    if variant == "refused":
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return f"http://127.0.0.1:{probe.getsockname()[1]}/"
    if variant == "never answers":
        return f"http://127.0.0.1:{silent.getsockname()[1]}/"
    return None


def counts(http_url: str) -> tuple[float, float]:
    """The payload log's logged and dropped events, from /metrics."""
    text = httpx.get(f"{http_url}/metrics").text
    logged = re.search(r"^servekit_payload_log_logged_total (\S+)$", text, re.MULTILINE)
    dropped = re.findall(r"^servekit_payload_log_dropped_total\{[^}]*\} (\S+)$", text, re.MULTILINE)
    return (float(logged[1]) if logged else 0.0), sum(float(d) for d in dropped)


def one_round(folder: Path, args: argparse.Namespace, cells: dict[str, Cell], live: LiveSink,
              silent: socket.socket) -> None:  # fmt: skip
    workload = make_workload(folder)
    body, _ = workload.bodies["REST JSON"]
    base = workload.config.read_text()
    for variant in random.sample(VARIANTS, len(VARIANTS)):
        url = sink_url(variant, live, silent)
        text = base
        if url is not None:
            marked = "storageUri: ./mlp.onnx\n    payloadLog: true"
            text = text.replace("storageUri: ./mlp.onnx", marked)
            text = f"server:\n  payloadLog: {{sink: http, url: '{url}'}}\n" + text
        process, http_url = start(folder, text)
        try:
            ok_before, _ = grpc_load.successes(http_url)
            cpu_before = grpc_load.cpu_seconds(process.pid)
            rest = run_wrk(f"{http_url}/v2/models/mlp/infer", body, None, args.connections,
                           args.duration)  # fmt: skip
            cpu = grpc_load.cpu_seconds(process.pid) - cpu_before
            ok_after, failed = grpc_load.successes(http_url)
            served = ok_after - ok_before
            if failed or any(rest["errors"].values()) or served < rest["requests"]:
                raise SystemExit(f"{variant}: answers failed: {rest}")
            logged, dropped = counts(http_url)
        finally:
            process.terminate()
            process.wait(30)
        cell = cells.setdefault(variant, Cell())
        cell.rps.append(rest["rps"])
        cell.cpu_us.append(cpu / served * 1e6)
        cell.logged.append(logged / (2 * served))
        cell.dropped.append(dropped / (2 * served))
        print(f"{variant:20} {rest['rps']:8,.0f} req/s {cpu / served * 1e6:6.1f} us/req "
              f"logged {logged:,.0f} dropped {dropped:,.0f}", flush=True)  # fmt: skip


def wrapper_cost(folder: Path, url: str, ratio: float) -> float:
    """The wrapper's CPU time per call (us) in process, a dead or undrawn log (see the module
    docstring)."""
    from servekit.config.compiler import compile_plan
    from servekit.config.loader import parse_config
    from servekit.server import ServeKit
    from servekit.services.payload_log import recording
    from servekit.types import InferRequest, InferResponse

    text = make_workload(folder).config.read_text()
    text = text.replace("storageUri: ./mlp.onnx", "storageUri: ./mlp.onnx\n    payloadLog: true")
    text = f"server:\n  payloadLog: {{sink: http, url: '{url}', sampleRatio: {ratio}}}\n" + text
    kit = ServeKit(compile_plan(parse_config(text), folder))
    request, answer = InferRequest("mlp", []), InferResponse("mlp", "1", [])

    async def bare(*_: Any) -> InferResponse:
        return answer

    async def measure() -> float:
        await kit.control.start()
        assert kit.state.payloads is not None
        wrapped = recording(kit.state, kit.repository, kit.state.payloads, bare)
        costs = []
        for _ in range(7):
            began = time.process_time()
            for _ in range(20_000):
                await wrapped(request)
            mid = time.process_time()
            for _ in range(20_000):
                await bare(request)
            costs.append(((mid - began) - (time.process_time() - mid)) / 20_000 * 1e6)
        await kit.stop()
        return min(costs)

    return asyncio.run(measure())


def section(cells: dict[str, Cell], args: argparse.Namespace, load: tuple[str, str],
            wrapper: dict[str, float]) -> str:  # fmt: skip
    """The page's section: short, as docs/performance.md's Method says the rest."""
    rows = []
    for variant in VARIANTS:
        cell = cells[variant]
        rps, cpu = statistics.median(cell.rps), statistics.median(cell.cpu_us)
        shares = (
            " | "
            if variant == "off"
            else (f"{statistics.median(cell.logged):.0%} | {statistics.median(cell.dropped):.0%}")
        )
        low, high = min(cell.cpu_us), max(cell.cpu_us)
        rows.append(f"| {variant} | {rps:,.0f} | {cpu:.1f} ({low:.0f}-{high:.0f}) | {shares} |")
    command = (f"python bench/payload_log.py --duration {args.duration:g} "
               f"--repeat {args.repeat} --write docs/performance.md")  # fmt: skip
    return "\n".join(
        [
            START,
            "## Payload log",
            "",
            f"`{command}` ({time.strftime('%Y-%m-%d')}, load {load[0].split()[0]}): tiny MLP, "
            "REST JSON, 16 in flight, every request logged.",
            "",
            "| sink | req/s | CPU us/req (range) | logged | dropped |",
            "|---|---:|---:|---:|---:|",
            *rows,
            "",
            "In process, the wrapper's CPU per request: "
            + ", ".join(f"{name} {us:.2f} us" for name, us in wrapper.items())
            + " (off: none); the dead sinks' server figures are within the rounds' noise.",
            END,
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args()
    os.sched_setaffinity(0, {CLIENT_CPU})  # this script and the live sink stay off CPU 0
    live = LiveSink()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1024)
    load_before = load_average()
    cells: dict[str, Cell] = {}
    with tempfile.TemporaryDirectory(prefix="servekit-payload-log-") as tmp:
        folder = Path(tmp)
        for _ in range(args.repeat):
            one_round(folder, args, cells, live, silent)
        wrapper = {
            "not drawn": wrapper_cost(folder, live.url, 0.0),
            "refused": wrapper_cost(folder, sink_url("refused", live, silent) or "", 1.0),
            "never answers": wrapper_cost(
                folder, sink_url("never answers", live, silent) or "", 1.0
            ),
        }
    live.server.shutdown()
    silent.close()
    text = section(cells, args, (load_before, load_average()), wrapper)
    print(text)
    if args.write is not None:
        write_section(args.write, text, START, END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
