"""The scaling gauges under ``--workers 2`` (issue 41): requests held by a gated model in two
worker processes add up, whichever worker answers the scrape, to exactly the requests sent:
each queued (``servekit_pending_requests``) or taken by an instance
(``servekit_inflight_requests``, at most one per worker here); all return to zero once
answered."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from servers import running_server
from waits import wait_until

pytestmark = pytest.mark.slow  # a real server process with two workers

MODEL = """\
import time
from pathlib import Path

GATE = Path(__file__).with_name("open")


def gate(x):
    deadline = time.monotonic() + 60
    while not GATE.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return x
"""
REQUESTS = 7
WAIT = 60.0
BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}]}


def _gauges(url: str) -> tuple[float, float]:
    """(pending, inflight) of ``gate`` version 1, read from /metrics on a new connection (the
    kernel hands it to either worker)."""
    text = httpx.get(f"{url}/metrics", timeout=10, headers={"Connection": "close"}).text
    found = {"servekit_pending_requests": 0.0, "servekit_inflight_requests": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in found and sample.labels == {"model": "gate", "version": "1"}:
                found[sample.name] = sample.value
    return found["servekit_pending_requests"], found["servekit_inflight_requests"]


def test_gauges_add_up_over_two_workers(tmp_path: Path) -> None:
    (tmp_path / "gated.py").write_text(MODEL)
    config = tmp_path / "serve.yaml"
    config.write_text(
        "models:\n  - name: gate\n    modelFormat: {name: python}\n"
        "    entrypoint: gated:gate\n    instances: 1\n"
        "    inputs: [{name: x, datatype: FP32, shape: [-1]}]\n"
        "    outputs: [{name: x, datatype: FP32, shape: [-1]}]\n"
    )
    answers: list[int] = []
    with running_server(config, grpc=False, extra=["--workers", "2"]) as server:
        url = server.http_url
        assert _gauges(url) == (0, 0)

        def send() -> None:
            with httpx.Client(timeout=WAIT) as client:
                answers.append(client.post(f"{url}/v2/models/gate/infer", json=BODY).status_code)

        threads = [threading.Thread(target=send, daemon=True) for _ in range(REQUESTS)]
        for thread in threads:
            thread.start()
        wait_until(lambda: sum(_gauges(url)) == REQUESTS, WAIT, "every request held")
        for _ in range(6):  # every scrape, whichever worker answers it, says the same
            pending, inflight = _gauges(url)
            assert pending + inflight == REQUESTS
            assert 1 <= inflight <= 2  # one instance per worker, busy only if it has requests
        (tmp_path / "open").touch()
        for thread in threads:
            thread.join(WAIT)
        assert answers == [200] * REQUESTS
        wait_until(lambda: _gauges(url) == (0, 0), WAIT, "the gauges back at zero")
