"""gRPC load benchmark: servekit's ModelInfer (raw and typed contents) against raw onnxruntime.

The load generator is ``h2load`` (Debian package nghttp2-client) replaying one pre-encoded gRPC
frame, so the client is never the bottleneck (a Python gRPC client saturates near 6,000
requests/s per core). The server runs ``servekit serve`` pinned to one core, h2load to another;
raw onnxruntime is timed on the server's core by bench/raw_ort.py with the same session options,
so the table gives ratios measured in the same run, not absolute times alone. ``noop`` replays
ServerLive: the ceiling of the gRPC stack (grpcio's asyncio server) with no work at all.

Shared machines make requests/s depend on neighbours; the server's own CPU time per request
(from /proc) is far steadier, so the table also gives the rate one dedicated core would reach.

    python bench/grpc_load.py                       # 10 s per cell, concurrency 1 and 16
    python bench/grpc_load.py --duration 5 --json results.json
    python bench/grpc_load.py --duration 5 --write docs/performance.md

``--write`` replaces the part of the file between ``<!-- grpc-bench:start -->`` and
``<!-- grpc-bench:end -->`` with this run's table and issue 3's targets, met or not.

Correctness is checked, not assumed: one request per mode is answered and compared with
onnxruntime's output before loading, and after each cell the server's own statistics must show
at least as many successes as h2load counted and no failure (h2load cannot see gRPC trailers).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # onnx_builders

import onnx_builders
from procs import load_average
from report import machine, write_section

from servekit.protos import grpc_service_pb2 as pb
from servekit.protos import grpc_service_pb2_grpc as pb_grpc

SERVICE = "/inference.GRPCInferenceService"
START, END = "<!-- grpc-bench:start -->", "<!-- grpc-bench:end -->"
TARGETS = [
    # (contents, concurrency, what, limit, higher is better): issue 3, item 6
    ("raw", 16, "requests/s", 5_000, True),
    ("raw", 1, "added over onnxruntime us", 150, False),
]
SERVE_YAML = """\
server: {name: bench}
models:
  - name: mlp
    modelFormat: {name: onnx}
    storageUri: mlp.onnx
    runtimeOptions: {intraOpThreads: 1, interOpThreads: 1}
