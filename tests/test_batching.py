"""Dynamic batching: concurrent requests are stacked into fewer model executions, and each
request still gets exactly its own rows back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import onnx
import onnx_builders
import pytest

from servekit.config.compiler import compile_plan
from servekit.config.loader import ConfigError, parse_config
from servekit.server import ServeKit
from servekit.types import InferRequest, Tensor

CONFIG = """
models:
  - name: mlp
    modelFormat: {name: onnx}
    storageUri: ./mlp.onnx
    maxBatchSize: 8
    dynamicBatching: {maxQueueDelayMicroseconds: 20000}
  - name: plain
    modelFormat: {name: onnx}
    storageUri: ./mlp.onnx
"""


def _request(model: str, rows: np.ndarray) -> InferRequest:
    tensor = Tensor("input", "FP32", tuple(rows.shape), rows)
    return InferRequest(model_name=model, inputs=[tensor])


async def _serve(tmp_path: Path) -> ServeKit:
    onnx.save(onnx_builders.mlp(), str(tmp_path / "mlp.onnx"))
    kit = ServeKit(compile_plan(parse_config(CONFIG), tmp_path))  # services only, no listener
    await kit.control.start()
    return kit


def test_concurrent_requests_share_executions(tmp_path: Path) -> None:
    async def scenario() -> None:
        kit = await _serve(tmp_path)
        dataplane = kit.dataplane
        rng = np.random.default_rng(0)
        inputs = [rng.standard_normal((1 + i % 3, 16)).astype(np.float32) for i in range(12)]
        batched = await asyncio.gather(*(dataplane.infer(_request("mlp", x)) for x in inputs))
        for x, response in zip(inputs, batched, strict=True):
            alone = await dataplane.infer(_request("plain", x))
            assert response.outputs[0].data.shape == (x.shape[0], 4)
            np.testing.assert_allclose(response.outputs[0].data, alone.outputs[0].data, rtol=1e-5)
        stats = dataplane.statistics.of("mlp", 1)
        assert stats.inference_count == sum(x.shape[0] for x in inputs)
        assert stats.execution_count < len(inputs)  # requests were stacked
        assert all(size <= 8 for size in stats.batch_sizes)
        assert stats.queue.ns > 0
        await kit.stop()

    asyncio.run(scenario())


def test_batching_requires_max_batch_size() -> None:
    text = """
models:
  - name: m
    modelFormat: {name: onnx}
    storageUri: ./m.onnx
    dynamicBatching: {}
"""
    with pytest.raises(ConfigError, match="maxBatchSize"):
        parse_config(text)
