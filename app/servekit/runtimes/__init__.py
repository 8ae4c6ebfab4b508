"""Runtimes: what turns a dict of input arrays into a dict of output arrays.

The registry maps a runtime implementation name (``implementation:`` in serve.yaml) to a loader
function; modules are imported only when a model needs them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from servekit.errors import Internal
from servekit.runtimes.base import ModelRuntime, mark_optional

if TYPE_CHECKING:  # annotations only: the isolated child imports this without pydantic
    from servekit.config.compiler import ModelPlan
    from servekit.config.versions import VersionSource

# implementation name -> "module:function" taking (plan, version) and returning a ModelRuntime.
IMPLEMENTATIONS: dict[str, str] = {
    "onnxruntime": "servekit.runtimes.onnx:load",
    "python": "servekit.runtimes.python:load",
    "sklearn": "servekit.runtimes.sklearn:load",
    "xgboost": "servekit.runtimes.xgboost_runtime:load",
    "lightgbm": "servekit.runtimes.lightgbm_runtime:load",
    "mlflow": "servekit.runtimes.mlflow_runtime:load",
}
ISOLATED = "isolated-python"
"""Not a name serve.yaml's ``implementation`` can give: ``isolation: process`` selects it."""
PIPELINE = "ensemble"
"""Not a name serve.yaml's ``implementation`` can give: a model with ``pipeline:`` gets it
(app/servekit/config/pipelines.py's PIPELINE_RUNTIME)."""
_LOADERS = {
    **IMPLEMENTATIONS,
    ISOLATED: "servekit.runtimes.isolated:load",
    PIPELINE: "servekit.runtimes.pipeline:load",
}


def loader_for(implementation: str) -> Callable[[ModelPlan, VersionSource], ModelRuntime]:
    """The load function of a runtime implementation."""
    try:
        module_name, attr = _LOADERS[implementation].split(":")
    except KeyError:
        raise Internal(f"no runtime implementation called {implementation!r}") from None
    loader: Callable[[ModelPlan, VersionSource], ModelRuntime] = getattr(
        importlib.import_module(module_name), attr
    )
    return loader


def load_runtime(plan: ModelPlan, version: VersionSource) -> ModelRuntime:
    """Load one version of a model with its plan's runtime (blocking: call from a thread).

    A Python model with ``isolation: process`` loads in child processes instead
    (app/servekit/runtimes/isolated.py); the compiler allows that setting on Python models only.
    """
    isolated = plan.config is not None and plan.config.isolation == "process"
    sequence = plan.sequence
    if sequence is not None:  # a stateful model: control and state tensors are the server's
        from servekit.runtimes.sequence_tensors import declared_with_sequence, visible

        if plan.implementation == "python":
            inputs, outputs = declared_with_sequence(
                plan.inputs, plan.outputs, sequence, plan.max_batch_size
            )
            plan = replace(plan, inputs=inputs, outputs=outputs)
    runtime = loader_for(ISOLATED if isolated else plan.implementation)(plan, version)
    if plan.inputs:
        runtime.signature = mark_optional(runtime.signature, plan.inputs)
    if sequence is not None:
        runtime.signature = visible(runtime.signature, sequence)
    return runtime