"""
ROW = np.random.default_rng(1).standard_normal((1, 16)).astype(np.float32)


@dataclass
class Cell:
    """One measured (mode, concurrency) cell."""

    mode: str
    concurrency: int
    requests: int
    rps: float
    mean_latency_us: float
    added_over_ort_us: float
    ratio_to_ort: float
    server_cpu_us_per_request: float

    @property
    def dedicated_core_rps(self) -> float:
        """Requests/s one core would serve if the server had it alone (1 s / CPU per request)."""
        return 1e6 / self.server_cpu_us_per_request


def request(mode: str) -> Any:
    """The benchmark request: one row of the tiny MLP, raw or typed contents (noop: ServerLive)."""
    if mode == "noop":
        return pb.ServerLiveRequest()
    message = pb.ModelInferRequest(model_name="mlp")
    tensor = message.inputs.add(name="input", datatype="FP32", shape=[1, 16])
    if mode == "raw":
        message.raw_input_contents.append(ROW.tobytes())
    else:
        tensor.contents.fp32_contents.extend(ROW.reshape(-1).tolist())
    return message


def frame(message: Any) -> bytes:
    """A gRPC length-prefixed message (uncompressed) as it travels in the HTTP/2 DATA frame."""
    body: bytes = message.SerializeToString()
    return b"\0" + struct.pack(">I", len(body)) + body


def start_server(folder: Path, cpu: int) -> tuple[subprocess.Popen[str], str, str]:
    argv = ["taskset", "-c", str(cpu), sys.executable, "-m", "servekit", "serve", "serve.yaml",
            "--http-port", "0", "--grpc-port", "0", "--host", "127.0.0.1"]  # fmt: skip
    log = (folder / "server.log").open("w")
    process = subprocess.Popen(argv, cwd=folder, stdout=subprocess.PIPE, stderr=log, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()  # the server prints its listening line first
    match = re.match(r"servekit: listening (http://\S+) grpc://(\S+)", line)
    if match is None:
        process.kill()
        raise SystemExit(f"server did not start: {line!r}; see {folder / 'server.log'}")
    deadline = time.monotonic() + 60
    while httpx.get(f"{match[1]}/v2/health/ready").status_code != 200:
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            raise SystemExit("server did not become ready")
        time.sleep(0.1)
    return process, match[1], match[2]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime, stime in clock ticks (USER_HZ)


def successes(http_url: str) -> tuple[int, int]:
    stats = httpx.get(f"{http_url}/v2/models/mlp/stats").json()["model_stats"][0]
    return stats["inference_stats"]["success"]["count"], stats["inference_stats"]["fail"]["count"]


def h2load(
    url: str,
    body: Path,
    concurrency: int,
    connections: int,
    duration: float,
    cpu: int,
    headers: Sequence[str] = (),
) -> dict[str, float]:
    """Run h2load: ``concurrency`` requests in flight over ``connections`` HTTP/2 connections
    (``headers``: extra ``name: value`` request headers, e.g. a token)."""
    connections = min(connections, concurrency)
    streams = max(1, concurrency // connections)
    extra = [arg for header in headers for arg in ("-H", header)]
    argv = ["taskset", "-c", str(cpu), "h2load", "-D", f"{duration:g}", "--warm-up-time", "1",
            "-c", str(connections), "-m", str(streams), "-d", str(body),
            "-H", "content-type: application/grpc", "-H", "te: trailers", *extra, url]  # fmt: skip
    completed = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 60)
    out = completed.stdout + completed.stderr
    done = re.search(
        r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed", out
    )
    rate = re.search(r"finished in [\d.]+s, ([\d.]+) req/s", out)
    latency = re.search(r"time for request:\s+\S+\s+\S+\s+([\d.]+)(us|ms|s)", out)
    if not (done and rate and latency):
        raise SystemExit(f"cannot read h2load's output:\n{out}")
    scale = {"us": 1.0, "ms": 1e3, "s": 1e6}[latency[2]]
    return {
        "succeeded": int(done[1]),
        "failed": int(done[2]),
        "rps": float(rate[1]),
        "mean_us": float(latency[1]) * scale,
    }


def check_answer(target: str, mode: str, model_file: Path) -> None:
    """One real request per mode, compared with onnxruntime, before any load."""
    import onnxruntime as ort

    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        if mode == "noop":
            assert stub.ServerLive(request(mode), timeout=10).live
            return
        answer = stub.ModelInfer(request(mode), timeout=10)
    expected = ort.InferenceSession(str(model_file)).run(["output"], {"input": ROW})[0]
    got = np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def raw_onnxruntime_us(folder: Path, cpu: int) -> float:
    """Mean ``session.run`` time of the same model and session options (bench/raw_ort.py)."""
    script = Path(__file__).with_name("raw_ort.py")
    argv = ["taskset", "-c", str(cpu), sys.executable, str(script),
            str(folder / "serve.yaml"), str(folder / "input.npy")]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=300).stdout
    mean: float = json.loads(out.splitlines()[-1])["latency_us"]["mean"]
    return mean


def run(args: argparse.Namespace) -> tuple[list[Cell], float]:
    if shutil.which("h2load") is None:
        raise SystemExit("h2load not found: apt-get install nghttp2-client")
    with tempfile.TemporaryDirectory(prefix="servekit-grpc-bench-") as tmp:
        folder = Path(tmp)
        model_file = folder / "mlp.onnx"
        onnx.save(onnx_builders.mlp(), str(model_file))
        (folder / "serve.yaml").write_text(SERVE_YAML)
        np.save(folder / "input.npy", ROW)
        ort_us = raw_onnxruntime_us(folder, args.server_cpu)
        print(f"raw onnxruntime on cpu {args.server_cpu}: {ort_us:.1f} us/request "
              f"({1e6 / ort_us:,.0f} requests/s)")  # fmt: skip
        process, http_url, target = start_server(folder, args.server_cpu)
        cells: list[Cell] = []
        try:
            for mode in args.modes:
                check_answer(target, mode, model_file)
                body = folder / f"{mode}.bin"
                body.write_bytes(frame(request(mode)))
                method = "ServerLive" if mode == "noop" else "ModelInfer"
                for concurrency in args.concurrency:
                    cells.append(
                        measure(args, process.pid, http_url, f"http://{target}{SERVICE}/{method}",
                                body, mode, concurrency, ort_us)
                    )  # fmt: skip
        finally:
            process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
    return cells, ort_us


def measure(
    args: argparse.Namespace,
    pid: int,
    http_url: str,
    url: str,
    body: Path,
    mode: str,
    concurrency: int,
    ort_us: float,
) -> Cell:
    """One cell: h2load against the server, checked against the server's own statistics."""
    ok_before, fail_before = successes(http_url)
    cpu_before = cpu_seconds(pid)
    result = h2load(url, body, concurrency, args.connections, args.duration, args.client_cpu)
    cpu_used = cpu_seconds(pid) - cpu_before
    ok_after, fail_after = successes(http_url)
    if result["failed"] or fail_after != fail_before:
        raise SystemExit(f"{mode}/{concurrency}: requests failed: {result}")
    served = result["succeeded"]
    if mode != "noop":
        if ok_after - ok_before < served:
            raise SystemExit(f"{mode}/{concurrency}: the server counted fewer successes")
        served = ok_after - ok_before  # includes h2load's warm-up requests
    cell = Cell(
        mode, concurrency, int(result["succeeded"]), result["rps"], result["mean_us"],
        result["mean_us"] - ort_us, result["rps"] / (1e6 / ort_us), cpu_used / served * 1e6,
    )  # fmt: skip
    print(f"{mode:5} c={concurrency:<3} {cell.rps:9,.0f} req/s  mean {cell.mean_latency_us:7.0f} us"
          f"  (+{cell.added_over_ort_us:.0f} us over onnxruntime)  server CPU "
          f"{cell.server_cpu_us_per_request:.0f} us/req", flush=True)  # fmt: skip
    return cell


