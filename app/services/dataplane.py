"""The one dataplane: every protocol adapter calls these methods and nothing else.

It validates a request against the model's metadata (names, datatypes, shapes), picks the
version, hands the request to that version's executor (app/services/executor.py: on the loop
for models measured fast, else the model's own worker threads, queue, deadlines and batching),
checks the outputs against the metadata (app/services/outputs.py) and records statistics.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from app import __version__
from app.config.compiler import ModelPlan
from app.errors import (
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    NotFound,
    ServeError,
    Unimplemented,
    internal_error,
)
from app.models.repository import ModelRepository, State, VersionEntry
from app.runtimes.base import ModelRuntime
from app.services.executor import ModelExecutor
from app.services.jobs import ExecutorSettings
from app.services.stats import Statistics, VersionStats
from app.types import (
    InferRequest,
    InferResponse,
    ModelMetadata,
    ModelSignature,
    Tensor,
    TensorSpec,
)

log = logging.getLogger("servekit.dataplane")

EXTENSIONS: list[str] = ["binary_tensor_data"]
"""Protocol extensions this server implements; adapters append theirs when registered."""


class DataPlane:
    """Health, metadata and inference over the model repository."""

    def __init__(self, repository: ModelRepository, statistics: Statistics | None = None) -> None:
        self.repository = repository
        self.statistics = statistics or Statistics()
        self.extensions: list[str] = list(EXTENSIONS)
        self.started_at = time.time()
        self.online = True
        """False after grps Offline: readiness answers false (on every surface) so a load
        balancer drains this server, while requests that still arrive are served."""
        self._timeout_s = repository.plan.server.request_timeout_seconds

    # -- health and metadata ------------------------------------------------------------------
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Server readiness, the one rule every surface answers (V2 HTTP and gRPC, gRPC health,
        grps, the dashboard): online (see ``online``), start-up loading finished and, with
        ``server.strictReadiness`` (the default, as Triton), every model asked for READY."""
        return self.not_ready_reason() is None

    def not_ready_reason(self) -> str | None:
        """Why the server is not ready, or None when it is. Says how many models are missing,
        not which: readiness is open to unauthenticated probes, model names are not."""
        if not self.online:
            return "the server is offline (draining); Online brings it back"
        if not self.repository.startup_done:
            return "models are still loading"
        waiting = self.models_not_ready()
        if waiting:
            return (
                f"{len(waiting)} model(s) asked for are not READY (see the repository index; "
                "server.strictReadiness: false answers ready without them)"
            )
        return None

    def models_not_ready(self) -> list[str]:
        """Models asked for (``ModelRepository.requested``) with a version that is not READY,
        or with no version at all; always empty when ``server.strictReadiness`` is false."""
        repository = self.repository
        if not repository.plan.server.strict_readiness:
            return []
        waiting = []
        for name in sorted(repository.requested):
            try:
                entry = repository.get(name)
            except NotFound:  # asked for, then left serve.yaml: no longer served at all
                continue
            if not entry.versions or entry.failed_versions():
                waiting.append(name)
        return waiting

    def server_metadata(self) -> dict[str, Any]:
        return {
            "name": self.repository.plan.server.name,
            "version": __version__,
            "extensions": list(self.extensions),
        }

    def model_ready(self, name: str, version: str | None = None) -> bool:
        entry = self.repository.get(name)
        if version is None or version == "":
            return bool(entry.ready_versions())
        try:
            self.repository.resolve(name, version)
        except ServeError as exc:
            if exc.code.value == "NOT_FOUND":
                raise
            return False
        return True

    def model_metadata(self, name: str, version: str | None = None) -> ModelMetadata:
        entry, found = self.repository.resolve(name, version)
        signature = _signature(found)
        versions = tuple(str(v) for v in entry.ready_versions())
        runtime = found.runtime
        platform = runtime.platform if runtime is not None else entry.plan.format_name
        return ModelMetadata(name, versions, platform, signature.inputs, signature.outputs)

    # -- inference ----------------------------------------------------------------------------
    async def infer(self, request: InferRequest, deadline: float | None = None) -> InferResponse:
        """Validate, run and answer one inference request.

        ``deadline`` (``time.monotonic()`` seconds) is the client's, e.g. a gRPC deadline;
        ``server.requestTimeoutSeconds`` may make it earlier, and a ``timeout`` request
        parameter (microseconds, as Triton) bounds its wait in the queue. Past either the
        request is answered DeadlineExceeded and, if it had not started, never runs. How the
        request reaches the model (on the loop, in the model's threads, batched) is its
        version's executor's call.
        """
        started = time.perf_counter_ns()
        entry, version = self.repository.resolve(request.model_name, request.model_version)
        stats = self.statistics.of(entry.plan.name, version.version)
        version.enter()
        try:
            runtime = version.runtime
            if runtime is None:
                raise Internal(f"model {request.model_name!r} lost its runtime while in use")
            signature = runtime.signature
            feed = validate_inputs(request, signature.input_index, entry.plan.max_batch_size)
            wanted = requested_outputs(request, signature)
            queue_by = None
            if request.parameters or deadline is not None or self._timeout_s is not None:
                deadline, queue_by = self._deadlines(request, deadline)
            executor = version.executor
            if not isinstance(executor, ModelExecutor):
                executor = self._executor(entry.plan, version, runtime, stats)
            input_done = time.perf_counter_ns()
            names = [s.name for s in wanted]
            rows = _batch_size(request, entry.plan.max_batch_size)
            inline = executor.inline
            if inline:  # starts now: nothing can expire before it does
                results, spent = executor.run_inline(feed, names)
                queue_ns = 0
            else:
                results, queue_ns, spent = await executor.submit(
                    feed, names, rows, deadline, queue_by
                )
            infer_done = time.perf_counter_ns()
            outputs = executor.check.tensors(results, wanted)
            stats.record_success(
                rows,
                queue_ns,
                input_done - started,
                spent,
                time.perf_counter_ns() - infer_done,
                executed=inline,  # else the executor counted the model run
            )
        except ServeError:
            stats.record_failure(time.perf_counter_ns() - started)
            raise
        except Exception as exc:  # a runtime bug must become a clean error, not a dead request
            stats.record_failure(time.perf_counter_ns() - started)
            where = f"model {request.model_name!r}"
            raise Internal(f"{where} failed: {internal_error(log, exc, where)}") from exc
        finally:
            version.leave()
        return InferResponse(
            model_name=entry.plan.name,
            model_version=str(version.version),
            outputs=outputs,
            id=request.id,
        )

    def _deadlines(
        self, request: InferRequest, deadline: float | None
    ) -> tuple[float | None, float | None]:
        """When the request expires as a whole (the client's deadline, capped by
        ``server.requestTimeoutSeconds``) and when it must have started: its ``timeout``
        parameter, in microseconds from now (0 or absent: none). As in Triton, ``timeout``
        bounds the wait in the model's queue; a request that starts at once never expires by it.
        """
        now = time.monotonic()
        if self._timeout_s is not None:
            cap = now + self._timeout_s
            deadline = cap if deadline is None else min(deadline, cap)
        if deadline is not None and deadline <= now:
            raise DeadlineExceeded(
                f"model {request.model_name!r}: the request's deadline had passed when it arrived"
            )
        timeout = request.parameters.get("timeout")
        if timeout is None:
            return deadline, None
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0:
            raise InvalidArgument(
                "parameter 'timeout' must be a whole number of microseconds (0: no timeout)"
            )
        return deadline, (now + timeout / 1e6) if timeout else None

    def _executor(
        self, plan: ModelPlan, version: VersionEntry, runtime: ModelRuntime, stats: VersionStats
    ) -> ModelExecutor:
        """The executor of a loaded version (made on first use, closed when it is retired)."""
        settings = ExecutorSettings.of(plan, self.repository.plan.server)
        executor = ModelExecutor(plan.name, version, runtime, stats, settings)
        version.executor = executor
        return executor

    def signature_of(self, name: str, version: str | None = None) -> ModelSignature:
        """The signature of the version a request for (name, version) would use."""
        _, found = self.repository.resolve(name, version)
        return _signature(found)


