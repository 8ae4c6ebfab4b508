"""Instructions per stage of one tiny REST inference, counted by valgrind (callgrind).

    python bench/stages.py [--tree .] [--requests 1000] [--loops 2000]

Two parts, both in instructions (work done, so the shared machine's load does not move them):

1. **Whole servers** (as bench/instructions.py): ``servekit serve`` of ``--tree``, the
   do-nothing ASGI app on uvicorn and the same answer from inside Litestar
   (bench/noop_asgi.py), each under callgrind with counting switched on after a warm-up; one
   client sends ``--requests`` requests on one keep-alive connection (REST JSON and REST
   binary bodies for servekit). The do-nothing app is the floor of the stack (socket, uvloop,
   httptools, uvicorn's cycle); servekit minus it is what servekit adds.
2. **Stages in one process**: the stages of a request (routing, body read, decode, validation,
   executor hand-off, model call, encode) each run ``--loops`` times in a loop inside one
   Python process under callgrind, the counter zeroed and dumped around each loop (Valgrind
   client requests from a tiny C helper built at run time; the loop's own constant cost is
   measured by an empty loop and taken off). Stage figures are lower bounds of what the same
   code costs in the server (they repeat one request, so every cache is warm); their sum and
   the whole in-process app tell how much is glue.

Prints tables in the Markdown of docs/performance.md ("REST hot path: per-stage cost").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # onnx_builders

from breakdown import asgi_call  # noqa: E402  (the same in-process ASGI call as breakdown.py)
from instructions import INLINE_BOUND_US, _control, _http_sender  # noqa: E402
from run import wait_ready  # noqa: E402
from workload import make_workload  # noqa: E402

LISTENING = re.compile(r"listening (?:http://127\.0\.0\.1:)?(\d+)")
PATH = "/v2/models/mlp/infer"


# -- 1. whole servers ---------------------------------------------------------------------------
def server_count(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    ready_path: str,
    body: bytes,
    header_length: int | None,
    requests: int,
    out_dir: Path,
    name: str,
) -> float:
    """Instructions per request of the server ``argv`` starts (under callgrind)."""
    out_file = out_dir / f"callgrind.{name}.out"
    prefix = f"--vgdb-prefix={out_dir / name}-vgdb"
    full = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--vgdb=yes", prefix,
            f"--callgrind-out-file={out_file}", *argv]  # fmt: skip
    log_path = out_dir / f"{name}.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(full, cwd=cwd, env=env, stderr=log_file, stdout=log_file)
    try:
        port = _wait_port(proc, log_path)
        if ready_path:
            wait_ready(f"http://127.0.0.1:{port}{ready_path}", timeout=300)
        send = _http_sender(port, body, header_length)
        send(200)
        _control(prefix, proc.pid, "-i", "on")
        send(requests)
        _control(prefix, proc.pid, "-i", "off")
        _control(prefix, proc.pid, "--dump")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    total = 0
    for dump in out_dir.glob(f"callgrind.{name}.out*"):
        total = max(total, _total(dump))
    return total / requests


def _total(dump: Path) -> int:
    total = 0
    for line in dump.read_text(errors="replace").splitlines():
        if line.startswith("summary:") or line.startswith("totals:"):
            total = max(total, int(line.split()[1]))
    return total


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


def whole_servers(tree: Path, requests: int, tmp: Path) -> list[tuple[str, float]]:
    workload = make_workload(tmp)
    root = tree / "app"
    env = dict(os.environ, PYTHONPATH=str(root.resolve()), PYTHONMALLOC="malloc")
    serve = [sys.executable, "-m", "servekit", "serve", str(workload.config), "--http-port", "0",
             "--host", "127.0.0.1", "--log-level", "warning", "--no-grpc"]  # fmt: skip
    json_body = workload.bodies["REST JSON"][0].read_bytes()
    binary_path, header_length = workload.bodies["REST binary"]
    rows = []
    for label, argv, ready, body, length in [
        ("servekit, REST JSON", serve, "/v2/models/mlp/ready", json_body, None),
        ("servekit, REST binary", serve, "/v2/models/mlp/ready", binary_path.read_bytes(),
         header_length),
        ("do-nothing ASGI app (uvicorn)", [sys.executable, str(HERE / "noop_asgi.py")], "",
         json_body, None),
        ("do-nothing Litestar route (uvicorn)",
         [sys.executable, str(HERE / "noop_asgi.py"), "--server", "litestar"], "", json_body,
         None),
    ]:  # fmt: skip
        name = re.sub(r"\W+", "_", label)
        value = server_count(argv, env, tree, ready, body, length, requests, tmp, name)
        rows.append((label, value))
        print(f"{label:45s} {value:>12,.0f}", flush=True)
    return rows


# -- 2. stages in one process -------------------------------------------------------------------


async def _child(loops: int, out_prefix: str) -> None:
    """Runs under callgrind: each stage ``loops`` times between a zero and a dump."""
    from noop_asgi import app as noop_app
    from noop_asgi import litestar_app

    from servekit.cli import load_plan
    from servekit.codecs import v2_binary, v2_json
    from servekit.server import ServeKit
    from servekit.types import InferResponse

    with tempfile.TemporaryDirectory() as tmp:
        marks = _marks(Path(tmp))
        workload = make_workload(Path(tmp))
        # As bench/instructions.py: the model stays on the loop under valgrind (its calls,
        # 50 times slower there, would otherwise go back to the worker threads, and every
        # dataplane row would count a thread hop).
        config = workload.config
        config.write_text(
            config.read_text() + f"server:\n  inlineBelowMicroseconds: {INLINE_BOUND_US}\n"
        )
        kit = ServeKit(load_plan(str(config)))
        await kit.control.start()
        try:
            dataplane = kit.dataplane
            json_body = workload.bodies["REST JSON"][0].read_bytes()
            binary_path, header_length = workload.bodies["REST binary"]
            assert header_length is not None
            binary_body = binary_path.read_bytes()
            request = v2_json.decode_request(v2_json.loads(json_body), "mlp", None)
            binary_request = v2_binary.decode_request(binary_body, header_length, "mlp", None)
            response = await dataplane.infer(request)
            binary_response = await dataplane.infer(binary_request)
            _, version = kit.repository.resolve("mlp", None)
            runtime = version.runtime
            executor: Any = version.executor
            assert runtime is not None
            session = runtime._sessions[0]  # type: ignore[attr-defined]
            feed = {"input": request.inputs[0].data}
            response_arrays = runtime.predict(feed, ["output"])
            import numpy as np

            from servekit.codecs import v2_proto
            from servekit.codecs.raw import tensor_from_bytes
            from servekit.datatypes import DATATYPES
            from servekit.grpc.servicer import InferenceServicer
            from servekit.protos import grpc_service_pb2 as pb
            from servekit.services.execution.inputs import check_request
            from servekit.types import InferRequest, Tensor

            FP32 = DATATYPES["FP32"]
            data_list = v2_json.loads(json_body)["inputs"][0]["data"]
            # The route's JSON decode (a tree before decode_body: loads + decode_request).
            decode_body = getattr(
                v2_json,
                "decode_body",
                lambda body, model, version: v2_json.decode_request(
                    v2_json.loads(body), model, version
                ),
            )
            grpc_request = pb.ModelInferRequest(model_name="mlp")  # as tritonclient sends it
            grpc_request.inputs.add(name="input", datatype="FP32", shape=feed["input"].shape)
            grpc_request.raw_input_contents.append(feed["input"].tobytes())
            grpc_infer = v2_proto.decode_request(grpc_request)
            grpc_response = await dataplane.infer(grpc_infer)
            servicer = InferenceServicer(dataplane)
            context: Any = _NoDeadline()
            prepared = version.prepared
            assert prepared is not None
            clock = time.perf_counter_ns
            app = kit.http_app()  # every route, as the server routes them
            litestar = litestar_app()
            stages: list[tuple[str, Callable[[], Any]]] = [
                ("empty loop (taken off every stage)", lambda: None),
                ("onnxruntime session.run", lambda: session.run(["output"], feed)),
                ("runtime.predict (servekit's ORT wrapper)",
                 lambda: runtime.predict(feed, ["output"])),
                ("executor.run_inline (predict + timing)",
                 lambda: executor.run_inline(feed, ["output"], 1)),
                ("validation: check_request",
                 lambda: check_request(request, runtime.signature, 0)),
                ("dataplane.infer, JSON request (all of the above + account)",
                 lambda: dataplane.infer(request)),
                ("JSON decode: loads + decode_request",
                 lambda: v2_json.decode_request(v2_json.loads(json_body), "mlp", None)),
                ("JSON decode as the route does it (decode_body)",
                 lambda: decode_body(json_body, "mlp", None)),
                ("  JSON: orjson.loads alone", lambda: v2_json.loads(json_body)),
                ("  JSON: data list to numpy (np.array)",
                 lambda: np.array(data_list, dtype=np.float32)),
                ("  Tensor construction",
                 lambda: Tensor("input", "FP32", (1, 16), feed["input"], {})),
                ("  InferRequest construction",
                 lambda: InferRequest("mlp", request.inputs, None, None, None, {})),
                ("JSON encode_response", lambda: v2_binary.encode_response(request, response)),
                ("binary decode_request",
                 lambda: v2_binary.decode_request(binary_body, header_length, "mlp", None)),
                ("  binary: header parse (loads of the JSON header)",
                 lambda: v2_json.loads(binary_body[:header_length])),
                ("  binary: raw.tensor_from_bytes", lambda: tensor_from_bytes(
                    "input", FP32, (1, 16), binary_body, header_length, 64)),
                ("binary encode_response",
                 lambda: v2_binary.encode_response(binary_request, binary_response)),
                ("repository.resolve", lambda: kit.repository.resolve("mlp", None)),
                ("compiled input checks (prepared.check)", lambda: prepared.check(request)),
                ("executor.run_now (predict + placement + timing)",
                 lambda: executor.run_now(feed, ["output"], 1, lambda: 1, clock())),
                ("output wrapping (check.tensors)",
                 lambda: executor.check.tensors(response_arrays, prepared.signature.outputs)),
                ("InferResponse", lambda: InferResponse("mlp", "1", response.outputs, None)),
                ("statistics: record_clocks", lambda: prepared.stats.record_clocks(
                    1, 0, clock(), clock(), clock(), clock())),
                ("gRPC decode_request", lambda: v2_proto.decode_request(grpc_request)),
                ("gRPC encode_response",
                 lambda: v2_proto.encode_response(grpc_infer, grpc_response)),
                ("dataplane.infer, gRPC request", lambda: dataplane.infer(grpc_infer)),
                ("gRPC ModelInfer handler (decode, infer, encode)",
                 lambda: servicer.ModelInfer(grpc_request, context)),
                ("do-nothing ASGI app, in process", asgi_call(noop_app, json_body, None)),
                ("do-nothing Litestar route, in process", asgi_call(litestar, json_body, None)),
                ("whole app, REST JSON, in process", asgi_call(app, json_body, None)),
                ("whole app, REST binary, in process",
                 asgi_call(app, binary_body, header_length)),
            ]  # fmt: skip
            for index, (name, fn) in enumerate(stages):
                for _ in range(200):  # warm-up
                    result = fn()
                    if asyncio.iscoroutine(result):
                        await result
                marks.stages_dump(b"warm-up")  # a dump starts the counter over
                for _ in range(loops):
                    result = fn()
                    if asyncio.iscoroutine(result):
                        await result
                marks.stages_dump(f"{index:02d} {name}".encode())
        finally:
            await kit.control.close()
    print(f"{out_prefix} done", flush=True)


class _NoDeadline:
    """The one thing ModelInfer asks of its gRPC context: the client's deadline (none)."""

    def time_remaining(self) -> None:
        return None


