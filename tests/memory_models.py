"""A Python model that holds a known amount of memory, for the memory-budget tests
(tests/test_memory_budget*.py): ``load(megabytes=N)`` fills an N MiB array (every page
touched, so it is resident), ``predict`` answers ``y = x + 1``, and ``unload()`` records,
in the file ``record`` names, every time it was asked to unload while one of its calls was
running: the proof that no model is unloaded while in use.

A call whose first value is negative blocks until the test opens ``GATE`` (bounded), so a
test can hold a request in flight. Module state survives the server re-importing this module
for each load (it re-runs the module in the same namespace: ``globals().get``).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Annotated

import numpy as np
from numpy.typing import NDArray

GATE: threading.Event = globals().get("GATE") or threading.Event()
"""Closed: calls with a negative first value wait (up to WAIT_S) until a test opens it."""
WAIT_S = 20.0
Vector = Annotated[NDArray[np.float32], (-1,)]


class Ballast:
    """Holds ``megabytes`` MiB while loaded (see the module docstring)."""

    def load(self, megabytes: float = 1.0, record: str = "") -> None:
        self.ballast = np.ones(int(megabytes * 2**20), np.uint8)
        self.record = record
        self.active = 0
        self.lock = threading.Lock()

    def predict(self, x: Vector) -> Vector:
        with self.lock:
            self.active += 1
        try:
            if x.size and x[0] < 0 and not GATE.wait(WAIT_S):
                raise TimeoutError("the test never opened the gate")
            return (x + self.ballast[0]).astype(np.float32)
        finally:
            with self.lock:
                self.active -= 1

    def unload(self) -> None:
        with self.lock:
            busy = self.active
        if busy and self.record:
            with Path(self.record).open("a") as file:
                file.write(f"unloaded with {busy} call(s) running\n")
        del self.ballast


def ballast_entry(name: str, megabytes: float, record: Path) -> str:
    """serve.yaml's entry of an on-demand ``Ballast`` model ``name`` holding ``megabytes``."""
    return (
        f"  - name: {name}\n"
        "    modelFormat: {name: python}\n"
        "    entrypoint: memory_models:Ballast\n"
        "    load: onDemand\n"
        f"    parameters: {{megabytes: {megabytes}, record: '{record}'}}\n"
        "    inputs: [{name: x, datatype: FP32, shape: [-1]}]\n"
        "    outputs: [{name: output, datatype: FP32, shape: [-1]}]\n"
    )