def _signature(found: VersionEntry) -> ModelSignature:
    if found.state is not State.READY or found.runtime is None:
        raise Internal("version is not loaded")
    return found.runtime.signature


def _batch_size(request: InferRequest, max_batch_size: int) -> int:
    if max_batch_size > 0 and request.inputs and request.inputs[0].shape:
        return request.inputs[0].shape[0]
    return 1


def validate_inputs(
    request: InferRequest, by_name: dict[str, TensorSpec], max_batch_size: int = 0
) -> dict[str, Any]:
    """Check every input against the model's metadata; return name -> array for the runtime."""
    feed: dict[str, Any] = {}
    for tensor in request.inputs:
        spec = by_name.get(tensor.name)
        if spec is None:
            raise InvalidArgument(
                f"model {request.model_name!r} has no input {tensor.name!r}; "
                f"its inputs are {', '.join(by_name)}"
            )
        if tensor.name in feed:
            raise InvalidArgument(f"input {tensor.name!r} is given twice")
        if tensor.datatype != spec.datatype:
            raise InvalidArgument(
                f"input {tensor.name!r} must be {spec.datatype}, got {tensor.datatype}"
            )
        _check_shape(tensor, spec, max_batch_size)
        feed[tensor.name] = tensor.data
    missing = [name for name in by_name if name not in feed]
    if missing:
        raise InvalidArgument(f"model {request.model_name!r} needs input(s) {', '.join(missing)}")
    return feed


def _check_shape(tensor: Tensor, spec: TensorSpec, max_batch_size: int) -> None:
    shape = tensor.shape
    ok = len(shape) == len(spec.shape) and all(
        want < 0 or want == got for want, got in zip(spec.shape, shape, strict=True)
    )
    if ok and max_batch_size > 0 and shape and shape[0] > max_batch_size:
        raise InvalidArgument(
            f"input {tensor.name!r}: batch of {shape[0]} exceeds maxBatchSize {max_batch_size}"
        )
    if not ok:
        raise InvalidArgument(
            f"input {tensor.name!r}: shape {list(shape)} does not match the model's "
            f"{list(spec.shape)} (-1 is any size)"
        )


def requested_outputs(request: InferRequest, signature: ModelSignature) -> list[TensorSpec]:
    """The outputs to compute: those asked for, in the order asked, or all of them."""
    if not request.outputs:
        return list(signature.outputs)
    by_name = signature.output_index
    wanted = []
    for requested in request.outputs:
        if requested.parameters.get("classification"):
            # Any transport may carry the parameter; none may have it silently ignored.
            raise Unimplemented(
                f"output {requested.name!r} asks for classification, an extension servekit "
                "does not offer; request the tensor itself"
            )
        spec = by_name.get(requested.name)
        if spec is None:
            raise InvalidArgument(
                f"model {request.model_name!r} has no output {requested.name!r}; "
                f"its outputs are {', '.join(by_name)}"
            )
        wanted.append(spec)
    return wanted
