"""What the executor (executor.py) works with: its settings from serve.yaml, the requests it holds
(Job) and the model calls it hands to worker threads (Work)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from servekit.config.compiler import ROW_WISE, ModelPlan
from servekit.observability.request_ids import CURRENT
from servekit.runtimes.base import Arrays
from servekit.services.execution import batching


class JobState(Enum):
    QUEUED = 1
    RUNNING = 2
    DONE = 3


@dataclass(frozen=True, slots=True)
class ExecutorSettings:
    """What the executor of a version needs from serve.yaml."""

    instances: int
    inline_below_ns: int
    max_queue_size: int
    queue_timeout_s: float
    batch_rows: int
    """Most rows a call stacks from the requests waiting: maxBatchSize when dynamic batching is
    on, ``ROW_BATCH`` for a row-wise model that sets neither, else 0 (one request per call)."""
    preferred: frozenset[int]

    @classmethod
    def of(cls, plan: ModelPlan, inline_below_ns: int) -> ExecutorSettings:
        """The settings of ``plan``'s executor; ``inline_below_ns`` is the server's bound in
        force (ServerState.inline_below_ns), which the DataPlane keeps current afterwards."""
        config = plan.config
        dynamic = config.dynamic_batching if config is not None else None
        return cls(
            instances=max(1, plan.instances),
            inline_below_ns=inline_below_ns,
            max_queue_size=config.max_queue_size if config is not None else 0,
            queue_timeout_s=(config.queue_timeout_microseconds / 1e6) if config else 0.0,
            batch_rows=_batch_rows(plan, dynamic is not None),
            preferred=frozenset(dynamic.preferred_batch_size) if dynamic else frozenset(),
        )


ROW_BATCH = 64
"""Most rows a call of a row-wise model (a scikit-learn, XGBoost or LightGBM model) stacks when
serve.yaml sets no ``maxBatchSize``: its library answers each row on its own, and most of a call
of a few rows is the library's own per-call cost (an SVC on the 8x8 digits: 101 us for one row,
417 us for 16), so the requests waiting for it share one call. As with ``dynamicBatching``, a
request never waits for company while the model is free."""


def _batch_rows(plan: ModelPlan, dynamic: bool) -> int:
    """Rows a call may stack (``ExecutorSettings.batch_rows``). A ``maxBatchSize`` without
    ``dynamicBatching`` is Triton's meaning, no batching: the way to turn the default off."""
    if dynamic:
        return plan.max_batch_size
    if plan.max_batch_size == 0 and plan.implementation in ROW_WISE and plan.sequence is None:
        return ROW_BATCH
    return 0


class Job:
    """One request in the executor: queued, running (in a call, maybe with others) or done."""

    __slots__ = (
        "deadline",
        "enqueued_ns",
        "expiry",
        "feed",
        "future",
        "key",
        "outputs",
        "request",
        "rows",
        "state",
        "step",
        "timer",
        "work",
    )

    def __init__(
        self,
        feed: Arrays,
        outputs: tuple[str, ...],
        rows: int,
        key: batching.Key,
        deadline: float | None,
        expiry: float | None,
        future: asyncio.Future[tuple[Arrays, int, int]],
    ) -> None:
        self.feed = feed
        self.outputs = outputs
        self.rows = rows
        self.key = key
        self.deadline = deadline
        """When the request as a whole expires (time.monotonic()), if ever."""
        self.expiry = expiry
        """When it must have started: the deadline or the queue timeout, whichever is first."""
        self.future = future
        self.enqueued_ns = time.perf_counter_ns()
        self.state = JobState.QUEUED
        self.timer: asyncio.TimerHandle | None = None
        self.work: Work | None = None
        self.request = CURRENT.get()
        """The request it serves, for the log records of its call in a worker thread."""
        self.step = False
        """A pipeline's only running step, which may run on the loop when its version's
        ``step_placement`` says so (ModelExecutor.submit)."""


class Work:
    """One model call handed to a worker thread: its requests, their stacked feed, the result."""

    __slots__ = (
        "cancel",
        "deadline",
        "error",
        "feed",
        "jobs",
        "outputs",
        "probe",
        "request",
        "results",
        "spent_ns",
        "started_ns",
    )

    def __init__(self, jobs: list[Job], feed: Arrays, outputs: list[str]) -> None:
        self.jobs = jobs
        self.feed = feed
        self.outputs = outputs
        self.cancel = threading.Event()
        self.deadline = _latest(job.deadline for job in jobs)
        """When nobody waits for this call's answer any more (the latest of its requests'
        deadlines; None if one has none): a runtime reads it as CALL_DEADLINE
        (app/servekit/runtimes/base.py), e.g. an isolated model to not start a call nobody
        waits for."""
        self.started_ns = time.perf_counter_ns()
        self.results: Arrays | None = None
        self.error: BaseException | None = None
        self.spent_ns = 0
        self.request = jobs[0].request if len(jobs) == 1 else None
        """The request of an unbatched call: its log records name it
        (app/servekit/observability/logs.py)."""
        self.probe: threading.Event | None = None
        """Set by the worker thread when the call is done, for a call the loop waits for
        (a learning version's timed call: see ModelExecutor.submit)."""


def _latest(deadlines: Iterable[float | None]) -> float | None:
    latest: float | None = None
    for deadline in deadlines:
        if deadline is None:
            return None
        latest = deadline if latest is None else max(latest, deadline)
    return latest
