"""Where the time of one REST inference goes, stage by stage, in one process (no sockets).

    taskset -c 0 python bench/breakdown.py [--profile]

Each stage runs in a hot loop (the same request over and over) and reports the best mean of
several rounds, so the numbers are lower bounds: in the real server the caches are shared with
the kernel's TCP work and with other processes. What they show reliably is the split between
model, codecs, dataplane and framework. The socket and HTTP parsing part (uvicorn + httptools)
is what ``bench/run.py`` reports for the do-nothing ASGI app. ``--profile`` adds a cProfile of
the whole in-process request, sorted by own time.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # onnx_builders

from litestar import Litestar, Request, post
from litestar.types import ASGIApp, Receive, Scope, Send
from workload import make_workload

from servekit.cli import load_plan
from servekit.codecs import v2_binary, v2_json
from servekit.grpc.servicer import InferenceServicer
from servekit.protos import grpc_service_pb2 as pb
from servekit.server import ServeKit

PATH = "/v2/models/mlp/infer"


def _scope(headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": PATH,
        "raw_path": PATH.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
        "state": {},
    }


def asgi_call(app: Any, body: bytes, header_length: int | None) -> Callable[[], Awaitable[None]]:
    """One POST through an ASGI app, the way uvicorn calls it (one body message)."""
    headers = [(b"host", b"bench"), (b"content-length", str(len(body)).encode())]
    if header_length is not None:
        headers.append((b"inference-header-content-length", str(header_length).encode()))
    statuses: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def call() -> None:
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await app(_scope(headers), receive, send)
        if statuses.pop() != 200:
            raise RuntimeError("the benchmark request failed")

    return call


async def noop_app(scope: Scope, receive: Receive, send: Send) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}", "more_body": False})


@post("/v2/models/{model:str}/infer", status_code=200)
async def trivial(request: Request[Any, Any, Any]) -> ASGIApp:
    """The cheapest ordinary Litestar POST handler: reads the body, answers fixed bytes."""
    await request.body()
    return noop_app


def _answer_directly(app: ASGIApp) -> ASGIApp:
    return noop_app


@post("/v2/models/{model:str}/infer", status_code=200, middleware=[_answer_directly])
async def trivial_routed(request: Request[Any, Any, Any]) -> ASGIApp:
    """Routed like servekit's inference (handler-level middleware answers): Litestar's floor."""
    return noop_app


async def best_mean_us(fn: Callable[[], Any], n: int = 5000, rounds: int = 7) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter_ns()
        for _ in range(n):
            result = fn()
            if asyncio.iscoroutine(result):
                await result
        best = min(best, (time.perf_counter_ns() - started) / n)
    return best / 1000


async def main(profile: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        workload = make_workload(Path(tmp))
        kit = ServeKit(load_plan(str(workload.config)))
        await kit.control.start()
        try:
            await _stages(kit, workload, profile)
        finally:
            await kit.control.close()


async def _stages(kit: ServeKit, workload: Any, profile: bool) -> None:
    dataplane = kit.dataplane
    json_body = workload.bodies["REST JSON"][0].read_bytes()
    binary_path, header_length = workload.bodies["REST binary"]
    binary_body = binary_path.read_bytes()
    request = v2_json.decode_request(v2_json.loads(json_body), "mlp", None)
    binary_request = v2_binary.decode_request(binary_body, header_length, "mlp", None)
    response = await dataplane.infer(request)
    binary_response = await dataplane.infer(binary_request)
    _, version = kit.repository.resolve("mlp", None)
    runtime = version.runtime
    assert runtime is not None
    session = runtime._sessions[0]  # type: ignore[attr-defined]
    feed = {"input": request.inputs[0].data}
    app = kit.http_app()
    grpc_request = pb.ModelInferRequest(model_name="mlp")
    grpc_request.inputs.add(name="input", datatype="FP32", shape=feed["input"].shape)
    grpc_request.raw_input_contents.append(feed["input"].tobytes())
    servicer = InferenceServicer(dataplane)
    no_deadline = SimpleNamespace(time_remaining=lambda: None)  # all ModelInfer asks of it
    stages: list[tuple[str, Callable[[], Any]]] = [
        ("onnxruntime session.run", lambda: session.run(["output"], feed)),
        ("runtime.predict (servekit's ORT wrapper)", lambda: runtime.predict(feed, ["output"])),
        ("dataplane.infer (validate, run, stats)", lambda: dataplane.infer(request)),
        (
            "JSON: orjson.loads + decode_request",
            lambda: v2_json.decode_request(v2_json.loads(json_body), "mlp", None),
        ),
        ("JSON: encode_response", lambda: v2_binary.encode_response(request, response)),
        (
            "binary: decode_request",
            lambda: v2_binary.decode_request(binary_body, header_length, "mlp", None),
        ),
        (
            "binary: encode_response",
            lambda: v2_binary.encode_response(binary_request, binary_response),
        ),
        (
            "gRPC: ModelInfer handler, raw contents",
            lambda: servicer.ModelInfer(grpc_request, no_deadline),
        ),
        ("do-nothing ASGI app (in-process)", asgi_call(noop_app, json_body, None)),
        (
            "Litestar, ordinary do-nothing POST handler",
            asgi_call(Litestar([trivial]), json_body, None),
        ),
        (
            "Litestar, do-nothing routed like servekit",
            asgi_call(Litestar([trivial_routed]), json_body, None),
        ),
        ("whole app, REST JSON request", asgi_call(app, json_body, None)),
        ("whole app, REST binary request", asgi_call(app, binary_body, header_length)),
    ]
    print(f"{'stage':45s} {'us/call':>8s}")
    for name, fn in stages:
        print(f"{name:45s} {await best_mean_us(fn):8.2f}", flush=True)
    if profile:
        call = asgi_call(app, json_body, None)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(20000):
            await call()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="store_true", help="also print a cProfile")
    import uvloop

    uvloop.run(main(parser.parse_args().profile))
