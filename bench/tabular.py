"""MLServer's sklearn example served by servekit and by MLServer 1.7.1, in the same run.

    python bench/tabular.py [--duration 5] [--repeat 3] [--write docs/performance.md]

Issue 39's measurement. The folder is MLServer's own example (SeldonIO/MLServer
``docs/examples/sklearn``: ``settings.json``, ``model-settings.json`` naming
``mlserver_sklearn.SKLearnModel`` and ``./mnist-svm.joblib``), its model trained here as the
example trains it: ``svm.SVC(gamma=0.001)`` on the first half of scikit-learn's bundled 8x8
digits (``load_digits``, nothing downloaded). The same folder is served by:

- **servekit** (``servekit serve FOLDER``): its scikit-learn runtime, with the default batching
  of row-wise models (app/servekit/services/execution/jobs.py);
- **MLServer 1.7.1** (``mlserver start FOLDER``, the test extra), ``MLSERVER_PARALLEL_WORKERS=0``
  (inference in the server's process: on one core a worker process only adds a hop);

and the same ``.joblib`` by servekit from a serve.yaml with ``maxBatchSize`` and no
``dynamicBatching`` (unbatched: one request per call) and with ``convert: onnx``. Each server
is pinned to CPU 0 and driven from CPU 1 by ``wrk`` (``bench/wrk/post.lua``) with the README's
request (one FP32 row of 64 named ``predict``, REST JSON) at 1 and 16 connections, rounds
interleaved; every server's answer is checked against the estimator's own first. ``x MLServer``
is each round's ratio to MLServer's requests/s in the same round; ``x MLServer CPU``: MLServer's
server CPU time per request over the row's (medians), which the neighbours' load moves less.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from procs import Server, load_average  # noqa: E402
from report import machine, write_section  # noqa: E402
from run import SERVER_CPU, measure, run_wrk, wait_ready  # noqa: E402

START, END = "<!-- tabular:start -->", "<!-- tabular:end -->"
MODEL = "mnist-svm"
VERSION = "v0.1.0"
SERVEKIT = "servekit"
OFF = "servekit, unbatched"
ONNX = "servekit, onnx"
MLSERVER = "MLServer"
WAYS = (SERVEKIT, OFF, ONNX, MLSERVER)
CONNECTIONS = (1, 16)


def example(folder: Path) -> Any:
    """MLServer's sklearn example in ``folder``; returns the estimator and the README's row."""
    import joblib
    from sklearn import datasets, svm

    digits = datasets.load_digits()
    x = digits.images.reshape(len(digits.images), -1)
    half = len(x) // 2
    classifier = svm.SVC(gamma=0.001).fit(x[:half], digits.target[:half])
    joblib.dump(classifier, folder / "mnist-svm.joblib")
    (folder / "settings.json").write_text(json.dumps({"debug": "true"}, indent=4))
    settings = {"name": MODEL, "implementation": "mlserver_sklearn.SKLearnModel",
                "parameters": {"uri": "./mnist-svm.joblib", "version": VERSION}}  # fmt: skip
    (folder / "model-settings.json").write_text(json.dumps(settings, indent=4))
    return classifier, x[half : half + 1]


def free_port() -> int:
    """A port for MLServer, which takes fixed ports only (bench code: the race is harmless)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def start_mlserver(folder: Path) -> Server:
    http = free_port()
    os.environ.update(MLSERVER_HTTP_PORT=str(http), MLSERVER_GRPC_PORT=str(free_port()),
                      MLSERVER_METRICS_PORT=str(free_port()), MLSERVER_HOST="127.0.0.1",
                      MLSERVER_PARALLEL_WORKERS="0")  # fmt: skip
    argv = [sys.executable, "-c", "from mlserver.cli import main; main()", "start", "."]
    return Server(argv, SERVER_CPU, rf"Uvicorn running on http://127\.0\.0\.1:({http})", folder)


def start_servekit(target: Path) -> Server:
    argv = [sys.executable, "-m", "servekit", "serve", str(target), "--http-port", "0",
            "--no-grpc", "--host", "127.0.0.1", "--log-level", "warning"]  # fmt: skip
    return Server(argv, SERVER_CPU, r"listening http://127\.0\.0\.1:(\d+)", ROOT)


