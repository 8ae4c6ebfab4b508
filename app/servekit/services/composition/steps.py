"""A pipeline step's call to its model, worked out once per step and model version.

Run as a full ``DataPlane.infer`` request, a step paid what a client's request pays: a request
object built, every input checked against the metadata the long way, the outputs asked for
looked up, the answer wrapped, on top of the model's own call. For a pipeline of light steps that
was more than the steps' compute (issue 29: 3 passes a request against one for a single model
doing the same). A :class:`StepCall` holds what depends only on the step and the model version
it reaches: the version's statistics, the datatype, rank and fixed dimensions each mapped input
must have, the output specs and the names they take in the pipeline. It is built the first time
a step meets a version and replaced when the step resolves to another version or the version's
runtime reports another signature; the step's model is resolved on every request and the
executor read off the version at each call, so a new serving version, an unload or a reload is
honoured at once, and an unloaded runtime is never kept alive here.

The fast way covers the common step only: a plain model (no sequence batching, not itself a
pipeline, not tabular) whose mapped inputs all exist and pass their checks. Anything else returns
None and the caller sends the step through ``DataPlane.infer``, which answers or refuses it with
the same words as any request (so no refusal is worded twice).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from servekit.config.compiler import ModelPlan
from servekit.config.schema import PipelineStep
from servekit.errors import DeadlineExceeded, Internal
from servekit.models.repository import VersionEntry
from servekit.services.account import Account
from servekit.services.execution.executor import ModelExecutor
from servekit.services.stats import VersionStats
from servekit.types import ModelSignature, Tensor, TensorSpec

_Input = tuple[str, str, str, int, tuple[tuple[int, int], ...]]
"""A mapped input: the model's name for it, the pipeline tensor it reads, its datatype, rank
and (index, size) of its fixed dimensions."""


class StepCall:
    """One step's call to one loaded version of its model (see the module docstring)."""

    __slots__ = (
        "_bound",
        "_inputs",
        "_names",
        "_renames",
        "_wanted",
        "model",
        "signature",
        "stats",
        "version",
    )

    def __init__(
        self,
        model: str,
        version: VersionEntry,
        signature: ModelSignature,
        stats: VersionStats,
        inputs: tuple[_Input, ...],
        wanted: list[TensorSpec],
        renames: tuple[str, ...],
        bound: int,
    ) -> None:
        self.model = model
        self.version = version
        self.signature = signature
        """What the checks were worked out from (another one: work them out again)."""
        self.stats = stats
        self._inputs = inputs
        self._wanted = wanted
        self._names = [spec.name for spec in wanted]
        self._renames = renames
        self._bound = bound

    def current(self, version: VersionEntry) -> bool:
        """Whether this call still fits ``version`` (the one the step resolved to now)."""
        runtime = version.runtime
        return (
            version is self.version and runtime is not None and runtime.signature is self.signature
        )

    def feed(self, tensors: dict[str, Tensor]) -> tuple[dict[str, Any], int] | None:
        """The model's feed and rows from the pipeline's tensors, or None: an input is missing
        (an optional one left out) or fails a check, and the general way words it."""
        feed: dict[str, Any] = {}
        bound = self._bound
        rows = 0
        for own, source, datatype, rank, fixed in self._inputs:
            tensor = tensors.get(source)
            if tensor is None or tensor.datatype != datatype:
                return None
            shape = tensor.shape
            if len(shape) != rank:
                return None
            for index, size in fixed:
                if shape[index] != size:
                    return None
            if bound > 0 and shape:
                if shape[0] > bound:
                    return None
                if not rows:
                    rows = shape[0]
            feed[own] = tensor.data
        return feed, (rows or 1)

    async def run(
        self,
        feed: dict[str, Any],
        rows: int,
        tensors: dict[str, Tensor],
        deadline: float | None,
        alone: bool,
        in_progress: Callable[[], int],
        callers: set[str],
    ) -> None:
        """Run the model on ``feed`` and add its outputs to ``tensors`` under the pipeline's
        names, as ``DataPlane.infer`` would run it (on the loop if measured fast, else in its
        threads through its queue, with the pipeline's deadline) and count it in the model's
        statistics. ``alone``: the pipeline's only running step, which a light Python model
        may run on the loop (``ModelExecutor.step_placement``) unless it calls other models."""
        started = time.perf_counter_ns()
        with Account(self.stats, self.model, started) as account:
            account.hold(self.version)
            if deadline is not None and deadline <= time.monotonic():
                raise DeadlineExceeded(
                    f"model {self.model!r}: the request's deadline had passed when it arrived"
                )
            executor = self.version.executor
            if not isinstance(executor, ModelExecutor):  # unloaded since it was resolved
                raise Internal(f"model {self.model!r} lost its runtime while in use")
            names = self._names
            input_done = time.perf_counter_ns()
            inline = True
            queue_ns = 0
            ran = executor.run_now(feed, names, rows, in_progress, input_done)
            if ran is not None:
                results, infer_done = ran
                spent = infer_done - input_done
            elif (step := alone and self.model not in callers) and executor.step_inline(
                rows, in_progress
            ):
                results, spent = executor.run_inline(feed, names, rows, step=True)
                infer_done = input_done + spent
            else:
                inline = False
                results, queue_ns, spent = await executor.submit(
                    feed, names, rows, deadline, None, step
                )
                infer_done = time.perf_counter_ns()
            outputs = executor.check.tensors(results, self._wanted)
            for name, tensor in zip(self._renames, outputs, strict=True):
                tensors[name] = Tensor(name, tensor.datatype, tensor.shape, tensor.data)
            output_ns = time.perf_counter_ns() - infer_done
            account.succeeded(rows, queue_ns, input_done - started, spent, output_ns, inline)


def step_call(step: PipelineStep, plan: ModelPlan, version: VersionEntry) -> StepCall | None:
    """The call of ``step`` to ``version`` of its model (``plan``), or None when the step
    takes the general way (see the module docstring)."""
    runtime, executor, prepared = version.runtime, version.executor, version.prepared
    if (
        plan.pipeline
        or plan.sequence is not None
        or runtime is None
        or not isinstance(executor, ModelExecutor)
        or prepared is None
        or prepared.signature is not runtime.signature
    ):
        return None
    signature = runtime.signature
    if signature.tabular is not None:  # inputs are content types, outputs are marked
        return None
    by_name = signature.input_index
    if any(not spec.optional and name not in step.inputs for name, spec in by_name.items()):
        return None  # a required input unmapped: the general way refuses it
    inputs = []
    for own, source in step.inputs.items():
        spec = by_name.get(own)
        if spec is None:
            return None
        fixed = tuple((i, d) for i, d in enumerate(spec.shape) if d >= 0)
        inputs.append((own, source, spec.datatype, len(spec.shape), fixed))
    outputs = signature.output_index
    if any(own not in outputs for own in step.outputs):
        return None
    wanted = [outputs[own] for own in step.outputs]
    renames = tuple(step.outputs.values())
    return StepCall(
        plan.name,
        version,
        signature,
        prepared.stats,
        tuple(inputs),
        wanted,
        renames,
        plan.max_batch_size,
    )
