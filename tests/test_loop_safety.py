"""Which models may run on the event loop: ONNX Runtime sessions measured fast, never Python code.

In process (fast tier), through the DataPlane: a Python model stays in its worker threads however
fast it is measured, batching or not, while an ONNX model measured fast moves onto the loop (the
hot path). That a blocked Python call cannot hold the liveness probes of a real server is
tests/test_liveness_e2e.py.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx_builders import mlp

from servekit.config.compiler import compile_plan
from servekit.config.loader import parse_config
from servekit.models.repository import VersionEntry
from servekit.runtimes.onnx import OnnxModel
from servekit.runtimes.python import PythonModel, register_object
from servekit.server import ServeKit
from servekit.services.execution import placement
from servekit.services.execution.executor import ModelExecutor
from servekit.services.execution.placement import Mode
from servekit.types import InferRequest, Tensor

ROOMY = "server: {inlineBelowMicroseconds: 100000}\n"
"""A bound no call of these tiny models reaches, even on a busy machine: were a Python model
allowed onto the loop, it would get there."""
BATCHING = "    maxBatchSize: 8\n    dynamicBatching: {maxQueueDelayMicroseconds: 100}\n"


def test_the_runtimes_say_whether_they_may_run_inline() -> None:
    assert OnnxModel.may_run_inline is True
    assert PythonModel.may_run_inline is False


def _executor(kit: ServeKit, name: str) -> ModelExecutor:
    version: VersionEntry = kit.repository.resolve(name, None)[1]
    assert isinstance(version.executor, ModelExecutor)
    return version.executor


@pytest.mark.parametrize("extra", ["", BATCHING], ids=["unbatched", "batching"])
def test_a_fast_python_model_never_runs_on_the_loop(tmp_path: Path, extra: str) -> None:
    threads: list[str] = []

    def fast(x: Any) -> Any:
        threads.append(threading.current_thread().name)
        return x * 2

    entry = (
        f"  - name: fast\n    modelFormat: {{name: python}}\n    entrypoint: "
        f"{register_object(fast)}\n"
        "    inputs: [{name: x, datatype: FP32, shape: [-1]}]\n"
        "    outputs: [{name: y, datatype: FP32, shape: [-1]}]\n" + extra
    )

    async def scenario() -> None:
        kit = ServeKit(compile_plan(parse_config(ROOMY + "models:\n" + entry), tmp_path))
        await kit.control.start()
        kit.state.requests_in_progress = lambda: 1  # alone: a batching lone request may go inline
        try:
            x = np.ones(2, np.float32)
            for _ in range(placement.LEARN_SLOW + 5):
                answer = await kit.dataplane.infer(
                    InferRequest("fast", [Tensor("x", "FP32", (2,), x)])
                )
                assert answer.outputs[0].data.tolist() == [2.0, 2.0]
            assert _executor(kit, "fast").mode is Mode.THREADS
            assert threading.current_thread().name not in threads
        finally:
            await kit.stop()

    asyncio.run(scenario())


def test_a_fast_onnx_model_moves_onto_the_loop(tmp_path: Path) -> None:
    onnx.save(mlp(16, 8, 4), tmp_path / "m.onnx")
    entry = "  - name: m\n    modelFormat: {name: onnx}\n    storageUri: ./m.onnx\n"

    async def scenario() -> None:
        kit = ServeKit(compile_plan(parse_config(ROOMY + "models:\n" + entry), tmp_path))
        await kit.control.start()
        try:
            x = np.ones((1, 16), np.float32)
            for _ in range(placement.LEARN_FAST + 1):
                await kit.dataplane.infer(InferRequest("m", [Tensor("input", "FP32", x.shape, x)]))
            assert _executor(kit, "m").mode is Mode.INLINE
        finally:
            await kit.stop()

    asyncio.run(scenario())
