"""Metrics a Python model defines (app/servekit/custom_metrics.py) appear in a real server's
/metrics with the model's name and version, and move as the model runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from servers import running_server

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
