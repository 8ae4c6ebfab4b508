"""The runtime protocol every model implementation follows."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Protocol

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


def is_decoupled(runtime: object) -> bool:
    """Whether ``runtime`` answers a request with a stream of responses (Triton's decoupled
    transaction policy): it then has ``predict_stream`` and its ``predict`` refuses."""
    return getattr(runtime, "decoupled", False) is True


def predict_stream(
    runtime: object, inputs: Arrays, outputs: list[str]
) -> AsyncGenerator[Arrays, None]:
    """The results of a decoupled runtime (see :func:`is_decoupled`), one per response.

    Called on the event loop; closing the iterator early stops the model (its slot is freed).
    """
    stream: Callable[[Arrays, list[str]], AsyncGenerator[Arrays, None]]
    stream = runtime.predict_stream  # type: ignore[attr-defined]
    return stream(inputs, outputs)
