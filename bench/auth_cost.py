"""What checking tokens costs on the inference hot path: token off vs on, same run.

    python bench/auth_cost.py [--duration 5] [--repeat 3] [--write docs/performance.md]

Two ``servekit serve`` processes serve the tiny MLP, both pinned to CPU 0: one without
``server.auth``, one with every group behind a token (``server.auth.default``). They are driven
in turn, round after round (off then on, on then off, ...), so both see the same neighbours:

* REST JSON at 16 connections with ``wrk`` (``bench/wrk/post.lua``; the token server gets the
  ``Authorization`` header), pinned to CPU 1;
* gRPC ModelInfer (raw contents) at 16 in flight over one HTTP/2 connection with ``h2load``
  (``bench/grpc_load.py``; ``authorization`` metadata), pinned to CPU 1.

Raw onnxruntime (``bench/raw_ort.py``) is measured in the same run for scale. The table gives
medians over the rounds of requests/s and of the server's CPU microseconds per request (the
steadier figure on a shared machine), and the ratio on/off. Written between the
``auth-bench`` markers of docs/performance.md with ``--write``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from grpc_load import SERVICE, frame, h2load, request  # noqa: E402
from procs import Server, load_average  # noqa: E402
from report import machine, write_section  # noqa: E402
from run import CLIENT_CPU, SERVER_CPU, measure, raw_ort, wait_ready  # noqa: E402
from workload import make_workload  # noqa: E402

START, END = "<!-- auth-bench:start -->", "<!-- auth-bench:end -->"
TOKEN = "bench-token-0123456789abcdef"
LIMIT = 0.97  # issue 10: at most 3% fewer requests/s with tokens on


def start(config: Path, token: bool) -> Server:
    argv = [sys.executable, "-m", "servekit", "serve", str(config), "--http-port", "0",
            "--grpc-port", "0", "--host", "127.0.0.1", "--log-level", "warning"]  # fmt: skip
    env_token = {"BENCH_TOKEN": TOKEN} if token else {}
    os.environ.update(env_token)
    try:
        return Server(argv, SERVER_CPU, r"listening http://127\.0\.0\.1:(\d+)", cwd=config.parent)
    finally:
        os.environ.pop("BENCH_TOKEN", None)


def grpc_port(server: Server) -> int:
    for line in server.output:
        if " grpc://" in line:
            return int(line.rsplit(":", 1)[1].split()[0])
    raise RuntimeError("no gRPC address in the listening line")


def rest_cell(server: Server, body: Path, seconds: float, token: bool) -> dict[str, Any]:
    url = f"http://127.0.0.1:{server.port}/v2/models/mlp/infer"
    authorization = f"Bearer {TOKEN}" if token else None
    result = measure(server, url, body, None, 16, seconds, authorization)
    if sum(result["errors"].values()):
        raise SystemExit(f"REST requests failed: {result['errors']}")
    return {"rps": result["rps"], "cpu_us": result["cpu_us_per_request"]}


def grpc_cell(server: Server, body: Path, seconds: float, token: bool) -> dict[str, Any]:
    url = f"http://127.0.0.1:{grpc_port(server)}{SERVICE}/ModelInfer"
    headers = [f"authorization: Bearer {TOKEN}"] if token else []
    cpu_before = server.cpu_seconds()
    result = h2load(url, body, 16, 1, seconds, int(CLIENT_CPU), headers)
    cpu = server.cpu_seconds() - cpu_before
    if result["failed"] or not result["succeeded"]:
        raise SystemExit(f"gRPC requests failed: {result}")
    # h2load cannot see gRPC trailers: a refused call would count as succeeded, so the
    # token server is checked once with a wrong token before (see main) and never refuses here.
    return {"rps": result["rps"], "cpu_us": cpu * 1e6 / result["succeeded"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per cell")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (off, on) of every cell")
    parser.add_argument("--write", type=Path, help="rewrite the auth-bench section of this file")
    args = parser.parse_args(argv)
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="servekit-auth-bench-") as tmp:
        folder = Path(tmp)
        workload = make_workload(folder)
        secured = folder / "secured.yaml"
        secured.write_text(
            workload.config.read_text().replace(
                "models:", "server:\n  auth: {default: {env: BENCH_TOKEN}}\nmodels:", 1
            )
        )
        grpc_body = folder / "grpc.bin"
        grpc_body.write_bytes(frame(request("raw")))
        rest_body, _ = workload.bodies["REST JSON"]
        ort = raw_ort(workload, args.duration)
        servers = {False: start(workload.config, False), True: start(secured, True)}
        try:
            for on, server in servers.items():
                wait_ready(f"http://127.0.0.1:{server.port}/v2/health/ready")
                check_refusal(server, on)
            cells: dict[tuple[str, bool], list[dict[str, Any]]] = {}
            for round_ in range(args.repeat):
                for kind, body, cell in (("REST JSON", rest_body, rest_cell),
                                         ("gRPC raw", grpc_body, grpc_cell)):  # fmt: skip
                    order = list(servers.items())  # off first in odd rounds, on first in even
                    for on, server in order if round_ % 2 == 0 else order[::-1]:
                        result = cell(server, body, args.duration, on)
                        cells.setdefault((kind, on), []).append(result)
                        print(f"round {round_ + 1} {kind:9} token {'on ' if on else 'off'} "
                              f"{result['rps']:9,.0f} req/s  {result['cpu_us']:6.1f} us CPU/req",
                              flush=True)  # fmt: skip
        finally:
            for server in servers.values():
                server.stop()
    text = section(cells, ort, (load_before, load_average()), argv, check_cost_us())
    print(text)
    if args.write:
        write_section(args.write, text, START, END)
    return 0


def check_cost_us(calls: int = 200_000) -> dict[str, float]:
    """The check alone, timed in this process: what one request pays for it, free of the
    load noise that moves whole-server figures by several percent between rounds."""
    import asyncio
    import time

    from servekit.config.auth import AccessPolicy, ApiGroup
    from servekit.grpc.access import _checked

    policy = AccessPolicy({ApiGroup.INFERENCE: TOKEN.encode()})
    header = f"Bearer {TOKEN}".encode()
    started = time.perf_counter()
    for _ in range(calls):
        policy.allows(ApiGroup.INFERENCE, header)
    rest = (time.perf_counter() - started) / calls * 1e6

    class Context:  # what the wrapper reads of grpc.aio's ServicerContext
        metadata = (("user-agent", "grpc-c"), ("authorization", f"Bearer {TOKEN}"))

        def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
            return self.metadata

    async def method(request: object, context: object) -> None:
        return None

    async def run(handler: Any) -> float:
        context = Context()
        begun = time.perf_counter()
        for _ in range(calls):
            await handler(None, context)
        return (time.perf_counter() - begun) / calls * 1e6

    loop = asyncio.new_event_loop()
    try:
        bare = loop.run_until_complete(run(method))
        wrapped = loop.run_until_complete(run(_checked(method, policy, ApiGroup.INFERENCE)))
    finally:
        loop.close()
    return {"rest": rest, "grpc": wrapped - bare}


def check_refusal(server: Server, on: bool) -> None:
    """The token server must refuse a request without the token (else the run measures
    nothing), and the other must serve it."""
    import httpx

    url = f"http://127.0.0.1:{server.port}/v2/models/mlp/infer"
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16], "data": [0] * 16}]}
    status = httpx.post(url, json=body, timeout=10).status_code
    if status != (401 if on else 200):
        raise SystemExit(f"token {'on' if on else 'off'}: a request without a token got {status}")


def section(
    cells: dict[tuple[str, bool], list[dict[str, Any]]],
    ort: dict[str, Any],
    load: tuple[str, str],
    argv: list[str] | None,
    check: dict[str, float],
) -> str:
    given = argv if argv is not None else sys.argv[1:]
    lines = [
        f"Command: `{' '.join(['python bench/auth_cost.py', *given])}`",
        f"Machine: {machine()}; load average before/after: {load[0]} / {load[1]}.",
        f"Raw onnxruntime, same run: {ort['latency_us']['mean']:.1f} us per call "
        f"({ort['calls_per_s']:,.0f} calls/s).",
        "",
        "| path, 16 in flight | token | requests/s (median) | server CPU us/request (median) "
        "| on/off requests/s | on/off CPU |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for kind in ("REST JSON", "gRPC raw"):
        off, on = cells[(kind, False)], cells[(kind, True)]
        rps_off = statistics.median(c["rps"] for c in off)
        rps_on = statistics.median(c["rps"] for c in on)
        cpu_off = statistics.median(c["cpu_us"] for c in off)
        cpu_on = statistics.median(c["cpu_us"] for c in on)
        lines.append(f"| {kind} | off | {rps_off:,.0f} | {cpu_off:.1f} | | |")
        verdict = "met" if rps_on / rps_off >= LIMIT else "NOT met"
        lines.append(
            f"| {kind} | on | {rps_on:,.0f} | {cpu_on:.1f} | {rps_on / rps_off:.3f} "
            f"| {cpu_on / cpu_off:.3f} ({verdict}: at most 3% fewer requests/s) |"
        )
    rest_cpu = statistics.median(c["cpu_us"] for c in cells[("REST JSON", False)])
    grpc_cpu = statistics.median(c["cpu_us"] for c in cells[("gRPC raw", False)])
    lines += [
        "",
        f"The check alone, timed in process: {check['rest']:.2f} us per REST request (bearer "
        f"parse and constant-time compare), {check['grpc']:.2f} us per gRPC call (the method "
        "wrapper and the metadata read); against the server CPU per request above, "
        f"{100 * check['rest'] / rest_cpu:.1f}% and {100 * check['grpc'] / grpc_cpu:.1f}%.",
    ]
    return "\n".join([START, *lines, END]) + "\n"


if __name__ == "__main__":
    sys.exit(main())