def answer(url: str, body: bytes) -> list[Any]:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        data: list[Any] = json.loads(reply.read())["outputs"][0]["data"]
        return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--write", type=Path, help="write the table into this markdown file")
    args = parser.parse_args()
    if importlib.util.find_spec("mlserver_sklearn") is None:
        raise SystemExit("bench: MLServer's sklearn runtime is missing: pip install -e '.[test]'")
    before = load_average()
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    servers: dict[str, tuple[Server, str]] = {}
    os.environ["PYTHONPATH"] = str(ROOT / "app")  # this checkout's servekit
    with tempfile.TemporaryDirectory(prefix="servekit-tabular-") as scratch:
        folder = Path(scratch) / "sklearn"
        folder.mkdir()
        classifier, row = example(folder)
        want = classifier.predict(row).tolist()
        tensor = {"name": "predict", "shape": [1, 64], "datatype": "FP32",
                  "data": row.astype("float32").tolist()}  # fmt: skip
        body = Path(scratch) / "body.json"
        body.write_bytes(json.dumps({"inputs": [tensor]}).encode())
        yaml = Path(scratch) / "serve.yaml"
        joblib_file = folder / "mnist-svm.joblib"
        yaml = Path(scratch) / "serve.yaml"
        yaml.write_text(
            "models:\n"
            f"  - {{name: mnist-svm-off, modelFormat: {{name: sklearn}},\n"
            f"     storageUri: {joblib_file}, maxBatchSize: 64}}\n"
            f"  - {{name: mnist-svm-onnx, modelFormat: {{name: sklearn}},\n"
            f"     storageUri: {joblib_file}, convert: onnx}}\n"
        )
        try:
            mine = start_servekit(folder)
            path = f"/v2/models/{MODEL}/versions/{VERSION}/infer"
            servers[SERVEKIT] = (mine, f"http://127.0.0.1:{mine.port}{path}")
            other = start_servekit(yaml)
            base = f"http://127.0.0.1:{other.port}"
            servers[OFF] = (other, f"{base}/v2/models/mnist-svm-off/infer")
            servers[ONNX] = (other, f"{base}/v2/models/mnist-svm-onnx/infer")
            theirs = start_mlserver(folder)
            servers[MLSERVER] = (theirs, f"http://127.0.0.1:{theirs.port}{path}")
            for way, (_, url) in servers.items():
                wait_ready(url.split("/v2/")[0] + "/v2/health/ready")
                got = answer(url, body.read_bytes())
                if got != want:
                    raise SystemExit(f"{way} answers {got}, the estimator {want}")
                run_wrk(url, body, None, 16, 1.0)  # warm-up
            for round_no in range(1, args.repeat + 1):
                print(f"round {round_no}/{args.repeat} (load average {load_average()})", flush=True)
                for c in CONNECTIONS:
                    for way, (server, url) in servers.items():
                        result = measure(server, url, body, None, c, args.duration)
                        runs.setdefault((way, c), []).append(result)
                        print(f"  {way:26s} c={c:<3d} {result['rps']:8.0f} req/s", flush=True)
        finally:
            for server, _ in servers.values():
                server.stop()
    section = render(runs, before, load_average(), args)
    print(section)
    if args.write:
        write_section(args.write, section, START, END)


def render(
    runs: dict[tuple[str, int], list[dict[str, Any]]],
    before: str,
    after: str,
    args: argparse.Namespace,
) -> str:
    lines = [
        START,
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}; load average {before} before, "
        f"{after} after; `python bench/tabular.py --duration {args.duration:g} --repeat "
        f"{args.repeat}`, medians of {args.repeat} rounds [range].",
        "",
        "| server | conns | requests/s | x MLServer | CPU us/req | x MLServer CPU |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for c in CONNECTIONS:
        theirs = runs[(MLSERVER, c)]
        their_cpu = statistics.median(r["cpu_us_per_request"] or 0 for r in theirs)
        for way in WAYS:
            cell = runs[(way, c)]
            rps = statistics.median(r["rps"] for r in cell)
            cpu = statistics.median(r["cpu_us_per_request"] or 0 for r in cell)
            if way == MLSERVER:
                lines.append(f"| {way} | {c} | {rps:,.0f} | - | {cpu:.0f} | - |")
                continue
            ratios = [r["rps"] / other["rps"] for r, other in zip(cell, theirs, strict=True)]
            lines.append(
                f"| {way} | {c} | {rps:,.0f} | {statistics.median(ratios):.2f} "
                f"[{min(ratios):.2f}-{max(ratios):.2f}] | {cpu:.0f} | "
                f"{their_cpu / cpu if cpu else 0:.2f} |"
            )
    lines += ["", END]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
