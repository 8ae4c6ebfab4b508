"""Models calling models (``servekit.models.infer``), in process (tests/pipeline_models.py).

A Python model calls the three models of the featurise -> ONNX -> post-process chain and gets
what the client would; each callee counts the call in its statistics; the calling request's
deadline bounds the call; a model calling itself, or two calling each other, is refused.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest
from inprocess import Serve, Services
from pipeline_models import CONFIG, rows, write_project
from waits import async_wait_until

from servekit import models
from servekit.errors import DeadlineExceeded, InvalidArgument
from servekit.types import InferRequest, Tensor

pytestmark = pytest.mark.anyio


async def start(serve: Serve, tmp_path: Path) -> Services:
    write_project(tmp_path)
    services: Services = await serve(CONFIG)
    return services


async def call(services: Services, model: str, name: str, data: np.ndarray) -> list[Tensor]:
    request = InferRequest(model, [Tensor(name, "FP32", data.shape, data)])
    return (await services.dataplane.infer(request)).outputs


async def test_a_model_calls_three_models(serve: Serve, tmp_path: Path) -> None:
    services = await start(serve, tmp_path)
    raw = rows(4)
    via_calls = await call(services, "calling", "raw", raw)
    via_pipeline = await call(services, "classify", "RAW", raw)
    for mine, theirs in zip(via_calls, via_pipeline, strict=True):
        np.testing.assert_array_equal(mine.data, theirs.data)
    for name in ("featurise", "mlp", "postprocess"):  # once by the caller, once by the pipeline
        assert services.statistics(name)["inference_stats"]["success"]["count"] == 2, name


async def test_a_model_calling_itself_is_refused(serve: Serve, tmp_path: Path) -> None:
    services = await start(serve, tmp_path)
    with pytest.raises(InvalidArgument, match="model 'selfish' cannot call itself"):
        await call(services, "selfish", "x", np.ones(1, np.float32))


async def test_models_calling_each_other_are_refused(serve: Serve, tmp_path: Path) -> None:
    services = await start(serve, tmp_path)
    outputs = await call(services, "ping", "x", np.ones(1, np.float32))  # pong does not call back
    assert outputs[0].data.tolist() == [1.0]
    with pytest.raises(InvalidArgument, match="in a circle: pong -> ping -> pong"):
        await call(services, "ping", "x", -np.ones(1, np.float32))


async def test_the_callers_deadline_bounds_the_call(serve: Serve, tmp_path: Path) -> None:
    services = await start(serve, tmp_path)
    module = sys.modules["pipeline_user_models"]
    request = InferRequest("impatient", [Tensor("x", "FP32", (1,), np.ones(1, np.float32))])
    try:
        with pytest.raises(DeadlineExceeded):
            await services.dataplane.infer(request, time.monotonic() + 0.3)

        def callee_failed() -> bool:  # its own request expired too: the deadline was passed on
            return bool(services.statistics("stall")["inference_stats"]["fail"]["count"] == 1)

        await async_wait_until(callee_failed, what="the call to 'stall' answered past its deadline")
    finally:
        module.RELEASE.set()


def test_outside_a_server_the_call_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from servekit.errors import Unavailable
    from servekit.models import calls

    monkeypatch.setattr(calls, "_server", [])
    with pytest.raises(Unavailable, match="inside a model a servekit server serves"):
        models.infer("m", {"x": np.ones(1)})
