"""A server process of its own collects its young generation less often
(app/servekit/gc_tuning.py); the process the server was started from keeps Python's setting.

Asked of the server itself: a Python model reports the threshold of the process it runs in,
answered over HTTP by ``servekit serve`` (one process, and each of ``--workers 2``)."""

from __future__ import annotations

import gc
from pathlib import Path

import httpx
import pytest
from servers import running_server

from servekit import gc_tuning

THRESHOLD_MODEL = """
import gc
import numpy as np
from numpy.typing import NDArray


def predict(x: NDArray[np.float32]) -> NDArray[np.int64]:
    return np.full(x.shape[0], gc.get_threshold()[0], dtype=np.int64)
"""


def _served_threshold(folder: Path, *extra: str) -> set[int]:
    (folder / "threshold_model.py").write_text(THRESHOLD_MODEL)
    config = folder / "serve.yaml"
    config.write_text(
        "models:\n"
        "  - {name: gc, modelFormat: {name: python}, entrypoint: 'threshold_model:predict'}\n"
    )
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [0.0]}]}
    seen: set[int] = set()
    with running_server(config, grpc=False, extra=extra) as server:
        for _ in range(8):  # a connection each (with workers: the kernel spreads them)
            with httpx.Client(base_url=server.http_url, timeout=30) as client:
                reply = client.post("/v2/models/gc/infer", json=body)
            assert reply.status_code == 200, reply.text
            seen.add(int(reply.json()["outputs"][0]["data"][0]))
    return seen


def test_tune_sets_the_young_threshold_alone() -> None:
    before = gc.get_threshold()
    try:
        gc_tuning.tune()
        assert gc.get_threshold() == (gc_tuning.YOUNG_THRESHOLD, *before[1:])
    finally:
        gc.set_threshold(*before)


@pytest.mark.slow
def test_servekit_serve_runs_its_models_with_the_tuned_garbage_collector(tmp_path: Path) -> None:
    assert _served_threshold(tmp_path) == {gc_tuning.YOUNG_THRESHOLD}


@pytest.mark.slow
def test_each_worker_process_runs_with_the_tuned_garbage_collector(tmp_path: Path) -> None:
    assert _served_threshold(tmp_path, "--workers", "2") == {gc_tuning.YOUNG_THRESHOLD}
