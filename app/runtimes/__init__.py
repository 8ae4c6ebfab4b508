"""Runtimes: what turns a dict of input arrays into a dict of output arrays.

The registry maps a runtime implementation name (``implementation:`` in serve.yaml) to a loader
function; modules are imported only when a model needs them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from app.config.compiler import ModelPlan
from app.config.versions import VersionSource
from app.errors import Internal
from app.runtimes.base import ModelRuntime

# implementation name -> "module:function" taking (plan, version) and returning a ModelRuntime.
IMPLEMENTATIONS: dict[str, str] = {
    "onnxruntime": "app.runtimes.onnx:load",
    "python": "app.runtimes.python:load",
}


def loader_for(implementation: str) -> Callable[[ModelPlan, VersionSource], ModelRuntime]:
    """The load function of a runtime implementation."""
    try:
        module_name, attr = IMPLEMENTATIONS[implementation].split(":")
    except KeyError:
        raise Internal(f"no runtime implementation called {implementation!r}") from None
    loader: Callable[[ModelPlan, VersionSource], ModelRuntime] = getattr(
        importlib.import_module(module_name), attr
    )
    return loader


def load_runtime(plan: ModelPlan, version: VersionSource) -> ModelRuntime:
    """Load one version of a model with its plan's runtime (blocking: call from a thread)."""
    return loader_for(plan.implementation)(plan, version)
