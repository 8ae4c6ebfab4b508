"""Request kinds: how a model that is not a plain model call answers a request.

A pipeline (composition/pipelines.py) and a sequence model (sequences/handler.py) each answer
in their own way; the DataPlane does not ask which a model is on every request. Each kind is
registered with the DataPlane once, and when a version loads the DataPlane asks the kinds in
turn which serves its plan: that kind's handler is kept with the version
(``PreparedVersion.handler``) and ``DataPlane.infer`` hands it the resolved request. A version
no kind claims is a plain model call, which the DataPlane runs itself. A kind whose decoupled
models stream (an MLServer runtime's ``predict_stream``) also has a ``stream`` method
(:class:`Streams`), which ``DataPlane.infer_stream`` hands such a request; a decoupled model of
a kind without one answers once.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Protocol

from servekit.config.compiler import ModelPlan
from servekit.models.repository import ModelEntry, VersionEntry
from servekit.types import InferRequest, InferResponse


class Handler(Protocol):
    """Answers one request for a version the DataPlane has resolved; ``deadline`` and
    ``arrived`` as for ``DataPlane.infer``. It validates, runs and accounts the request
    (services/account.py) as the plain model call does."""

    def __call__(
        self,
        entry: ModelEntry,
        version: VersionEntry,
        request: InferRequest,
        deadline: float | None,
        arrived: float | None,
    ) -> Awaitable[InferResponse]: ...


class RequestKind(Protocol):
    """A kind of model the DataPlane hands requests to."""

    def serves(self, plan: ModelPlan) -> bool:
        """Whether a model of ``plan`` is of this kind."""
        ...

    def infer(
        self,
        entry: ModelEntry,
        version: VersionEntry,
        request: InferRequest,
        deadline: float | None,
        arrived: float | None,
    ) -> Awaitable[InferResponse]:
        """The kind's :class:`Handler`."""
        ...


Streams = Callable[[ModelEntry, VersionEntry, InferRequest], AsyncGenerator[InferResponse, None]]
"""A request kind's ``stream``: the responses of a decoupled model of that kind to one request."""


def kind_for(kinds: tuple[RequestKind, ...], plan: ModelPlan) -> RequestKind | None:
    """The first kind that serves ``plan`` (None: a plain model call)."""
    for kind in kinds:
        if kind.serves(plan):
            return kind
    return None


def handler_for(kinds: tuple[RequestKind, ...], plan: ModelPlan) -> Handler | None:
    """The handler of the first kind that serves ``plan`` (None: a plain model call)."""
    kind = kind_for(kinds, plan)
    return None if kind is None else kind.infer