def table(cells: list[Cell]) -> str:
    lines = [
        "| transport | contents | concurrency | requests/s | mean latency (us) | added over onnxruntime (us) | ratio to onnxruntime | server CPU per request (us) | requests/s on a dedicated core (from CPU time) |",  # noqa: E501
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        lines.append(
            f"| gRPC | {c.mode} | {c.concurrency} | {c.rps:,.0f} | {c.mean_latency_us:.0f} | "
            f"{c.added_over_ort_us:.0f} | {c.ratio_to_ort:.2f} | "
            f"{c.server_cpu_us_per_request:.0f} | {c.dedicated_core_rps:,.0f} |"
        )
    return "\n".join(lines)


def section(cells: list[Cell], ort_us: float, load: tuple[str, str], command: str) -> str:
    """The marked Markdown section of docs/performance.md for one run."""
    lines = [
        START,
        f"Measured {time.strftime('%Y-%m-%d %H:%M')} on {machine()}; grpcio "
        f"{grpc.__version__}. Reproduce: `{command}`. Load average before/after: {load[0]} / "
        f"{load[1]} (the machine is shared; compare rows of this table with each other).",
        "",
        f"Raw onnxruntime on the server's core, same session options: **{ort_us:.1f} us per "
        "call**.",
        "",
        "| contents | concurrency | requests/s | mean latency us | added over onnxruntime us | "
        "x raw ORT time | server CPU us/req |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        name = "noop (ServerLive)" if c.mode == "noop" else c.mode
        added = f"{c.added_over_ort_us:,.0f}" if c.concurrency == 1 else "-"
        lines.append(
            f"| {name} | {c.concurrency} | {c.rps:,.0f} | {c.mean_latency_us:,.0f} | {added} | "
            f"{1 / c.ratio_to_ort:,.0f} | {c.server_cpu_us_per_request:.0f} |"
        )
    lines += [
        "",
        "`added over onnxruntime` (concurrency 1 only; at 16 the latency is mostly queueing): "
        "h2load's mean latency minus raw onnxruntime's time per call. `x raw ORT time`: raw "
        "onnxruntime calls/s divided by the row's requests/s. `server CPU us/req`: the server "
        "process's CPU time (all threads) divided by the calls it served.",
        "",
        "Targets (issue 3, item 6):",
        "",
    ]
    for mode, concurrency, what, limit, higher in TARGETS:
        cell = next((c for c in cells if (c.mode, c.concurrency) == (mode, concurrency)), None)
        if cell is None:
            continue
        value = cell.rps if higher else cell.added_over_ort_us
        met = value >= limit if higher else value <= limit
        lines.append(
            f"- {mode} contents, concurrency {concurrency}: {what} {'>=' if higher else '<='} "
            f"{limit:,}: measured {value:,.0f} ({'met' if met else 'NOT met'})"
        )
    lines += ["", END]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per cell")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=["raw", "typed", "noop"],
        default=["raw", "typed", "noop"],
        help="noop: ServerLive, the ceiling of the gRPC stack itself",
    )
    parser.add_argument(
        "--connections",
        type=int,
        default=1,
        help="HTTP/2 connections the in-flight requests share (1: one channel, as a gRPC client)",
    )
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the cells as JSON here")
    parser.add_argument("--write", type=Path, help="rewrite the grpc-bench section of this file")
    args = parser.parse_args(argv)
    load_before = load_average()
    cells, ort_us = run(args)
    if args.write:
        given = argv if argv is not None else sys.argv[1:]
        command = " ".join(["python bench/grpc_load.py", *given])
        text = section(cells, ort_us, (load_before, load_average()), command)
        write_section(args.write, text, START, END)
    print()
    print(table(cells))
    if args.json:
        rows = [{**asdict(c), "dedicated_core_rps": c.dedicated_core_rps} for c in cells]
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
