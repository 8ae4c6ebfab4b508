"""Models the shared-memory and classification tests serve, in process (``ModelControl.add``)
and in a real server (this file is copied beside its serve.yaml; ``SERVE_YAML`` serves them).

``Simple`` and ``SimpleString`` take and give what Triton's example programs send to their
"simple" and "simple_string" models: two [1, 16] inputs, their sum and difference (INT32, or
BYTES holding decimal numbers). ``Head`` echoes the start of a large input. ``Scores``
answers fixed class scores for classification.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

SCORES = np.array([0.1, 0.7, 0.05, 0.7, 0.15], dtype=np.float32)
"""Class scores ``Scores`` answers per row: class 1 and 3 tie at the top."""
LABELS = ["cat", "dog", "", "fox", "owl"]


class Simple:
    def predict(self, INPUT0: NDArray[np.int32], INPUT1: NDArray[np.int32]) -> dict[str, Any]:
        return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


def _numbers(text: NDArray[np.object_]) -> NDArray[np.int64]:
    return np.array([int(x) for x in text.reshape(-1)], dtype=np.int64).reshape(text.shape)


def _text(numbers: NDArray[np.int64]) -> NDArray[np.object_]:
    flat = [str(x).encode() for x in numbers.reshape(-1)]
    return np.array(flat, dtype=np.object_).reshape(numbers.shape)


class SimpleString:
    def predict(self, INPUT0: NDArray[np.object_], INPUT1: NDArray[np.object_]) -> dict[str, Any]:
        a, b = _numbers(INPUT0), _numbers(INPUT1)
        return {"OUTPUT0": _text(a + b), "OUTPUT1": _text(a - b)}


class Head:
    """The first 8 bytes of a large UINT8 input (what a region shrunk under a copy feeds)."""

    def predict(self, data: NDArray[np.uint8]) -> dict[str, Any]:
        return {"head": data[:8].copy()}


class Scores:
    """One row of ``SCORES`` per row of ``image`` (a batching classifier)."""

    def predict(self, image: NDArray[np.float32]) -> NDArray[np.float32]:
        return np.tile(SCORES, (image.shape[0], 1))


def _io(names: list[str], datatype: str, shape: str) -> str:
    return ", ".join(f"{{name: {n}, datatype: {datatype}, shape: {shape}}}" for n in names)


SERVE_YAML = f"""
server: {{strictReadiness: true}}
models:
  - name: simple
    modelFormat: {{name: python}}
    entrypoint: shm_models:Simple
    inputs: [{_io(["INPUT0", "INPUT1"], "INT32", "[-1, 16]")}]
    outputs: [{_io(["OUTPUT0", "OUTPUT1"], "INT32", "[-1, 16]")}]
  - name: simple_string
    modelFormat: {{name: python}}
    entrypoint: shm_models:SimpleString
    inputs: [{_io(["INPUT0", "INPUT1"], "BYTES", "[-1, 16]")}]
    outputs: [{_io(["OUTPUT0", "OUTPUT1"], "BYTES", "[-1, 16]")}]
  - name: scores
    modelFormat: {{name: python}}
    entrypoint: shm_models:Scores
    maxBatchSize: 8
    inputs: [{{name: image, datatype: FP32, shape: [-1, 3, 2, 2], format: FORMAT_NCHW}}]
    outputs: [{{name: scores, datatype: FP32, shape: [-1, 5], labels: {LABELS}}}]
"""
