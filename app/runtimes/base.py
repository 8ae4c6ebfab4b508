"""The runtime protocol every model implementation follows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np

from app.config.schema import TensorOverride
from app.errors import InvalidArgument
from app.types import ModelSignature, TensorSpec


class LoadError(Exception):
    """A model version that cannot load; the message is shown as its UNAVAILABLE reason."""


Arrays = dict[str, np.ndarray]


class ModelRuntime(Protocol):
    """One loaded model version.

    ``predict`` is called with inputs already validated against ``signature`` (names, datatypes,
    shapes) and the list of outputs wanted; it may run on the event loop thread or a worker
    thread, so it must be thread-safe and must not touch the event loop.
    """

    signature: ModelSignature
    platform: str

    def predict(self, inputs: Arrays, outputs: list[str]) -> Arrays:
        """Run the model."""
        ...

    def close(self) -> None:
        """Release the model's resources."""
        ...


Predict = Callable[[Arrays, list[str]], Arrays]


@runtime_checkable
class PerInstance(Protocol):
    """A runtime with ``instances`` sessions (or objects) that a caller may use one each.

    The executor gives each of a model's worker threads its own instance through
    ``predictor(index)``, so threads never wait for one another's session; ``predict`` stays
    for callers that do not care which instance runs (the event loop's inline calls).
    """

    def predictor(self, index: int) -> Predict:
        """The predict function of instance ``index`` (0 <= index < instances)."""
        ...


def apply_overrides(
    specs: tuple[TensorSpec, ...], overrides: tuple[TensorOverride, ...] | None, kind: str
) -> tuple[TensorSpec, ...]:
    """Replace datatype/shape of tensors named in serve.yaml; an unknown name is an error."""
    if not overrides:
        return specs
    by_name = {s.name: s for s in specs}
    for override in overrides:
        if override.name not in by_name:
            raise InvalidArgument(
                f"serve.yaml overrides {kind} {override.name!r}, but the model's {kind}s are "
                f"{', '.join(by_name) or 'none'}"
            )
        current = by_name[override.name]
        by_name[override.name] = TensorSpec(
            current.name,
            override.datatype or current.datatype,
            tuple(override.shape) if override.shape is not None else current.shape,
        )
    return tuple(by_name[s.name] for s in specs)
