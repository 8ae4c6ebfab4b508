"""A pipeline's stand-in runtime: its signature, for the repository and every protocol.

A pipeline (serve.yaml ``pipeline:``, Triton's ensemble) has no model of its own: its steps
are other served models, which the DataPlane runs
(app/servekit/services/composition/pipelines.py). Loading it gives this object, so the
pipeline is a model like any other to the repository (a version, a state, an index row) and to
metadata and configuration, whose inputs and outputs are the ones serve.yaml declares.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servekit.datatypes import DATATYPES
from servekit.errors import Internal
from servekit.runtimes.base import Arrays, LoadError, Predict
from servekit.types import ModelSignature, TensorSpec

if TYPE_CHECKING:
    from servekit.config.compiler import ModelPlan
    from servekit.config.schema import TensorOverride
    from servekit.config.versions import VersionSource

PLATFORM = "ensemble"
"""Triton's platform name of an ensemble, which clients read in metadata and config."""


class PipelineRuntime:
    """The declared signature of a pipeline; its steps run in the DataPlane, never here."""

    platform = PLATFORM
    may_run_inline = False
    decoupled = False
    loose_outputs: frozenset[str] = frozenset()
    outputs_trusted = False
    note = ""

    def __init__(self, signature: ModelSignature, name: str) -> None:
        self.signature = signature
        self._name = name

    def predict(self, inputs: Arrays, outputs: list[str]) -> Arrays:
        raise Internal(f"pipeline {self._name!r} runs its steps through the DataPlane")

    def predictor(self, index: int) -> Predict:
        return self.predict  # refuses, as predict does

    def close(self) -> None:
        """Nothing to release: the steps' models are served (and closed) on their own."""


def load(plan: ModelPlan, version: VersionSource) -> PipelineRuntime:
    inputs = tuple(_spec(t, "input") for t in plan.inputs or ())
    outputs = tuple(_spec(t, "output") for t in plan.outputs or ())
    return PipelineRuntime(ModelSignature(inputs, outputs), plan.name)


def _spec(tensor: TensorOverride, kind: str) -> TensorSpec:
    if tensor.datatype is None or tensor.shape is None:  # the schema requires both
        raise LoadError(f"pipeline {kind} {tensor.name!r} needs datatype and shape")
    if tensor.datatype not in DATATYPES:
        raise LoadError(f"pipeline {kind} {tensor.name!r}: unknown datatype {tensor.datatype!r}")
    return TensorSpec(tensor.name, tensor.datatype, tuple(tensor.shape), tensor.optional)
