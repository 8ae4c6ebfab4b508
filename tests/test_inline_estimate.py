"""The inline-or-thread decision recovers: a fast model pushed off the event loop by one slow
moment (another process stealing the core) comes back once its real compute time is seen.

The estimate used to include the thread hop and the wait for the event loop, which grow under
load, so a fast model could stay in the thread pool for good exactly when the server was busy.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import onnx
import onnx_builders

from app.config.compiler import compile_plan
from app.config.loader import parse_config
from app.server import ServeKit
from app.types import InferRequest, Tensor

CONFIG = """
server: {inlineBelowMicroseconds: 500}
models:
  - name: mlp
    modelFormat: {name: onnx}
    storageUri: ./mlp.onnx
"""


def test_fast_model_returns_inline_after_a_slow_moment(tmp_path: Path) -> None:
    async def scenario() -> None:
        onnx.save(onnx_builders.mlp(), str(tmp_path / "mlp.onnx"))
        kit = ServeKit(compile_plan(parse_config(CONFIG), tmp_path))  # services only, no listener
        await kit.control.start()
        dataplane = kit.dataplane
        x = np.ones((1, 16), dtype=np.float32)
        dataplane._compute_avg_ns[("mlp", 1)] = 50e6  # as if one call had been preempted
        stop = asyncio.Event()

        async def busy_loop() -> None:  # other requests keep the loop busy 2 ms at a time
            while not stop.is_set():
                time.sleep(0.002)
                await asyncio.sleep(0)

        other = asyncio.create_task(busy_loop())
        for _ in range(40):  # requests run in the worker thread until the estimate falls
            response = await dataplane.infer(
                InferRequest(model_name="mlp", inputs=[Tensor("input", "FP32", (1, 16), x)])
            )
            assert response.outputs[0].data.shape == (1, 4)
        stop.set()
        await other
        assert dataplane._compute_avg_ns[("mlp", 1)] < 500_000
        await kit.stop()

    asyncio.run(scenario())