_MARKS_C = r"""
#include <valgrind/callgrind.h>
void stages_zero(void) { CALLGRIND_ZERO_STATS; }
void stages_dump(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
"""
"""Valgrind client requests (valgrind/callgrind.h): the process zeroes and dumps its own
counter at once, with no ``callgrind_control`` round trip."""


def _marks(directory: Path) -> Any:
    import ctypes

    source = directory / "marks.c"
    library = directory / "marks.so"
    if not library.exists():
        source.write_text(_MARKS_C)
        subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", str(library), str(source)],
                       check=True)  # fmt: skip
    return ctypes.CDLL(str(library))


def in_process(tree: Path, loops: int, tmp: Path) -> list[tuple[str, float]]:
    out_file = tmp / "callgrind.stages.out"
    env = dict(os.environ, PYTHONPATH=str((tree / "app").resolve()), PYTHONMALLOC="malloc")
    argv = ["valgrind", "--tool=callgrind", "--vgdb=no", f"--callgrind-out-file={out_file}",
            sys.executable, str(Path(__file__).resolve()),
            "--child", "--loops", str(loops)]  # fmt: skip
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"stage run failed: {done.stderr[-3000:]}")
    dumps: dict[str, tuple[str, float]] = {}
    for dump in tmp.glob("callgrind.stages.out.*"):
        text = dump.read_text(errors="replace")
        match = re.search(r"^desc: Trigger: .*?(\d\d) (.*)$", text, re.M)  # not warm-ups
        if match:
            dumps[match.group(1)] = (match.group(2).strip(), _total(dump) / loops)
    results = [dumps[key] for key in sorted(dumps)]
    if not results:
        raise RuntimeError("no stage dumps")
    # The first dump is the empty loop: the constant of the loop and of asking for the dump.
    base = results[0][1]
    rows = [(name, value - base) for name, value in results[1:]]
    for name, value in rows:
        print(f"{name:60s} {value:>10,.0f}", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default=".", help="the servekit checkout to measure")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--loops", type=int, default=2000)
    parser.add_argument("--only", choices=["servers", "stages"], default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import uvloop

        uvloop.run(_child(args.loops, "stages"))
        return 0
    tree = Path(args.tree).resolve()
    with tempfile.TemporaryDirectory(prefix="servekit-stages-") as tmp:
        if args.only != "stages":
            print("instructions per request, whole servers", flush=True)
            whole_servers(tree, args.requests, Path(tmp))
        if args.only != "servers":
            print("instructions per call, stages in one process", flush=True)
            in_process(tree, args.loops, Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
