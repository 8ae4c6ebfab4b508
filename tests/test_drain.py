"""Graceful stop, in process: readiness false and new requests refused (UNAVAILABLE) at once,
while a request already accepted (running in its model's thread) finishes and is answered."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servekit.config.compiler import compile_plan
from servekit.config.loader import parse_config
from servekit.errors import Unavailable
from servekit.grpc.health import NOT_SERVING, HealthServicer
from servekit.runtimes.python import register_object
from servekit.server import ServeKit, StopSignals
from servekit.services import grps_calls
from servekit.types import InferRequest, Tensor

WAIT = 10.0


def _one_model(name: str, function: Any) -> tuple[str, InferRequest]:
    """A serve.yaml serving ``function`` as ``name`` (x -> y, FP32), and a request for it."""
    text = (
        f"server: {{drainSeconds: 30}}\nmodels:\n  - name: {name}\n"
        f"    modelFormat: {{name: python}}\n    entrypoint: {register_object(function)}\n"
        "    inputs: [{name: x, datatype: FP32, shape: [-1]}]\n"
        "    outputs: [{name: y, datatype: FP32, shape: [-1]}]\n"
    )
    x = np.ones(2, np.float32)
    return text, InferRequest(name, [Tensor("x", "FP32", x.shape, x)])


def test_stop_refuses_new_requests_and_lets_accepted_ones_finish(tmp_path: Path) -> None:
    release = threading.Event()
    started = threading.Event()

    def gate(x: Any) -> Any:
        started.set()
        assert release.wait(WAIT)
        return x

    text, request = _one_model("gate", gate)

    async def scenario() -> None:
        kit = ServeKit(compile_plan(parse_config(text), tmp_path))
        await kit.control.start()
        dataplane = kit.dataplane
        assert dataplane.ready()
        accepted = asyncio.create_task(dataplane.infer(request))
        assert await asyncio.to_thread(started.wait, WAIT)
        stopping = asyncio.create_task(kit.stop())
        await asyncio.sleep(0)  # stop() has begun: draining
        assert not dataplane.ready()
        assert "stopping" in (dataplane.not_ready_reason() or "")
        with pytest.raises(Unavailable):
            await dataplane.infer(request)
        assert not stopping.done()  # waits for the accepted request
        release.set()
        response = await asyncio.wait_for(accepted, WAIT)
        assert response.outputs[0].data.tolist() == [1.0, 1.0]
        await asyncio.wait_for(stopping, WAIT)

    asyncio.run(scenario())


def test_a_request_whose_headers_came_before_the_drain_is_served(tmp_path: Path) -> None:
    """An upload under way when the stop began (headers read, body still arriving) was
    accepted: it is served, while one that arrives after the drain began is refused."""
    text, request = _one_model("echo", lambda x: x)

    async def scenario() -> None:
        kit = ServeKit(compile_plan(parse_config(text), tmp_path))
        await kit.control.start()
        dataplane = kit.dataplane
        before = time.monotonic()
        kit.state.begin_drain()
        response = await dataplane.infer(request, arrived=before)
        assert response.outputs[0].data.tolist() == [1.0, 1.0]
        with pytest.raises(Unavailable):
            await dataplane.infer(request, arrived=time.monotonic())
        with pytest.raises(Unavailable):
            await dataplane.infer(request)  # no arrival time: counts as arriving now
        await kit.stop(0)

    asyncio.run(scenario())


def test_sigterm_withdraws_first_unready_but_serving(tmp_path: Path) -> None:
    """SIGTERM: readiness false at once, yet a request that still arrives (a load balancer
    sends until its next health check) is served for ``server.drainDelaySeconds``; then the
    drain refuses new ones. A second SIGTERM cuts the withdrawal short."""
    text, request = _one_model("echo", lambda x: x)
    text = text.replace("drainSeconds: 30", "drainSeconds: 30, drainDelaySeconds: 60")

    async def scenario() -> None:
        kit = ServeKit(compile_plan(parse_config(text), tmp_path))
        await kit.control.start()
        dataplane = kit.dataplane
        signals = StopSignals(asyncio.get_running_loop())
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(signals.received.wait(), WAIT)
        assert signals.withdraw_seconds(kit.plan) == 60
        stopping = asyncio.create_task(signals.stop(kit))
        await asyncio.sleep(0)
        assert not dataplane.ready()
        assert "drainDelaySeconds" in (dataplane.not_ready_reason() or "")
        # every surface's readiness: gRPC health, grps
        assert HealthServicer(dataplane).status("") == NOT_SERVING
        assert "drainDelaySeconds" in str(grps_calls.readiness(dataplane))
        response = await dataplane.infer(request)  # still served while withdrawn
        assert response.outputs[0].data.tolist() == [1.0, 1.0]
        assert not stopping.done()
        os.kill(os.getpid(), signal.SIGTERM)  # the second signal: drain now
        await asyncio.wait_for(stopping, WAIT)
        with pytest.raises(Unavailable):
            await dataplane.infer(request)

    asyncio.run(scenario())


def test_ctrl_c_skips_the_withdrawal(tmp_path: Path) -> None:
    text, _ = _one_model("echo", lambda x: x)
    text = text.replace("drainSeconds: 30", "drainSeconds: 30, drainDelaySeconds: 60")

    async def scenario() -> None:
        kit = ServeKit(compile_plan(parse_config(text), tmp_path))
        signals = StopSignals(asyncio.get_running_loop())
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.wait_for(signals.received.wait(), WAIT)
        assert signals.withdraw_seconds(kit.plan) == 0

    asyncio.run(scenario())
