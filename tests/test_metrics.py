"""/metrics: Prometheus exposition read from the same statistics the V2 APIs report."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from servers import ServerProcess

pytestmark = pytest.mark.slow


def _samples(server: ServerProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = httpx.get(f"{server.http_url}/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_counts_grow_with_inferences_and_states_are_exposed(server: ServerProcess) -> None:
    key = ("servekit_inference_success_total", (("model", "mlp"), ("version", "1")))
    before = _samples(server).get(key, 0.0)
    client = httpclient.InferenceServerClient(server.http_host_port)
    tensor = httpclient.InferInput("input", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 16), np.float32))
    for _ in range(3):
        client.infer("mlp", [tensor], model_version="1")
    client.close()
    after = _samples(server)
    assert after[key] == before + 3
    ready = ("servekit_model_state", (("model", "mlp"), ("state", "READY"), ("version", "1")))
    assert after[ready] == 1.0
    broken = (
        "servekit_model_state",
        (("model", "broken_lfs"), ("state", "UNAVAILABLE"), ("version", "1")),
    )
    assert after[broken] == 1.0
