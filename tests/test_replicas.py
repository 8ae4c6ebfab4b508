"""Replicas, in process (issue 41): the scaling gauges ``servekit_pending_requests`` (queued,
not started) and ``servekit_inflight_requests`` (started, not answered) per model and version
move while requests wait on a slow model and return to zero once they are answered; the
control routes say they change one replica."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from servekit.config.compiler import compile_plan
from servekit.config.loader import parse_config
from servekit.observability.metrics import render as render_metrics
from servekit.runtimes.python import register_object
from servekit.server import ServeKit
from servekit.services import make_registry
from servekit.types import InferRequest, Tensor

WAIT = 10.0


def _gauges(kit: ServeKit) -> dict[tuple[str, str], float]:
    """(metric, version) -> value of the two gauges for the model ``gate``."""
    text = render_metrics(make_registry(kit.catalog)).decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("servekit_pending_requests", "servekit_inflight_requests"):
                assert sample.labels["model"] == "gate"
                found[(sample.name, sample.labels["version"])] = sample.value
    return found


def test_pending_and_inflight_follow_the_requests(tmp_path: Path) -> None:
    release = threading.Event()
    running = threading.Semaphore(0)

    def gate(x: Any) -> Any:
        running.release()
        assert release.wait(WAIT)
        return x

    text = (
        "models:\n  - name: gate\n    modelFormat: {name: python}\n"
        f"    entrypoint: {register_object(gate)}\n    instances: 2\n"
        "    inputs: [{name: x, datatype: FP32, shape: [-1]}]\n"
        "    outputs: [{name: y, datatype: FP32, shape: [-1]}]\n"
    )
    x = np.ones(2, np.float32)
    request = InferRequest("gate", [Tensor("x", "FP32", x.shape, x)])

    async def scenario() -> None:
        kit = ServeKit(compile_plan(parse_config(text), tmp_path))
        await kit.control.start()
        assert _gauges(kit) == {
            ("servekit_pending_requests", "1"): 0,
            ("servekit_inflight_requests", "1"): 0,
        }
        calls = [asyncio.create_task(kit.dataplane.infer(request)) for _ in range(5)]
        for _ in range(2):  # both instances took one
            assert await asyncio.to_thread(running.acquire, True, WAIT)
        await asyncio.sleep(0)  # the other three are queued by now
        assert _gauges(kit) == {
            ("servekit_pending_requests", "1"): 3,
            ("servekit_inflight_requests", "1"): 2,
        }
        release.set()
        answers = await asyncio.wait_for(asyncio.gather(*calls), WAIT)
        assert len(answers) == 5
        assert _gauges(kit) == {
            ("servekit_pending_requests", "1"): 0,
            ("servekit_inflight_requests", "1"): 0,
        }
        await kit.stop(0)

    asyncio.run(scenario())


def test_control_routes_say_they_change_one_replica(tmp_path: Path) -> None:
    """The OpenAPI document of load and unload says a call changes one replica (issue 41)."""
    kit = ServeKit(compile_plan(parse_config("models: []\n"), tmp_path))
    paths = kit.http_app().openapi_schema.paths or {}
    for verb in ("load", "unload"):
        operation = paths[f"/v2/repository/models/{{model}}/{verb}"].post
        assert operation is not None
        assert "this server only" in (operation.description or "")
        assert "replica" in (operation.description or "")
