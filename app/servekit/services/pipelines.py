"""Pipelines (serve.yaml ``pipeline:``, Triton's ensembles): run their steps in this process.

The DataPlane hands a request for a pipeline here (one line in ``DataPlane.infer``). Each step
is an ordinary inference request for its model through ``DataPlane.infer``, so every step keeps
its own executor, batching, queue limits and statistics, and the arrays pass from one step to
the next as they are (the same numpy objects: no copy, no serialisation). Steps start as soon
as their inputs exist, so independent steps run at the same time; the pipeline's deadline
(the client's, capped by ``server.requestTimeoutSeconds``) is every step's. A failing step
fails the request with the step and its model named, and the other running steps are
cancelled (queued, they leave their queue unrun).
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Protocol

from servekit.config.compiler import ModelPlan
from servekit.config.schema import PipelineStep
from servekit.errors import Internal, InvalidArgument, NotFound, ServeError, Unavailable
from servekit.models.repository import ModelEntry, ModelRepository, VersionEntry
from servekit.services.execution.inputs import requested_outputs, validate_inputs
from servekit.types import InferRequest, InferResponse, RequestedOutput, Tensor

if TYPE_CHECKING:
    from servekit.services.dataplane import DataPlane


class Infer(Protocol):
    """DataPlane.infer, as the steps call it."""

    def __call__(
        self,
        request: InferRequest,
        deadline: float | None,
        arrived: float | None,
        step: bool = False,
    ) -> Awaitable[InferResponse]: ...


class Pipelines:
    """Runs pipeline requests over the DataPlane's own inference, and says whether a
    pipeline's steps are ready."""

    def __init__(self, dataplane: DataPlane, repository: ModelRepository) -> None:
        self._dataplane = dataplane
        self._repository = repository

    def steps_ready(self, plan: ModelPlan) -> bool:
        """Whether every step's model version is READY (a pipeline is ready only then)."""
        for step in plan.pipeline:
            version = None if step.version is None else str(step.version)
            try:
                self._repository.resolve(step.model, version)
            except ServeError:
                return False
            entry = self._repository.get(step.model)
            if entry.plan.pipeline and not self.steps_ready(entry.plan):
                return False  # the compiler refused cycles, so this ends
        return True

    async def infer(
        self,
        entry: ModelEntry,
        version: VersionEntry,
        request: InferRequest,
        deadline: float | None,
        arrived: float | None,
    ) -> InferResponse:
        """Answer ``request`` for the pipeline ``entry`` by running its steps."""
        from servekit.services.dataplane import classified  # the DataPlane imports this module

        dataplane = self._dataplane
        plan = entry.plan
        started = time.perf_counter_ns()
        if arrived is None:  # accepted now: its steps still run if a graceful stop begins
            arrived = time.monotonic()
        stats = dataplane.statistics.of(plan.name, version.version)
        version.enter()
        try:
            runtime = version.runtime
            if runtime is None:
                raise Internal(f"pipeline {plan.name!r} lost its runtime while in use")
            signature = runtime.signature
            validate_inputs(request, signature.input_index, plan.max_batch_size)
            wanted, classes = requested_outputs(request, signature)
            deadline, _ = dataplane.request_deadlines(request, deadline)
            input_done = time.perf_counter_ns()
            tensors = {t.name: t for t in request.inputs}
            await _run_steps(plan, tensors, dataplane.infer, deadline, arrived, request.id)
            infer_done = time.perf_counter_ns()
            outputs = [_output(plan, spec.name, spec.datatype, tensors) for spec in wanted]
            if classes:
                outputs = classified(outputs, classes, plan)
            rows = request.inputs[0].shape[0] if plan.max_batch_size and request.inputs else 1
            stats.record_success(
                rows,
                0,
                input_done - started,
                infer_done - input_done,
                time.perf_counter_ns() - infer_done,
                executed=True,
            )
        except ServeError:
            stats.record_failure(time.perf_counter_ns() - started)
            raise
        finally:
            version.leave()
        return InferResponse(plan.name, str(version.version), outputs, request.id)


