"""A model with several versions that behave differently, for traffic and shadow tests.

A Python model's versions all run one entrypoint; what tells them apart here is the order in
which they load: the server loads a model's versions one after the other, in version order,
and imports (reloads) the model's module for each, so a module-level count that survives the
reload (``globals().get``) numbers the loads. ``KINDS`` names what each load does, in version
order: ``double`` (y = 2x), ``triple`` (y = 3x: a disagreeing version), ``fail`` (raises),
``sleep`` (y = 2x after 50 ms: a slow version that agrees), ``nudge`` (y = 2x + 1e-7: agrees
within the tolerance).
"""

from __future__ import annotations

import uuid
from pathlib import Path

MODULE = """
import time

import numpy as np

KINDS = {kinds!r}
LOADS = globals().get("LOADS", 0) + 1
KIND = KINDS[min(LOADS, len(KINDS)) - 1]


class Model:
    def __init__(self):
        self.kind = KIND

    def predict(self, x):
        if self.kind == "fail":
            raise RuntimeError("this version fails")
        if self.kind == "sleep":
            time.sleep(0.05)
        if self.kind == "triple":
            return {{"y": x * 3}}
        if self.kind == "nudge":
            return {{"y": x * 2 + np.float32(1e-7)}}
        return {{"y": x * 2}}


class Streaming:  # a decoupled model (its predict yields): twice y = 2x (double) or 3x

    def __init__(self):
        self.factor = 2 if KIND == "double" else 3

    def predict(self, x):
        for _ in range(2):
            yield {{"y": x * self.factor}}
"""


def write_model(root: Path, folder: str, versions: dict[int, str]) -> str:
    """A module under ``root`` whose loads do ``versions`` (version -> kind, loaded in version
    order) and the version folders of ``root/folder`` (an empty ``model.onnx`` each: what a
    version folder holds; the Python runtime does not read it). Returns the module's name,
    unique so that two tests in one process never share its load count."""
    name = f"traffic_model_{uuid.uuid4().hex[:12]}"
    kinds = [versions[number] for number in sorted(versions)]
    (root / f"{name}.py").write_text(MODULE.format(kinds=kinds))
    for number in versions:
        version = root / folder / str(number)
        version.mkdir(parents=True, exist_ok=True)
        (version / "model.onnx").write_bytes(b"")
    return name


def model_yaml(
    name: str,
    module: str,
    folder: str,
    extra: str = "",
    policy: str = "{all: {}}",
    attribute: str = "Model",
) -> str:
    """One serve.yaml model entry (``extra``: more of its keys, indented four spaces;
    ``attribute``: ``Model``, or ``Streaming`` for the decoupled one)."""
    return (
        f"  - name: {name}\n"
        f"    modelFormat: {{name: python}}\n"
        f"    entrypoint: {module}:{attribute}\n"
        f"    storageUri: {folder}\n"
        f"    versionPolicy: {policy}\n"
        f"    inputs: [{{name: x, datatype: FP32, shape: [-1]}}]\n"
        f"    outputs: [{{name: y, datatype: FP32, shape: [-1]}}]\n"
        f"{extra}"
    )
