"""The scaling gauges under ``--workers 2`` (issue 41), exact request by request: a gated model
(one instance per worker) holds every request until the test releases it. Each request that an
instance has started leaves a marker file named with its worker's pid; so at every step the
test knows, from its own count and the markers, how many requests are held (sent minus
released), how many have started (the markers not yet released: one per worker that has
requests) and how many wait in a queue (the rest). Released one at a time, the gauges read
through either worker (``servekit_pending_requests``, ``servekit_inflight_requests``) match
that arithmetic exactly at every step, and return to zero."""

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
import os
import time
import uuid
from pathlib import Path

HERE = Path(__file__).parent


def gate(x):
    me = HERE / f"started-{os.getpid()}-{uuid.uuid4().hex}"
    me.touch()
    release = HERE / me.name.replace("started-", "release-")
    deadline = time.monotonic() + 60
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    me.unlink()
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
        held, workers_seen = REQUESTS, set()

        def started() -> list[Path]:
            return sorted(tmp_path.glob("started-*"))

        def settled(held: int) -> bool:
            # Each worker with requests has one started (a marker appears just after the
            # instance takes a request: wait for both to agree), the rest wait in queues.
            running = started()
            expected = (held - len(running), len(running))
            return bool(running) and all(_gauges(url) == expected for _ in range(3))

        while held:
            wait_until(lambda: settled(held), WAIT, f"the gauges at {held} held requests")  # noqa: B023
            running = started()
            pids = {p.name.split("-")[1] for p in running}
            assert len(pids) == len(running) <= 2  # one instance per worker
            workers_seen |= pids
            first = running[0]
            (tmp_path / first.name.replace("started-", "release-")).touch()
            held -= 1
            wait_until(lambda: len(answers) == REQUESTS - held, WAIT, "the released answer")  # noqa: B023
        for thread in threads:
            thread.join(WAIT)
        assert answers == [200] * REQUESTS
        wait_until(lambda: _gauges(url) == (0, 0), WAIT, "the gauges back at zero")
        print(f"exact at each of {REQUESTS} steps; workers that computed: {len(workers_seen)}")
