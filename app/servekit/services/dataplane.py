"""The one dataplane: health, metadata and inference, what every protocol adapter calls.

A request is resolved (the version), validated against the model's metadata (names,
datatypes, shapes: app/servekit/services/execution/inputs.py), run by that version's executor
(app/servekit/services/execution/executor.py: on the loop for models measured fast, else the
model's own worker threads, queue, deadlines and batching) with its outputs checked
(app/servekit/services/execution/outputs.py), and accounted (account.py). A model that is not a
plain call (a pipeline, a sequence model) is answered by its request kind (kinds.py), chosen
when the version loaded (loading.py). What adapters only read is the Catalog's (catalog.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing

from servekit.codecs.content_types import mark_outputs
from servekit.config.auth import AccessPolicy
from servekit.config.compiler import ServePlan
from servekit.config.schema import GrpsStreaming
from servekit.errors import (
    Internal,
    ServeError,
    Unavailable,
)
from servekit.models.calls import install as install_calls
from servekit.models.repository import ModelRepository, State, VersionEntry
from servekit.results import ServerMetadata
from servekit.services.account import Account
from servekit.services.classification import classified
from servekit.services.composition.model_calls import ModelCalls
from servekit.services.composition.pipelines import Pipelines, steps_waiting
from servekit.services.deadlines import request_deadlines
from servekit.services.execution.executor import ModelExecutor
from servekit.services.execution.inputs import check_request
from servekit.services.extensions import BINARY_DATA
from servekit.services.kinds import RequestKind, Streams, handler_for, kind_for
from servekit.services.loading import VersionSetup
from servekit.services.memory import OnDemand, declared_metadata
from servekit.services.mlserver_requests import MLServerRequests
from servekit.services.model_config import ModelConfiguration, model_configuration
from servekit.services.payload_log import with_payload_log
from servekit.services.prepared import PreparedVersion
from servekit.services.readiness import models_not_ready, not_ready_reason
from servekit.services.sequences.handler import Sequences
from servekit.services.shared_memory import Infer, SharedMemoryRegions, with_shared_memory
from servekit.services.state import CallCount, ServerState
from servekit.services.stats import Statistics
from servekit.services.streaming import model_stream
from servekit.services.traffic import Traffic
from servekit.types import (
    InferRequest,
    InferResponse,
    ModelMetadata,
    ModelSignature,
)
from servekit.version import __version__

log = logging.getLogger("servekit.dataplane")


class DataPlane:
    """Health, metadata and inference over the model repository: the API every adapter is
    given with the Catalog (catalog.py, the read side); neither reaches past it into the
    repository or the plan.
    """

    def __init__(
        self,
        state: ServerState,
        repository: ModelRepository,
        statistics: Statistics | None = None,
        extensions: Sequence[str] = BINARY_DATA,
        shared_memory: SharedMemoryRegions | None = None,
        sequences: Sequences | None = None,
    ) -> None:
        """``sequences``: the sequence models' kind, shared with the Catalog that reads its
        counts (one of its own if not given)."""
        self._state = state
        self.shared_memory = shared_memory if shared_memory is not None else SharedMemoryRegions()
        """The system shared-memory regions clients registered (register/status/unregister
        are called on it by the adapters; inference reads and writes them here)."""
        self._repository = repository
        self.statistics = statistics or Statistics()
        self._extensions = tuple(extensions)
        self.infer: Infer = with_shared_memory(self.shared_memory, self._infer)
        """Validate, run and answer one inference request (see ``_infer``), its tensors read
        from and written to shared memory first if it names regions (shared_memory.py)."""
        self._calls = ModelCalls(self.infer)
        self._traffic = Traffic(self._infer, self.statistics, state)
        """serve.yaml's traffic and shadow: requests naming no version of such a model."""
        if sequences is None:
            sequences = Sequences(self.statistics, state)
        self._kinds: tuple[RequestKind, ...] = (
            Pipelines(self._infer, self.statistics, repository, state, self._calls.callers),
            sequences,
            MLServerRequests(self.statistics, state),
        )
        """The request kinds a version's plan may be of (kinds.py); none: a plain model."""
        install_calls(self._calls)  # servekit.models.infer from a model reaches this server
        self.on_demand = OnDemand(state, repository, self.statistics)  # load: onDemand
        # Executors and kinds are set when a version loads and executors re-tuned when the
        # plan changes: never on a request's path.
        setup = VersionSetup(state, repository, self.statistics, self._kinds, self._calls)
        repository.on_loaded = setup
        state.plan_changed.append(setup.retune)
        for entry in repository.entries():  # versions loaded before this DataPlane existed
            for version in entry.versions.values():
                if version.runtime is not None and version.executor is None:
                    version.executor = setup(entry.plan, version)
        self.infer = with_payload_log(state, repository, self.infer)  # (not models' calls)

    # -- the server ---------------------------------------------------------------------------
    @property
    def grpc_calls(self) -> CallCount:
        """The gRPC adapter's count of the inference calls it holds: with uvicorn's HTTP
        tasks, it tells a batching model whether a request is alone (ServerState)."""
        return self._state.grpc_calls

    @property
    def plan(self) -> ServePlan:
        """The plan in force (from ServerState: read on use, never kept)."""
        return self._state.plan

    @property
    def access(self) -> AccessPolicy:
        """The tokens in force (``server.auth``; restart-only, so fixed while running)."""
        return self._state.plan.access

    @property
    def extensions(self) -> tuple[str, ...]:
        return self._extensions

    @property
    def online(self) -> bool:
        """False after grps Offline (see ``set_online``)."""
        return self._state.online

    def set_online(self, online: bool) -> None:
        """grps Online/Offline: offline, readiness answers false on every surface so a load
        balancer drains this server, while requests that still arrive are served."""
        self._state.online = online

    def grps_streaming(self) -> GrpsStreaming:
        """How grps HTTP predict requests ask for streaming (``server.grpsStreaming``)."""
        return self._state.plan.server.grps_streaming

    # -- health and metadata ------------------------------------------------------------------
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Server readiness, the one rule every surface answers (V2 HTTP and gRPC, gRPC health,
        grps, the dashboard): online (see ``online``), start-up loading finished and, with
        ``server.strictReadiness`` (the default, as Triton), every model asked for READY."""
        return self.not_ready_reason() is None

    def not_ready_reason(self) -> str | None:
        """Why the server is not ready, or None when it is (readiness.py)."""
        return not_ready_reason(self._state, self._repository)

    def models_not_ready(self) -> list[str]:
        """Models asked for whose versions have not loaded (readiness.py)."""
        return models_not_ready(self._state, self._repository)

    # -- the model a request reaches, and its metadata ---------------------------------------
    def model_names(self) -> list[str]:
        """Every model the server knows, loaded or not (V1 list, grps selection)."""
        return self._repository.names()

    def default_model(self) -> str | None:
        """The model a request naming none uses (grps): serve.yaml's first, if any."""
        models = self._state.plan.models
        return models[0].name if models else None

    def model_config(self, name: str, version: str | None = None) -> ModelConfiguration:
        """Triton's model configuration of ``name`` as served at ``version``."""
        entry, found = self._repository.resolve(name, version)
        runtime = found.runtime
        platform = runtime.platform if runtime is not None else entry.plan.format_name
        decoupled = runtime is not None and runtime.decoupled
        return model_configuration(entry.plan, _signature(found), platform, decoupled)

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata(self._state.plan.server.name, __version__, self._extensions)

    def model_ready(self, name: str, version: str | None = None) -> bool:
        entry = self._repository.get(name)
        plan = entry.plan
        steps_ready = not plan.pipeline or steps_waiting(self._repository, plan) is None
        if version is None or version == "":
            return bool(entry.ready_versions()) and steps_ready
        try:
            self._repository.resolve(name, version)
        except ServeError as exc:
            if exc.code.value in ("NOT_FOUND", "INVALID_ARGUMENT"):  # unknown, or not a version
                raise
            return False
        return steps_ready

    def model_metadata(self, name: str, version: str | None = None) -> ModelMetadata:
        try:
            entry, found = self._repository.resolve(name, version)
        except Unavailable:  # an on-demand model not loaded: from serve.yaml, if it says all
            declared = declared_metadata(self._repository.get(name).plan)
            if declared is None:
                raise
            return declared
        signature = _signature(found)
        versions = tuple(str(v) for v in entry.ready_versions())
        runtime = found.runtime
        platform = runtime.platform if runtime is not None else entry.plan.format_name
        inputs, outputs = signature.inputs, signature.outputs
        return ModelMetadata(name, versions, platform, inputs, outputs, signature.parameters)

    # -- inference ----------------------------------------------------------------------------
    async def _infer(
        self,
        request: InferRequest,
        deadline: float | None = None,
        arrived: float | None = None,
        step: bool = False,
    ) -> InferResponse:
        """Validate, run and answer one inference request: resolve -> validate -> run ->
        account (account.py), or resolve and hand it to its model's request kind (kinds.py:
        pipelines, sequence models).

        ``deadline`` (``time.monotonic()`` seconds) is the client's, e.g. a gRPC deadline;
        a ``timeout`` request parameter (microseconds, as Triton) and
        ``server.requestTimeoutSeconds`` may make it earlier (deadlines.py). Past it the
        request is answered DeadlineExceeded and, if it had not started, never runs. How the
        request reaches the model (on the loop, in the model's threads, batched) is its
        version's executor's call (built when the version loaded).

        ``arrived`` (``time.monotonic()``) is when the request's headers came in, for adapters
        that read a body after that: a request whose upload began before a graceful stop was
        accepted and is served; one without it counts as arriving now.

        ``step``: the request is a pipeline's only running step (app/servekit/services/
        composition/pipelines.py), which a Python model measured light may run on the loop
        (``ModelExecutor.step_placement``) unless it calls other models.
        """
        state = self._state
        if state.draining and state.refuses(arrived):
            raise Unavailable("the server is stopping; send the request to another replica")
        started = time.perf_counter_ns()
        try:
            entry, version = self._repository.resolve(request.model_name, request.model_version)
        except Unavailable as error:  # an on-demand model not loaded: its request loads it
            entry, version = await self.on_demand.loaded(request, deadline, error)
            started = time.perf_counter_ns()  # the load is counted apart (memory.py)
        plan = entry.plan
        if plan.routing is not None and not request.model_version:  # traffic, shadow
            return await self._traffic.infer(entry, version, request, deadline, arrived, step)
        prepared: PreparedVersion | None = version.prepared
        if prepared is not None:
            handler = prepared.handler
            stats = prepared.stats
        else:
            handler = handler_for(self._kinds, plan)
            stats = self.statistics.of(plan.name, version.version)
        if handler is not None:  # a pipeline, a sequence model: its kind answers
            return await handler(entry, version, request, deadline, arrived)
        # The version counts the request in flight (unload and drain wait for it) from its
        # first await: a call on the loop runs to its answer with no await, so no one can see
        # the count in between and it is not taken (enter and leave are four calls).
        with Account(stats, request.model_name, started) as account:
            runtime, executor = version.runtime, version.executor
            if runtime is None or not isinstance(executor, ModelExecutor):
                raise Internal(f"model {request.model_name!r} lost its runtime while in use")
            signature = runtime.signature
            checked = None
            if prepared is not None and prepared.signature is signature:
                checked = prepared.check(request)  # the common request; None: the general way
            if checked is None:
                feed, wanted, classes, rows = check_request(request, signature, plan.max_batch_size)
                names = [s.name for s in wanted]
            else:
                feed, wanted, classes, rows, names = checked
            queue_by = None
            if request.parameters or deadline is not None or state.request_timeout_s is not None:
                deadline, queue_by = request_deadlines(request, deadline, state.request_timeout_s)
            input_done = time.perf_counter_ns()
            # On the loop now if placed there (nothing can expire before it starts): the call
            # is timed from input_done and returns its end, so no clock read of its own.
            ran = executor.run_now(
                feed, names, rows, state.requests_in_progress, input_done, queue_by is None
            )
            if ran is not None:
                inline = True
                results, infer_done = ran
            elif (step := step and plan.name not in self._calls.callers) and executor.step_inline(
                rows, state.requests_in_progress
            ):
                inline = True
                results, spent = executor.run_inline(feed, names, rows, step=True)
                infer_done = input_done + spent
            else:
                inline = False
                account.hold(version)
                results, queue_ns, spent = await executor.submit(
                    feed, names, rows, deadline, queue_by, step
                )
                infer_done = time.perf_counter_ns()
            outputs = executor.check.tensors(results, wanted)
            if classes:  # the classification extension: top k instead of the tensor
                outputs = classified(outputs, classes, plan)
            if signature.tabular is not None:  # the content types MLServer's clients use
                mark_outputs(outputs)
            ended = time.perf_counter_ns()
            if inline:  # the model run is counted here (the executor counted one in threads)
                account.clocks(rows, input_done, infer_done, ended)
            else:
                account.succeeded(
                    rows, queue_ns, input_done - started, spent, ended - infer_done, False, ended
                )
        text = prepared.version_text if prepared is not None else str(version.version)
        return InferResponse(plan.name, text, outputs, request.id, {})  # positional: cheaper

    async def infer_stream(
        self, request: InferRequest, deadline: float | None = None, arrived: float | None = None
    ) -> AsyncGenerator[InferResponse, None]:
        """The responses to one request, as the model produces them (the streaming surfaces:
        gRPC ModelStreamInfer, HTTP generate/generate_stream, grps streaming).

        A model that is not decoupled answers through :meth:`infer`: one response. A decoupled
        one (a Python ``predict`` that yields) answers one response per result. Adapters close
        this iterator when their client leaves (or their task is cancelled): that closes the
        model's generator and frees its instance; a server that is stopping ends it after the
        next response (Unavailable). Statistics count the request once, as Triton
        does for a decoupled model: a success timed from the first step to the last response,
        or a failure; a stream its client abandons is neither. ``deadline`` and ``arrived`` are
        as for :meth:`infer` (a decoupled model's stream is ended by its client, not by a
        deadline).
        """
        try:
            entry, version = self._repository.resolve(request.model_name, request.model_version)
        except Unavailable as error:
            entry, version = await self.on_demand.loaded(request, deadline, error)
        runtime = version.runtime
        kind = kind_for(self._kinds, entry.plan)
        stream: Streams | None = getattr(kind, "stream", None)  # a kind's own, if it streams
        if runtime is None or not runtime.decoupled or (kind is not None and stream is None):
            yield await self.infer(request, deadline, arrived)  # answers once
            return
        if entry.plan.routing is not None and not request.model_version:  # traffic (no shadow)
            request, version = self._traffic.pinned(entry, version, request)
            runtime = version.runtime
            if runtime is None or not runtime.decoupled:
                yield await self.infer(request, deadline, arrived)
                return
        if self._state.refuses(arrived):
            raise Unavailable("the server is stopping; send the request to another replica")
        if stream is not None:  # its kind streams it (an MLServer runtime's predict_stream)
            responses = stream(entry, version, request)
        else:
            stats = self.statistics.of(entry.plan.name, version.version)
            responses = model_stream(entry.plan, version, runtime, request, stats, self._state)
        async with aclosing(responses):
            async for response in responses:
                yield response

    def decoupled(self, name: str, version: str | None = None) -> bool:
        """Whether the version a request for (name, version) would use streams its responses
        (False for a model or version that cannot answer: the request itself says why)."""
        try:
            _, found = self._repository.resolve(name, version)
        except ServeError:
            return False
        return found.runtime is not None and found.runtime.decoupled

    def in_flight(self) -> int:
        """Inference requests accepted and not yet finished, queued or running, over every
        model (a graceful stop waits for this to reach 0)."""
        return sum(
            version.in_flight
            for entry in self._repository.entries()
            for version in entry.versions.values()
        )

    def signature_of(self, name: str, version: str | None = None) -> ModelSignature:
        """The signature of the version a request for (name, version) would use."""
        _, found = self._repository.resolve(name, version)
        return _signature(found)


def _signature(found: VersionEntry) -> ModelSignature:
    if found.state is not State.READY or found.runtime is None:
        raise Internal("version is not loaded")
    return found.runtime.signature
