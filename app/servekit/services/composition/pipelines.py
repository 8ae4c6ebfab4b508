"""Pipelines (serve.yaml ``pipeline:``, Triton's ensembles): run their steps in this process.

The DataPlane hands a request for a pipeline here (the request kind registered for pipelines:
services/kinds.py). Each step is a request for its model as ``DataPlane.infer`` would run it
(steps.py: its call worked out once per model version; a step that is not a plain model goes through
``DataPlane.infer`` itself), so every step keeps its own executor, batching, queue limits and
statistics, and the arrays pass from one step to the next as they are (the same numpy objects: no
copy, no serialisation). Steps start as soon as their inputs exist, so independent steps run at the
same time; the pipeline's deadline (the first of the client's, its ``timeout`` parameter and
``server.requestTimeoutSeconds``) is every step's. A failing step fails the request with the step
and its model named, and the other running steps are cancelled (queued, they leave their queue
unrun)."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from servekit.config.compiler import ModelPlan
from servekit.config.schema import PipelineStep
from servekit.errors import Internal, InvalidArgument, NotFound, ServeError, Unavailable
from servekit.models.repository import ModelEntry, ModelRepository, State, VersionEntry
from servekit.results import IndexRow
from servekit.services.account import Account
from servekit.services.classification import classified
from servekit.services.composition.steps import StepCall, step_call
from servekit.services.deadlines import request_deadlines
from servekit.services.execution.inputs import requested_outputs, validate_inputs
from servekit.services.state import ServerState
from servekit.services.stats import Statistics
from servekit.types import InferRequest, InferResponse, RequestedOutput, Tensor

Infer = Callable[..., Awaitable[InferResponse]]
"""``DataPlane.infer``: a step that is not a plain model goes through it (``step=`` too)."""

READY = State.READY.value
UNAVAILABLE = State.UNAVAILABLE.value


def steps_waiting(repository: ModelRepository, plan: ModelPlan) -> str | None:
    """Why the pipeline ``plan`` cannot run: the first step whose model version is not READY,
    named with its reason (None: every step can run, so the pipeline may be READY). The one
    rule for a pipeline's readiness: ``/ready``, the repository index and the dashboard all ask
    it, so none of them calls a pipeline READY that fails every request."""
    for j, step in enumerate(plan.pipeline):
        version = None if step.version is None else str(step.version)
        named = f"model {step.model!r}" + ("" if version is None else f" version {version}")
        try:
            repository.resolve(step.model, version)
        except ServeError as exc:
            return f"step {j} ({named}) is not ready: {exc.message}"
        entry = repository.get(step.model)
        if entry.plan.pipeline:  # the compiler refused cycles, so this ends
            inner = steps_waiting(repository, entry.plan)
            if inner is not None:
                return f"step {j} ({named}) is not ready: {inner}"
    return None


def with_steps_waiting(repository: ModelRepository, rows: list[IndexRow]) -> list[IndexRow]:
    """The repository's index ``rows`` with a pipeline whose steps cannot run shown as
    UNAVAILABLE, its reason the step that waits (see ``steps_waiting``)."""
    waiting: dict[str, str | None] = {}
    out = []
    for row in rows:
        if row.state == READY:
            if row.name not in waiting:
                plan = repository.get(row.name).plan
                waiting[row.name] = steps_waiting(repository, plan) if plan.pipeline else None
            why = waiting[row.name]
            if why is not None:
                row = replace(row, state=UNAVAILABLE, reason=why)
        out.append(row)
    return out


class Pipelines:
    """The pipelines' request kind: runs their steps over the DataPlane's own inference
    (whether a pipeline's steps can run is ``steps_waiting``'s to say)."""

    def __init__(
        self,
        infer: Infer,
        statistics: Statistics,
        repository: ModelRepository,
        state: ServerState,
        callers: set[str],
    ) -> None:
        self._infer = infer
        self._statistics = statistics
        self._repository = repository
        self._state = state
        self._callers = callers
        """Models that have called another (ModelCalls.callers): never on the loop as a step."""
        self._plans: dict[str, _Plan] = {}
        """Each pipeline's steps as worked out for its plan in force (see ``_Plan``)."""

    def serves(self, plan: ModelPlan) -> bool:
        return bool(plan.pipeline)

    async def infer(
        self,
        entry: ModelEntry,
        version: VersionEntry,
        request: InferRequest,
        deadline: float | None,
        arrived: float | None,
    ) -> InferResponse:
        """Answer ``request`` for the pipeline ``entry`` by running its steps."""
        plan = entry.plan
        started = time.perf_counter_ns()
        if arrived is None:  # accepted now: its steps still run if a graceful stop begins
            arrived = time.monotonic()
        prepared = version.prepared
        if prepared is not None:
            stats = prepared.stats
        else:
            stats = self._statistics.of(plan.name, version.version)
        with Account(stats, plan.name, started) as account:
            account.hold(version)
            runtime = version.runtime
            if runtime is None:
                raise Internal(f"pipeline {plan.name!r} lost its runtime while in use")
            signature = runtime.signature
            checked = None
            if prepared is not None and prepared.signature is signature:
                checked = prepared.check(request)  # the common request; None: the general way
            if checked is None:
                validate_inputs(request, signature.input_index, plan.max_batch_size)
                wanted, classes = requested_outputs(request, signature)
            else:
                _, wanted, classes, _, _ = checked
            cap_s = self._state.request_timeout_s
            if request.parameters or deadline is not None or cap_s:
                deadline, _ = request_deadlines(request, deadline, cap_s)
            input_done = time.perf_counter_ns()
            tensors = {t.name: t for t in request.inputs}
            known = self._plans.get(plan.name)
            if known is None or known.plan is not plan:  # a new or edited pipeline
                known = self._plans[plan.name] = _Plan(plan)
            run = _Run(self, known, tensors, deadline, arrived, request.id)
            if known.chain:
                for index in range(len(known.plan.pipeline)):
                    await run.step(index, alone=True)
            else:
                await run.concurrently()
            infer_done = time.perf_counter_ns()
            outputs = [_output(plan, spec.name, spec.datatype, tensors) for spec in wanted]
            if classes:
                outputs = classified(outputs, classes, plan)
            rows = request.inputs[0].shape[0] if plan.max_batch_size and request.inputs else 1
            account.succeeded(
                rows,
                0,
                input_done - started,
                infer_done - input_done,
                time.perf_counter_ns() - infer_done,
                executed=True,
            )
        text = prepared.version_text if prepared is not None else str(version.version)
        return InferResponse(plan.name, text, outputs, request.id)


