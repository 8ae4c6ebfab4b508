"""What the DataPlane works out when a version loads, so that no request does: the version's
executor (app/servekit/services/execution/executor.py), its per-request constants
(prepared.py) and the handler of its request kind (kinds.py: a pipeline, a sequence model; none
for a plain model). The repository calls :class:`VersionSetup` as its ``on_loaded`` hook; a new
plan in force re-tunes the executors (``retune``).
"""

from __future__ import annotations

import asyncio
import contextlib

from servekit.config.compiler import ModelPlan
from servekit.models.repository import ModelRepository, VersionEntry
from servekit.services.composition.model_calls import ModelCalls
from servekit.services.execution.executor import ModelExecutor
from servekit.services.execution.jobs import ExecutorSettings
from servekit.services.kinds import RequestKind, handler_for
from servekit.services.prepared import PreparedVersion
from servekit.services.state import ServerState
from servekit.services.stats import Statistics


class VersionSetup:
    """Builds a loaded version's executor, prepared constants and kind (see the module
    docstring)."""

    def __init__(
        self,
        state: ServerState,
        repository: ModelRepository,
        statistics: Statistics,
        kinds: tuple[RequestKind, ...],
        calls: ModelCalls,
    ) -> None:
        self._state = state
        self._repository = repository
        self._statistics = statistics
        self._kinds = kinds
        self._calls = calls

    def __call__(self, plan: ModelPlan, version: VersionEntry) -> ModelExecutor:
        """The executor of a version that has just loaded (the repository's load hook)."""
        assert version.runtime is not None
        stats = self._statistics.of(plan.name, version.version)
        runtime = version.runtime
        # A runtime whose outputs are trusted is servekit's own (ONNX): it only reads the
        # output names it is given, so the common request's lists are shared, not copied.
        version.prepared = PreparedVersion(
            runtime.signature,
            plan.max_batch_size,
            stats,
            version.version,
            runtime.outputs_trusted,
            handler_for(self._kinds, plan),
        )
        settings = ExecutorSettings.of(plan, self._state.inline_below_ns)
        with contextlib.suppress(RuntimeError):  # loaded on the loop: models' calls run there
            self._calls.loop = asyncio.get_running_loop()
        executor = ModelExecutor(plan.name, version, version.runtime, stats, settings)
        state = self._state
        executor.in_progress = lambda: state.requests_in_progress()  # (set after start)
        executor.read_together = lambda: state.read_together()
        return executor

    def retune(self) -> None:
        """A new plan is in force: executors learnt against another inline bound start over."""
        bound = self._state.inline_below_ns
        for entry in self._repository.entries():
            for version in entry.versions.values():
                executor = version.executor
                if isinstance(executor, ModelExecutor) and executor.placement.threshold_ns != bound:
                    executor.retune(bound)
