"""A 100-tree RandomForest over REST JSON: servekit native, servekit ``convert: onnx``, MLServer.

    python bench/tabular.py [--duration 5] [--write docs/performance.md]

issue 24's measurement: one scikit-learn ``RandomForestClassifier(n_estimators=100)`` fitted
here (2,000 rows of 10 features, full-depth trees) and saved with joblib, served three ways in
the same run, each server pinned to CPU 0 and driven from CPU 1 at 1 and 16 requests in flight
(one row per request, ``predict`` answered):

- **servekit native**: ``modelFormat: sklearn`` (scikit-learn's ``predict`` in a worker thread);
- **servekit convert: onnx**: the same file with ``convert: onnx`` (ONNX Runtime);
- **MLServer 1.7.1**: its scikit-learn runtime (``mlserver-sklearn``, the runtime KServe runs
  for sklearn models), ``parallel_workers: 0`` (inference in the server's process: on one CPU a
  worker process only adds a hop);
- **do-nothing ASGI** (bench/noop_asgi.py on uvicorn): the ceiling of any Python server here.

MLServer's sklearn runtime is installed by this script into a virtualenv of its own
(``bench/.venvs/mlserver-sklearn``, ``--system-site-packages`` so that it runs the same
scikit-learn and MLServer 1.7.1 as the rest), never by a test. The same JSON body goes to every
server, and every answer is checked against the estimator's own prediction first.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from pipeline import drive, wait_ready  # noqa: E402
from procs import Server, load_average  # noqa: E402
from report import machine, write_section  # noqa: E402

SERVER_CPU, CLIENT_CPU = "0", "1"
START, END = "<!-- tabular:start -->", "<!-- tabular:end -->"
VENV = HERE / ".venvs" / "mlserver-sklearn"
MLSERVER_SKLEARN = "mlserver-sklearn==1.7.1"
FEATURES = 10


def fit(folder: Path) -> tuple[Path, Any, Any]:
    """The forest as ``folder/model.joblib``; returns the path, the forest and one row."""
    import joblib
    import numpy as np
    from sklearn.ensemble import RandomForestClassifier

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, FEATURES))
    y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype(int)
    forest = RandomForestClassifier(n_estimators=100, random_state=0).fit(x, y)
    path = folder / "model.joblib"
    joblib.dump(forest, path)
    return path, forest, x[:1]


def body(row: Any) -> bytes:
    tensor = {"name": "input-0", "datatype": "FP64", "shape": [1, FEATURES],
              "data": row.ravel().tolist()}  # fmt: skip
    return json.dumps({"inputs": [tensor]}).encode()


def infer(model: str, payload: bytes) -> Any:
    def call(conn: http.client.HTTPConnection) -> Any:
        conn.request("POST", f"/v2/models/{model}/infer", payload,
                     {"Content-Type": "application/json"})  # fmt: skip
        response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"{model}: {response.status} {data[:300]!r}")
        answer = json.loads(data)
        return answer["outputs"][0]["data"] if "outputs" in answer else answer

    return call


def ensure_venv() -> Path:
    """MLServer's sklearn runtime in a venv of its own (built once)."""
    python = VENV / "bin" / "python"
    marker = VENV / ".complete"
    if marker.is_file() and marker.read_text() == MLSERVER_SKLEARN:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(VENV)], check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    MLSERVER_SKLEARN], check=True, env=env)  # fmt: skip
    marker.write_text(MLSERVER_SKLEARN)
    return python


