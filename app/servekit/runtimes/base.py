"""The runtime protocol every model implementation follows."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextvars import ContextVar
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from servekit.errors import InvalidArgument
from servekit.types import ModelSignature, TensorSpec

if TYPE_CHECKING:  # annotations only: the isolated child imports this without pydantic
    from servekit.config.schema import TensorOverride


class LoadError(Exception):
    """A model version that cannot load; the message is shown as its UNAVAILABLE reason."""


Arrays = dict[str, np.ndarray]


class ModelRuntime(Protocol):
    """One loaded model version.

    ``predict`` is called with inputs already validated against ``signature`` (names, datatypes,
    shapes) and the list of outputs wanted; it runs in a worker thread, or on the event loop
    thread when ``may_run_inline`` allows it, so it must be thread-safe and must not touch the
    event loop.
    """

    signature: ModelSignature
    platform: str
    may_run_inline: bool
    """Whether the executor may call ``predict`` on the event loop thread once calls are
    measured fast (app/servekit/services/execution/placement.py). Only a runtime whose calls cannot
    block says True: pure computation whose time follows its input (ONNX Runtime, a tabular model
    that is its library's own code: app/servekit/runtimes/tabular.py; the executor also keeps a
    request with more rows than were measured off the loop). A runtime that runs arbitrary
    code (a Python model may sleep, take a lock or wait on the network once in a while, after any
    number of fast calls) or waits on another process (an isolated model) says False: one blocked
    call on the loop would stall every request, liveness probes included, of every model."""
    # Capabilities every runtime declares (the executor and the DataPlane read them; nothing
    # probes a runtime with getattr):
    decoupled: bool
    """True: it answers a request with a stream of responses (Triton's decoupled transaction
    policy): it has ``predict_stream`` and its ``predict`` refuses."""
    loose_outputs: frozenset[str]
    """Outputs whose shape the metadata only guessed: the output check tests their datatype."""
    outputs_trusted: bool
    """True: its outputs always match the metadata, so they are not checked on the hot path."""
    note: str
    """What a user should know about how it serves (e.g. ``convert: onnx`` fell back to the
    native model, and why): the READY version's reason in the index and on the dashboard;
    empty for most runtimes."""

    def predict(self, inputs: Arrays, outputs: list[str]) -> Arrays:
        """Run the model."""
        ...

    def predictor(self, index: int) -> Predict:
        """The predict function of instance ``index`` (0 <= index < instances): the executor
        gives each of a model's worker threads its own, so threads never wait for one another's
        session; ``predict`` is for callers that do not care which instance runs."""
        ...

    def close(self) -> None:
        """Release the model's resources."""
        ...


Predict = Callable[[Arrays, list[str]], Arrays]


@runtime_checkable
class Supervised(Protocol):
    """A runtime whose health can change after it loaded (an isolated model's process may die
    and come back); the repository shows it as the version's state."""

    def watch(self, report: Callable[[str | None], None]) -> None:
        """Call ``report(reason)`` whenever the runtime stops serving, ``report(None)`` when it
        serves again, from any thread; called at once if it is down already."""
        ...


CALL_DEADLINE: ContextVar[float | None] = ContextVar("servekit_call_deadline", default=None)
"""The ``time.monotonic()`` by which the current request must be answered, when the caller
knows one (a client's deadline). The executor answers the client at that time whatever the
runtime does; a runtime may use it to not start work nobody waits for (an isolated model
waits for a free process until then, and does not send a call past it), but a call already
running is never killed for it: a client's short deadline must not restart a model others
use. A context variable, so it follows the call into a worker thread (``asyncio.to_thread``
copies the context) without changing ``predict``'s arguments."""


CALLING_MODEL: ContextVar[str | None] = ContextVar("servekit_calling_model", default=None)
"""The served model whose code is running (set by the Python runtime around ``predict``), so a
call it makes to another model (``servekit.models.infer``) knows its caller: a model calling
itself, or models calling each other in a circle, is refused instead of deadlocking."""


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
        datatype = override.datatype or current.datatype
        by_name[override.name] = TensorSpec(
            current.name,
            datatype,
            tuple(override.shape) if override.shape is not None else current.shape,
            # the categories the model knows stay while the datatype does
            categories=current.categories if datatype == current.datatype else None,
        )
    return tuple(by_name[s.name] for s in specs)


def mark_optional(
    signature: ModelSignature, declared: tuple[TensorOverride, ...] | None
) -> ModelSignature:
    """``signature`` with the inputs serve.yaml declares ``optional: true`` marked so (one
    place for every runtime: a model file or a ``predict`` cannot say it)."""
    optional = {t.name for t in declared or () if t.optional}
    if not optional:
        return signature
    inputs = tuple(replace(s, optional=s.name in optional) for s in signature.inputs)
    return replace(signature, inputs=inputs)


def predict_stream(
    runtime: object, inputs: Arrays, outputs: list[str]
) -> AsyncGenerator[Arrays, None]:
    """The results of a decoupled runtime (``ModelRuntime.decoupled``), one per response.

    Called on the event loop; closing the iterator early stops the model (its slot is freed).
    """
    stream: Callable[[Arrays, list[str]], AsyncGenerator[Arrays, None]]
    stream = runtime.predict_stream  # type: ignore[attr-defined]
    return stream(inputs, outputs)
