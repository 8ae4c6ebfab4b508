"""Fake models for the in-process tier: Python objects served through ``ModelControl.add``.

They go through the real Python runtime (app/servekit/runtimes/python.py: metadata from type hints,
outputs cast to their datatypes, user errors turned into clean ones), so a test with them
exercises the same path as a user's model, without files, imports or processes. Each one does
one thing a test needs to see: add, echo, block until released, raise, answer the wrong
output, refuse to load.
"""

from __future__ import annotations

import threading
from typing import Annotated, Any

import numpy as np
from numpy.typing import NDArray

from servekit.config.schema import ModelConfig
from servekit.errors import InvalidArgument
from servekit.types import InferRequest, RequestedOutput, Tensor

WAIT_S = 10.0
"""How long a gated model waits to be released before it gives up (a bounded wait)."""

Rows = Annotated[NDArray[np.float32], (-1, 4)]
Text = Annotated[NDArray[np.object_], "BYTES"]


class Sum:
    """``output = a + b`` over FP32 rows of 4."""

    def predict(self, a: Rows, b: Rows) -> Rows:
        return a + b


class Echo:
    """``text`` back as it came (BYTES of any length)."""

    def predict(self, text: Text) -> Text:
        return text


class Slow:
    """Blocks in ``predict`` until ``release()``: its requests are provably in flight.

    ``entered`` counts the calls that have started; the gate starts open so a warm-up call
    can pass, after which ``hold()`` closes it. Serve it with ``inlineBelowMicroseconds: 0``
    so that every call runs in the model's own worker thread
    (app/servekit/services/execution/executor.py), never on the event loop the test waits on.
    """

    def __init__(self) -> None:
        self.entered = 0
        self._lock = threading.Lock()
        self._gate = threading.Event()
        self._gate.set()

    def hold(self) -> None:
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    def predict(self, x: NDArray[np.float32]) -> NDArray[np.float32]:
        with self._lock:
            self.entered += 1
        if not self._gate.wait(WAIT_S):
            raise TimeoutError("the test never released the slow model")
        return x


class Failing:
    """Raises like a buggy model; a negative input is refused with the model's own error."""

    def predict(self, x: NDArray[np.float32]) -> NDArray[np.float32]:
        if (x < 0).any():
            raise InvalidArgument("negative numbers are refused")
        raise ValueError("the model is broken")


class WrongOutput:
    """Answers with outputs that do not match its signature (``mode`` says how)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def predict(self, x: NDArray[np.float32]) -> dict[str, Any]:
        if self.mode == "missing":
            return {"other": x}
        return {"output": "not a number"}


class BrokenLoad:
    """A class whose ``load()`` fails: the version is UNAVAILABLE with the reason."""

    def load(self) -> None:
        raise RuntimeError("cannot reach the weights")

    def predict(self, x: NDArray[np.float32]) -> NDArray[np.float32]:
        return x


def python_model(name: str, **fields: Any) -> ModelConfig:
    """The serve.yaml entry of a Python model (camelCase keys as in the file); its entrypoint is
    a placeholder that ``ModelControl.add(config, python_object)`` replaces with the object."""
    entry = {"name": name, "modelFormat": {"name": "python"}, "entrypoint": "fakes:object"}
    return ModelConfig.model_validate({**entry, **fields})


def tensor(name: str, data: Any, datatype: str = "FP32") -> Tensor:
    """A request tensor whose shape is its data's (the codecs guarantee that much)."""
    if datatype == "BYTES":
        array = np.array(data, dtype=np.object_)
    else:
        array = np.asarray(data, dtype=np.float32 if datatype == "FP32" else None)
    return Tensor(name, datatype, tuple(array.shape), array)


def request(
    model: str,
    *tensors: Tensor,
    version: str | None = None,
    outputs: list[str] | None = None,
    **arrays: Any,
) -> InferRequest:
    """An InferRequest with ``tensors`` and FP32 inputs given as keyword arrays."""
    inputs = [*tensors, *(tensor(name, data) for name, data in arrays.items())]
    wanted = [RequestedOutput(name) for name in outputs] if outputs is not None else None
    return InferRequest(model_name=model, inputs=inputs, model_version=version, outputs=wanted)


def rows(*values: float) -> NDArray[np.float32]:
    """One FP32 row of 4 per value (filled with it)."""
    return np.array([[v] * 4 for v in values], dtype=np.float32)