def free_port() -> int:
    """A port for MLServer, which takes fixed ports only (bench code: the race is harmless)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def mlserver(python: Path, folder: Path, model: Path) -> Server:
    http_port = free_port()
    settings = {"host": "127.0.0.1", "http_port": http_port, "grpc_port": free_port(),
                "metrics_port": free_port(), "parallel_workers": 0,
                "debug": False}  # fmt: skip
    (folder / "settings.json").write_text(json.dumps(settings))
    (folder / "rf").mkdir()
    (folder / "rf" / "model-settings.json").write_text(json.dumps({
        "name": "rf", "implementation": "mlserver_sklearn.SKLearnModel",
        "parameters": {"uri": str(model)},
    }))  # fmt: skip
    env_path = os.environ.pop("PYTHONPATH", None)
    try:
        return Server([str(python), "-m", "mlserver.cli.main", "start", str(folder)], SERVER_CPU,
                      r"Uvicorn running on http://127\.0\.0\.1:(\d+)", cwd=folder)  # fmt: skip
    finally:
        if env_path is not None:
            os.environ["PYTHONPATH"] = env_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--write", type=Path, help="write the table into this markdown file")
    args = parser.parse_args()
    python = ensure_venv()
    os.sched_setaffinity(0, {int(CLIENT_CPU)})
    before = load_average()
    results: dict[tuple[str, int], dict[str, float]] = {}
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        model, forest, row = fit(folder)
        want = forest.predict(row).tolist()
        payload = body(row)
        (folder / "serve.yaml").write_text(
            "models:\n"
            f"  - {{name: rf, modelFormat: {{name: sklearn}}, storageUri: {model}}}\n"
            f"  - {{name: rf-onnx, modelFormat: {{name: sklearn}}, storageUri: {model},\n"
            "     convert: onnx}\n"
        )
        os.environ["PYTHONPATH"] = str(ROOT / "app")  # this checkout's servekit
        argv = [sys.executable, "-m", "servekit", "serve", str(folder / "serve.yaml"),
                "--http-port", "0", "--grpc-port", "0", "--host", "127.0.0.1",
                "--log-level", "warning"]  # fmt: skip
        servers: dict[str, tuple[Server, str]] = {}
        server = Server(argv, SERVER_CPU, r"listening http://127\.0\.0\.1:(\d+)", cwd=ROOT)
        servers["servekit native"] = (server, "rf")
        servers["servekit convert: onnx"] = (server, "rf-onnx")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
            wait_ready(conn)
            conn.request("GET", "/v2/repository/index")
            notes.append(conn.getresponse().read().decode())
            for way in ("servekit native", "servekit convert: onnx"):
                check(way, infer(servers[way][1], payload)(conn), want)
            conn.close()
            for c in (1, 16):
                for way in ("servekit native", "servekit convert: onnx"):
                    results[(way, c)] = drive(server.port, infer(servers[way][1], payload), c,
                                              args.duration)  # fmt: skip
        finally:
            server.stop()
        ml_folder = folder / "mlserver"
        ml_folder.mkdir()
        ml = mlserver(python, ml_folder, model)
        try:
            conn = http.client.HTTPConnection("127.0.0.1", ml.port, timeout=60)
            wait_ready(conn)
            check("MLServer", infer("rf", payload)(conn), want)
            conn.close()
            for c in (1, 16):
                results[("MLServer 1.7.1 sklearn", c)] = drive(ml.port, infer("rf", payload), c,
                                                              args.duration)  # fmt: skip
        finally:
            ml.stop()
        noop = Server([sys.executable, str(HERE / "noop_asgi.py"), "--server", "uvicorn"],
                      SERVER_CPU, r"listening (\d+)")  # fmt: skip
        try:
            for c in (1, 16):
                results[("do-nothing ASGI (uvicorn)", c)] = drive(
                    noop.port, infer("x", payload), c, args.duration
                )
        finally:
            noop.stop()
    section = render(results, before, load_average(), args.duration)
    print(section)
    print("\n".join(notes), file=sys.stderr)
    if args.write:
        write_section(args.write, section, START, END)


def check(way: str, got: Any, want: list[int]) -> None:
    if list(got) != want:
        raise SystemExit(f"{way} answers {got}, the estimator {want}")


WAYS = (
    "servekit native",
    "servekit convert: onnx",
    "MLServer 1.7.1 sklearn",
    "do-nothing ASGI (uvicorn)",
)


def render(
    results: dict[tuple[str, int], dict[str, float]], before: str, after: str, seconds: float
) -> str:
    lines = [
        START,
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}; load average {before} before, "
        f"{after} after.",
        f"`python bench/tabular.py --duration {seconds:g}`",
        "",
        "| server | in flight | requests/s | p50 | x MLServer | x servekit native |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for c in (1, 16):
        mlserver_rps = results[("MLServer 1.7.1 sklearn", c)]["rps"]
        native_rps = results[("servekit native", c)]["rps"]
        for way in WAYS:
            cell = results[(way, c)]
            lines.append(
                f"| {way} | {c} | {cell['rps']:,.0f} | {cell['p50_ms']:.2f} ms | "
                f"{cell['rps'] / mlserver_rps:.2f} | {cell['rps'] / native_rps:.2f} |"
            )
    lines += ["", END]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
