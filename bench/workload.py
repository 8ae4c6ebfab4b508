"""The benchmark's model, serve.yaml and request bodies, and a check that the server answers them.

Bodies are what real clients send: plain V2 JSON (as curl or ``tritonclient.http`` with
``binary_data=False``), Triton's binary tensor extension (as ``tritonclient.http`` with
``binary_data=True`` for the input and the output), and the raw binary request (header length 0).
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx_builders import mlp

SERVE_YAML = """\
models:
  - name: mlp
    modelFormat: {name: onnx}
    storageUri: ./mlp.onnx
"""


@dataclass
class Workload:
    config: Path
    input_npy: Path
    x: np.ndarray
    bodies: dict[str, tuple[Path, int | None]] = field(default_factory=dict)
    """name -> (body file, Inference-Header-Content-Length or None for JSON)."""


def make_workload(directory: Path) -> Workload:
    """Write the MLP, its serve.yaml, the input and every request body into ``directory``."""
    onnx.save(mlp(16, 64, 4), directory / "mlp.onnx")
    config = directory / "serve.yaml"
    config.write_text(SERVE_YAML)
    x = np.random.default_rng(1).standard_normal((1, 16)).astype(np.float32)
    np.save(directory / "input.npy", x)
    workload = Workload(config, directory / "input.npy", x)

    json_body = {"inputs": [_input(x, {})]}
    workload.bodies["REST JSON"] = (_write(directory / "json.body", json.dumps(json_body)), None)

    header = json.dumps(
        {
            "inputs": [_input(x, {"binary_data_size": x.nbytes}, data=False)],
            "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
        }
    ).encode()
    binary = _write(directory / "binary.body", header + x.tobytes())
    workload.bodies["REST binary"] = (binary, len(header))
    workload.bodies["REST raw binary"] = (_write(directory / "raw.body", x.tobytes()), 0)
    return workload


def _input(x: np.ndarray, parameters: dict[str, object], data: bool = True) -> dict[str, object]:
    entry: dict[str, object] = {"name": "input", "shape": list(x.shape), "datatype": "FP32"}
    if parameters:
        entry["parameters"] = parameters
    if data:
        entry["data"] = x.reshape(-1).tolist()
    return entry


def _write(path: Path, content: str | bytes) -> Path:
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def check_bodies(base_url: str, workload: Workload, expected: list[float]) -> None:
    """POST every body once; the server must answer 200 with raw onnxruntime's output."""
    for name, (path, header_length) in workload.bodies.items():
        headers = {"Content-Type": "application/json"}
        if header_length is not None:
            headers = {
                "Content-Type": "application/octet-stream",
                "Inference-Header-Content-Length": str(header_length),
            }
        request = urllib.request.Request(
            f"{base_url}/v2/models/mlp/infer", data=path.read_bytes(), headers=headers
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            body = reply.read()
            json_length = reply.headers.get("Inference-Header-Content-Length")
        if json_length is None:
            got = json.loads(body)["outputs"][0]["data"]
        else:
            got = np.frombuffer(body[int(json_length) :], dtype="<f4").tolist()
        if not np.allclose(got, expected, rtol=1e-5, atol=1e-6):
            raise RuntimeError(f"{name}: server answered {got}, onnxruntime {expected}")