class _Plan:
    """A pipeline's steps as worked out once for its plan: whether they form a chain (each
    waits for the one before: run in turn, no tasks), each step's version as a request names
    it, and each step's call to the model version it last reached (steps.py; None:
    not worked out yet, or the step takes the general way)."""

    __slots__ = ("calls", "chain", "plan", "versions")

    def __init__(self, plan: ModelPlan) -> None:
        self.plan = plan
        steps = plan.pipeline
        self.versions = [None if s.version is None else str(s.version) for s in steps]
        self.calls: list[StepCall | None] = [None] * len(steps)
        self.chain = _is_chain(steps)


def _is_chain(steps: Sequence[PipelineStep]) -> bool:
    """Whether step ``i`` takes what step ``i - 1`` made and nothing from a later step, for
    every step: then exactly one step is ready at any time, in the order written, and running
    them in turn is what the general scheduler would do (an optional input the request left
    out changes nothing: it is left out either way)."""
    made: dict[str, int] = {}
    for index, step in enumerate(steps):
        for tensor in step.outputs.values():
            made[tensor] = index
    for index, step in enumerate(steps):
        sources = {made[t] for t in step.inputs.values() if t in made}
        if index and (index - 1) not in sources:
            return False
        if any(source >= index for source in sources):
            return False
    return True


class _Run:
    """One pipeline request's steps: each run by its StepCall, or through ``DataPlane.infer``."""

    __slots__ = ("_arrived", "_deadline", "_known", "_pipelines", "_request_id", "_tensors")

    def __init__(
        self,
        pipelines: Pipelines,
        known: _Plan,
        tensors: dict[str, Tensor],
        deadline: float | None,
        arrived: float,
        request_id: str | None,
    ) -> None:
        self._pipelines = pipelines
        self._known = known
        self._tensors = tensors
        self._deadline = deadline
        self._arrived = arrived
        self._request_id = request_id

    async def step(self, index: int, alone: bool) -> None:
        """Run step ``index``, adding its outputs to the tensors; its failure names it.
        ``alone``: no other step of this request runs (a light Python model may then run on
        the loop, ``ModelExecutor.step_placement``)."""
        known = self._known
        step = known.plan.pipeline[index]
        pipelines = self._pipelines
        try:
            entry, version = pipelines._repository.resolve(step.model, known.versions[index])
            call = known.calls[index]
            if call is None or not call.current(version):
                call = known.calls[index] = step_call(step, entry.plan, version)
            checked = None if call is None else call.feed(self._tensors)
            if call is not None and checked is not None:
                feed, rows = checked
                state = pipelines._state
                await call.run(
                    feed,
                    rows,
                    self._tensors,
                    self._deadline,
                    alone,
                    state.requests_in_progress,
                    pipelines._callers,
                )
                return
            request = _step_request(step, self._tensors, self._request_id)
            response = await pipelines._infer(request, self._deadline, self._arrived, step=alone)
        except ServeError as exc:
            raise _step_failed(known.plan.name, index, step, exc) from exc
        _keep(step, response, self._tensors)

    async def concurrently(self) -> None:
        """Run every step once its input tensors exist (steps ready together at the same time,
        as tasks, each in its own executor's threads). A step that is the only one ready while
        none runs is awaited as it is, alone. A tensor no step makes and the request left out
        (an optional pipeline input) is left out of the steps that take it too."""
        plan = self._known.plan
        steps = plan.pipeline
        coming = {tensor for step in steps for tensor in step.outputs.values()}
        waiting = list(range(len(steps)))
        running: dict[asyncio.Task[None], int] = {}
        try:
            while waiting or running:
                ready = [i for i in waiting if not coming & set(steps[i].inputs.values())]
                if len(ready) == 1 and not running:  # no task, may run on the loop
                    (index,) = ready
                    waiting.remove(index)
                    await self.step(index, alone=True)
                    coming.difference_update(steps[index].outputs.values())
                    continue
                for index in ready:
                    waiting.remove(index)
                    running[asyncio.ensure_future(self.step(index, alone=False))] = index
                if not running:  # the compiler refused cycles; a plan edited in place could not
                    raise Internal(f"pipeline {plan.name!r}: steps {waiting} can never start")
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    index = running.pop(task)
                    task.result()  # a step's failure, named
                    coming.difference_update(steps[index].outputs.values())
        finally:
            for task in running:  # a step failed (or the request was cancelled): stop the others
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)


def _keep(step: PipelineStep, response: InferResponse, tensors: dict[str, Tensor]) -> None:
    """A finished step's outputs, as the pipeline's tensors (the same arrays)."""
    for output in response.outputs:
        name = step.outputs[output.name]
        tensors[name] = Tensor(name, output.datatype, output.shape, output.data)


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