async def _run_steps(
    plan: ModelPlan,
    tensors: dict[str, Tensor],
    infer: Infer,
    deadline: float | None,
    arrived: float | None,
    request_id: str | None,
) -> None:
    """Run every step, each once its input tensors exist, adding its outputs to ``tensors``.

    A step that is the only one ready while none runs (a chain: featurise -> model ->
    post-process) is awaited as it is, with ``step=True``: no task, and a Python model measured
    light runs on the loop (DataPlane.infer). Steps ready together run as tasks at the same
    time, each in its own executor's threads. A tensor no step makes and the request left out
    (an optional pipeline input) is left out of the steps that take it too."""
    steps = plan.pipeline
    coming = {tensor for step in steps for tensor in step.outputs.values()}
    waiting = list(range(len(steps)))
    running: dict[asyncio.Task[InferResponse], int] = {}
    try:
        while waiting or running:
            ready = [i for i in waiting if not coming & set(steps[i].inputs.values())]
            if len(ready) == 1 and not running:  # a chain: no task, may run on the loop
                (index,) = ready
                waiting.remove(index)
                step = steps[index]
                request = _step_request(step, tensors, request_id)
                try:
                    response = await infer(request, deadline, arrived, step=True)
                except ServeError as exc:
                    raise _step_failed(plan.name, index, step, exc) from exc
                _keep(step, response, tensors, coming)
                continue
            for index in ready:
                waiting.remove(index)
                request = _step_request(steps[index], tensors, request_id)
                running[asyncio.ensure_future(infer(request, deadline, arrived))] = index
            if not running:  # the compiler refused cycles; a plan edited in place could not
                raise Internal(f"pipeline {plan.name!r}: steps {waiting} can never start")
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                index = running.pop(task)
                step = steps[index]
                try:
                    response = task.result()
                except ServeError as exc:
                    raise _step_failed(plan.name, index, step, exc) from exc
                _keep(step, response, tensors, coming)
    finally:
        for task in running:  # a step failed (or the request was cancelled): stop the others
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)


def _keep(
    step: PipelineStep, response: InferResponse, tensors: dict[str, Tensor], coming: set[str]
) -> None:
    """A finished step's outputs, as the pipeline's tensors (the same arrays)."""
    for output in response.outputs:
        name = step.outputs[output.name]
        tensors[name] = Tensor(name, output.datatype, output.shape, output.data)
    coming.difference_update(step.outputs.values())


def _step_request(
    step: PipelineStep, tensors: dict[str, Tensor], request_id: str | None
) -> InferRequest:
    """The request one step sends to its model: the pipeline's arrays under the model's names."""
    inputs = [
        Tensor(own, tensor.datatype, tensor.shape, tensor.data)
        for own, name in step.inputs.items()
        if (tensor := tensors.get(name)) is not None
    ]
    version = None if step.version is None else str(step.version)
    outputs = [RequestedOutput(own) for own in step.outputs]
    return InferRequest(step.model, inputs, version, request_id, outputs)


def _step_failed(pipeline: str, index: int, step: PipelineStep, exc: ServeError) -> ServeError:
    """The step's error with the step named; a step's model that is gone is the pipeline being
    unavailable, not an unknown model the client asked for."""
    where = f"pipeline {pipeline!r} step {index} (model {step.model!r})"
    if isinstance(exc, NotFound):
        return Unavailable(f"{where}: {exc.message}")
    named = copy.copy(exc)  # keeps the code and what goes with it (an overload's Retry-After)
    named.message = f"{where}: {exc.message}"
    named.args = (named.message,)
    return named


def _output(plan: ModelPlan, name: str, datatype: str, tensors: dict[str, Tensor]) -> Tensor:
    """Pipeline output ``name`` as a step made it, checked against the pipeline's metadata."""
    tensor = tensors.get(name)
    if tensor is None:
        raise InvalidArgument(
            f"pipeline {plan.name!r}: output {name!r} was not made (a step's optional input "
            "was left out?)"
        )
    if tensor.datatype != datatype:
        raise Internal(
            f"pipeline {plan.name!r}: output {name!r} is declared {datatype}, but its step "
            f"made {tensor.datatype}"
        )
    return tensor
