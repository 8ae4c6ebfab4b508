"""Model warm-up (serve.yaml ``warmup:``), end to end: a model is not READY until its warm-up
samples ran, a failing warm-up leaves it UNAVAILABLE with the reason, the time shows in the log
and /metrics, and a reload is warm before it serves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import onnx_builders
import pytest
from servers import ServerProcess, running_server, start_server
from waits import wait_until

pytestmark = pytest.mark.slow

MODELS = '''
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def gated(x: np.ndarray) -> dict[str, np.ndarray]:
    """Records each call's shape; waits (bounded) for the test's gate file before answering."""
    with (HERE / "calls.log").open("a") as log:
        log.write(f"{list(x.shape)} {float(x.sum())}\\n")
    deadline = time.monotonic() + 60
    while not (HERE / "gate").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return {"y": x * 2}


def picky(x: np.ndarray) -> dict[str, np.ndarray]:
    if not x.any():
        raise ValueError("zeros are not welcome here")
    return {"y": x}
'''

TENSORS = """    inputs: [{name: x, datatype: FP32, shape: [-1, 3]}]
    outputs: [{name: y, datatype: FP32, shape: [-1, 3]}]
"""

CONFIG = (
    """server: {strictReadiness: true}
models:
  - name: gated
    modelFormat: {name: python}
    entrypoint: 'user_models:gated'
    maxBatchSize: 8
"""
    + TENSORS
    + """    warmup:
      - name: ones
        batchSize: 4
        count: 2
        inputs: {x: {dataType: TYPE_FP32, dims: [3], inputDataFile: ones.bin}}
  - name: ident
    modelFormat: {name: onnx}
    storageUri: ident.onnx
    warmup:
      - {name: zeros, inputs: {INPUT0: {dataType: FP32, dims: [2, 2], zeroData: true}}}
"""
)

FAILING = (
    """server: {strictReadiness: false}
models:
  - name: picky
    modelFormat: {name: python}
    entrypoint: 'user_models:picky'
    maxBatchSize: 8
"""
    + TENSORS
    + """    warmup:
      - {name: blank, batchSize: 2, inputs: {x: {dataType: FP32, dims: [3], zeroData: true}}}
"""
)


def folder(root: Path, config: str) -> Path:
    (root / "user_models.py").write_text(MODELS)
    np.ones(3, dtype="<f4").tofile(root / "ones.bin")
    onnx.save(onnx_builders.identity("FP32"), str(root / "ident.onnx"))
    (root / "serve.yaml").write_text(config)
    return root / "serve.yaml"


def index(server: ServerProcess) -> dict[str, dict[str, Any]]:
    with server.http_client(timeout=10) as http:
        rows = http.post("/v2/repository/index", json={}).json()
    return {row["name"]: row for row in rows}


def calls(root: Path) -> list[str]:
    path = root / "calls.log"
    return path.read_text().splitlines() if path.exists() else []


def test_not_ready_until_warm_then_ready_with_the_time_shown(tmp_path: Path) -> None:
    config = folder(tmp_path, CONFIG)
    server = start_server(config, grpc=False, wait_ready=False)
    try:
        wait_until(lambda: calls(tmp_path), what="the warm-up's first call")
        with server.http_client(timeout=10) as http:
            # warming: the model is not ready, nor the server (strict readiness)
            assert index(server)["gated"]["state"] == "LOADING"
            assert http.get("/v2/models/gated/ready").status_code != 200
            assert http.get("/v2/health/ready").status_code != 200
            (tmp_path / "gate").touch()
            wait_until(lambda: http.get("/v2/health/ready").status_code == 200, what="readiness")
            assert index(server)["gated"]["state"] == "READY"
            # the sample ran count times, batchSize rows of the file's values
            assert calls(tmp_path) == ["[4, 3] 12.0", "[4, 3] 12.0"]
            metrics = http.get("/metrics").text
            assert 'servekit_model_warmup_seconds{model="gated",version="1"}' in metrics
            assert 'servekit_model_warmup_seconds{model="ident",version="1"}' in metrics
            # the dashboard's model page: a Warm-up block with the samples and the time
            detail = http.get("/dashboard/api/models/gated").json()["warmup"]
            assert detail["samples"] == [{"name": "ones", "batch_size": 4, "count": 2}]
            (shown,) = detail["versions"]
            assert shown["version"] == "1" and shown["ms"] > 0
            page = http.get("/models/gated").text
            assert 'id="warmup"' in page and "<code>ones</code> (4 rows, 2 times)" in page
            answer = http.post(
                "/v2/models/gated/infer",
                json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3],
                                  "data": [1, 2, 3]}]},
            )  # fmt: skip
            assert answer.status_code == 200, answer.text
    finally:
        server.stop()
    log = server.log()
    assert "loaded gated version 1, warmed up in" in log and "(2 call(s))" in log
    assert "loaded ident version 1, warmed up in" in log


def test_a_failing_warmup_leaves_the_model_unavailable_with_the_reason(tmp_path: Path) -> None:
    with running_server(folder(tmp_path, FAILING), grpc=False) as server:
        row = index(server)["picky"]
        assert row["state"] == "UNAVAILABLE"
        assert "warm-up sample 'blank' failed" in row["reason"]
        assert "zeros are not welcome here" in row["reason"]
        answer = httpx.post(
            f"{server.http_url}/v2/models/picky/infer",
            json={
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]
            },
        )
        assert answer.status_code in (400, 503) and "error" in answer.json()
