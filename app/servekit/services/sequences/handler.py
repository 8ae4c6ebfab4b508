"""Sequence models' requests (serve.yaml ``sequenceBatching``): the request kind the DataPlane
registers for a model with sequence batching. Each request is checked (its flags: flags.py; its
inputs: one row), queued on its sequence in the version's batcher (batcher.py, built on the
version's first request and closed with its executor) and accounted as any request.
"""

from __future__ import annotations

import asyncio
import time
import weakref

from servekit.config.compiler import ModelPlan
from servekit.errors import Internal, InvalidArgument, Unimplemented
from servekit.models.repository import ModelEntry, VersionEntry
from servekit.observability.request_ids import CURRENT, client_address
from servekit.services.account import Account
from servekit.services.deadlines import request_deadlines
from servekit.services.execution.executor import ModelExecutor
from servekit.services.execution.inputs import check_request
from servekit.services.sequences.batcher import SequenceBatcher, SequenceCounts
from servekit.services.sequences.flags import sequence_flags
from servekit.services.state import ServerState
from servekit.services.stats import Statistics
from servekit.types import InferRequest, InferResponse


class Sequences:
    """The sequence models' request kind: one batcher per loaded version, built on its first
    request and closed with the version's executor."""

    def __init__(self, statistics: Statistics, state: ServerState) -> None:
        self._statistics = statistics
        self._state = state
        self._batchers: weakref.WeakKeyDictionary[ModelExecutor, SequenceBatcher] = (
            weakref.WeakKeyDictionary()
        )

    def serves(self, plan: ModelPlan) -> bool:
        return plan.sequence is not None

    def batcher(self, entry: ModelEntry, version: VersionEntry) -> SequenceBatcher:
        runtime, executor = version.runtime, version.executor
        if runtime is None or not isinstance(executor, ModelExecutor):
            raise Internal(f"model {entry.plan.name!r} lost its runtime while in use")
        found = self._batchers.get(executor)
        if found is None:
            plan = entry.plan
            assert plan.sequence is not None
            if runtime.decoupled:
                raise Unimplemented(
                    f"model {plan.name!r} streams its responses (decoupled); sequence batching "
                    "is offered for models that answer once per request"
                )
            found = SequenceBatcher(
                plan.name,
                plan.sequence,
                runtime,
                version,
                plan.instances,
                plan.max_batch_size,
                plan.config.max_queue_size if plan.config is not None else 0,
                self._statistics.of(plan.name, version.version),
            )
            self._batchers[executor] = found
            executor.on_close.append(found.close)
        return found

    def counts(self, executor: object) -> SequenceCounts | None:
        """The sequence statistics of a version (by its executor), None before its first
        sequence request."""
        if not isinstance(executor, ModelExecutor):
            return None
        found = self._batchers.get(executor)
        return found.counts if found is not None else None

    async def infer(
        self,
        entry: ModelEntry,
        version: VersionEntry,
        request: InferRequest,
        deadline: float | None,
        arrived: float | None = None,
    ) -> InferResponse:
        """Run one request of a sequence (the handler of a sequence model's requests)."""
        started = time.perf_counter_ns()
        plan = entry.plan
        stats = self._statistics.of(plan.name, version.version)
        with Account(stats, plan.name, started) as account:
            account.hold(version)
            flags = sequence_flags(request)
            batcher = self.batcher(entry, version)
            runtime = version.runtime
            executor = version.executor
            assert runtime is not None and isinstance(executor, ModelExecutor)
            feed, wanted, classes, rows = check_request(
                request, runtime.signature, plan.max_batch_size
            )
            if classes:
                raise InvalidArgument("classification is not offered for a sequence model")
            if rows != 1:
                raise InvalidArgument(
                    f"inference request to model '{plan.name}' must specify batch-size 1 due "
                    "to requirements of sequence batcher"
                )
            if request.parameters or deadline is not None:
                deadline, _ = request_deadlines(request, deadline, self._state.request_timeout_s)
            input_done = time.perf_counter_ns()
            info = CURRENT.get()  # the adapter's: who sent it (no transport code here)
            client = client_address(info.client) if info is not None else None
            future = batcher.enqueue(flags, feed, [s.name for s in wanted], deadline, client)
            try:
                results, queue_ns, spent = await future
            except asyncio.CancelledError:
                batcher.abandon(future)
                raise
            infer_done = time.perf_counter_ns()
            outputs = executor.check.tensors(results, wanted)
            output_ns = time.perf_counter_ns() - infer_done
            account.succeeded(1, queue_ns, input_done - started, spent, output_ns, False)
        return InferResponse(plan.name, str(version.version), outputs, id=request.id)
