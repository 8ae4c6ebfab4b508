"""Metrics a Python model defines (app/servekit/observability/custom_metrics.py) appear in a real
server's /metrics with the model's name and version, and move as the model runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from servers import running_server, start_server
from waits import wait_until

pytestmark = pytest.mark.slow

MODEL = """
import numpy as np

from servekit.custom_metrics import counter, gauge, histogram


class Scaler:
    def load(self):
        self.calls = counter("scaler_calls", "Calls of the scaler")
        self.last = gauge("scaler_last_sum", "Sum of the last input")
        self.sizes = histogram("scaler_rows", "Rows per call", [1, 2, 4])

    def predict(self, x: np.ndarray) -> dict[str, np.ndarray]:
        self.calls.inc()
        self.last.set(float(x.sum()))
        self.sizes.observe(x.shape[0])
        return {"y": x * 2}
"""

CONFIG = """\
models:
  - name: scaler
    modelFormat: {name: python}
    entrypoint: 'user_model:Scaler'
    maxBatchSize: 8
    inputs: [{name: x, datatype: FP32, shape: [-1, 2]}]
    outputs: [{name: y, datatype: FP32, shape: [-1, 2]}]
"""


def test_a_models_own_metrics_are_in_metrics_with_its_labels(tmp_path: Path) -> None:
    (tmp_path / "user_model.py").write_text(MODEL)
    (tmp_path / "serve.yaml").write_text(CONFIG)
    with (
        running_server(tmp_path / "serve.yaml", grpc=False) as server,
        server.http_client(timeout=20) as http,
    ):
        for rows in ([[1, 2]], [[1, 2], [3, 4], [5, 6]]):
            body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [len(rows), 2],
                                    "data": rows}]}  # fmt: skip
            assert http.post("/v2/models/scaler/infer", json=body).status_code == 200
        text = http.get("/metrics").text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    labels = (("model", "scaler"), ("version", "1"))
    assert samples[("scaler_calls_total", labels)] == 2
    assert samples[("scaler_last_sum", labels)] == 21
    assert samples[("scaler_rows_count", labels)] == 2
    assert samples[("scaler_rows_sum", labels)] == 4
    assert samples[("scaler_rows_bucket", (("le", "1.0"), *labels))] == 1
    assert samples[("scaler_rows_bucket", (("le", "2.0"), *labels))] == 1
    assert samples[("scaler_rows_bucket", (("le", "4.0"), *labels))] == 2


def test_under_two_workers_metrics_show_every_workers_share(tmp_path: Path) -> None:
    """Whichever worker answers the scrape, counters and histograms are the sums over both
    workers and gauges one value per worker (labelled ``worker``)."""
    (tmp_path / "user_model.py").write_text(MODEL)
    (tmp_path / "serve.yaml").write_text(CONFIG)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [[1, 2]]}]}
    server = start_server(tmp_path / "serve.yaml", grpc=False, extra=["--workers", "2"],
                          timeout=120)  # fmt: skip
    try:
        sent = 0

        def both_served() -> bool:
            nonlocal sent
            with server.http_client(timeout=20) as http:  # a new connection: spread by the kernel
                assert http.post("/v2/models/scaler/infer", json=body).status_code == 200
                sent += 1
                rows = http.get("/servekit/v1/workers").json()["workers"]
            return all(row["inferenceSuccess"] > 0 for row in rows)

        wait_until(both_served, timeout=60, what="requests answered by both workers")
        for _ in range(4):  # several scrapes, on new connections: each worker answers some
            with server.http_client(timeout=20) as http:
                samples = _samples(http.get("/metrics").text)
            labels = (("model", "scaler"), ("version", "1"))
            assert samples[("scaler_calls_total", labels)] == sent
            assert samples[("scaler_rows_count", labels)] == sent
            assert samples[("scaler_rows_bucket", (("le", "1.0"), *labels))] == sent
            gauges = {k: v for k, v in samples.items() if k[0] == "scaler_last_sum"}
            assert set(gauges) == {
                ("scaler_last_sum", (*labels, ("worker", "0"))),
                ("scaler_last_sum", (*labels, ("worker", "1"))),
            }
            assert set(gauges.values()) == {3.0}
    finally:
        server.stop()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
