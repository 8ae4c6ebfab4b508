"""The executor of one loaded model version: the one place that decides how a request reaches
the model's compute.

* **On the event loop** (no thread hop) only for versions of a runtime that cannot block
  (``may_run_inline``: ONNX Runtime, a tabular library's own model, never Python code)
  measured fast, as placement.py decides (never a new version's first calls, never a version
  that keeps being slow), and only for requests no larger than a call already timed fast.
* **Otherwise in its own worker threads**, one per instance (``instances``), each with its own
  session or Python object (``ModelRuntime.predictor``). A model that hangs or raises
  only ever occupies its own threads and fills its own queue: other models, model loading
  (the loop's default executor) and the loop itself are not affected.

Requests wait in a queue bounded by ``maxQueueSize`` (one more: Overloaded, HTTP 429). Each may
carry a deadline (the client's, its ``timeout`` parameter, ``server.requestTimeoutSeconds``: the
first) and bounds on its wait (``timeout`` again, the model's ``queueTimeoutMicroseconds``): a
request expired while queued is answered DeadlineExceeded and never starts; one whose deadline
passes while it runs is answered DeadlineExceeded at once. A request whose awaiting coroutine is
cancelled (client gone) leaves the queue; if it is already running, its call's cancel flag
(app/servekit/runtimes/cancel.py) is set once every request of that call is abandoned. The version's
in-flight count follows the thread, not the request: an abandoned call counts until its thread
returns, so unload and drain see the truth.

With dynamic batching, a batch leaves as soon as an instance is free (batching.py says which
requests go together), one loop pass after its first request arrived so that the requests decoded in
the same pass join it. A batch of several requests always runs in the version's threads, where the
requests arriving meanwhile queue up for the next one. A request that is the only one the listeners
hold (low load; the HTTP listener counts one more while it reads several requests a loop pass: the
load signal, app/servekit/services/execution/load.py) runs on the loop when the version's
single-request calls are measured fast, as an unbatched version's would: at one request in flight a
batching model then costs what an unbatched one costs, not a loop pass and a thread hop; one that
must run in the threads starts there at once, without the loop pass. A batch of one request with
others in progress elsewhere in the server runs in the threads: on the loop it would hold back the
requests that could join the next batch. Batching is on with serve.yaml's ``dynamicBatching``, and
by default for row-wise models (scikit-learn, XGBoost, LightGBM; ``ExecutorSettings.batch_rows``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable

from servekit.errors import DeadlineExceeded, Internal, Overloaded, Unavailable
from servekit.models.repository import VersionEntry
from servekit.observability import tracing
from servekit.observability.request_ids import CURRENT, RequestInfo
from servekit.observability.tracing import TRACING
from servekit.runtimes import cancel
from servekit.runtimes.base import CALL_DEADLINE, Arrays, ModelRuntime, Predict
from servekit.services.execution import batching
from servekit.services.execution.jobs import ExecutorSettings, Job, JobState, Work
from servekit.services.execution.outputs import OutputCheck
from servekit.services.execution.placement import Mode, Placement
from servekit.services.stats import VersionStats

DEADLINE_SOURCES = (
    "the client's deadline, its 'timeout' parameter or server.requestTimeoutSeconds, whichever "
    "is first"
)
"""What a deadline in an answer may have come from (app/servekit/services/deadlines.py)."""

log = logging.getLogger("servekit.executor")


class ModelExecutor:
    """Runs the requests of one loaded model version (see the module docstring)."""

    def __init__(
        self,
        name: str,
        version: VersionEntry,
        runtime: ModelRuntime,
        stats: VersionStats,
        settings: ExecutorSettings,
    ) -> None:
        self.name = name
        self.settings = settings
        self.check = OutputCheck(
            name, runtime.signature, runtime.loose_outputs, runtime.outputs_trusted
        )
        self._version = version
        self._runtime = runtime
        self._stats = stats
        self.placement = Placement(  # only a runtime that cannot block may run on the loop
            name, settings.inline_below_ns, may_inline=runtime.may_run_inline
        )
        self.step_placement = (
            None
            if runtime.may_run_inline
            else Placement(name, settings.inline_below_ns, may_inline=True)
        )
        """Where this version runs as a step of a pipeline (services/composition/pipelines.py),
        for a runtime that may block (Python): learnt from its calls in threads like any
        placement, and used only by a pipeline request whose only running step it is, so a
        light featurise or post-process step costs no thread hop. A slow call on the loop sends
        it back to learning; too many, and it stays in its threads."""
        self._queue: deque[Job] = deque()
        self.held = 0
        """Requests submitted and not yet done (queued or running): ``load`` reads it."""
        self._inbox: queue.SimpleQueue[Work | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = settings.instances
        self._avg_ns = 0.0
        self._closed = False
        self.on_close: list[Callable[[], None]] = []
        """Called when the version is retired: what else runs this version's calls (a
        sequence model's batcher, app/servekit/services/sequences/) stops with it."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._soon: asyncio.Handle | None = None
        self._probing = False
        self.in_progress: Callable[[], int] = _one
        """How many requests the server's listeners hold (``Load.in_progress``,
        app/servekit/services/execution/load.py; the DataPlane sets it): a batching version's
        lone request runs on the loop only when it is the only one (``run_now``,
        ``_lone_call``)."""
        self.read_together: Callable[[], int] = _zero
        """1 while the HTTP listener reads several requests a loop pass (``Load.read_together``,
        app/servekit/services/execution/load.py; the DataPlane sets it): an unbatched
        version's requests then run back to back at the pass's end (``run_now``,
        ``_gathers``)."""
        self._fast_rows = 0
        """The most rows of a call of one request timed within the inline bound: a request
        with more never runs on the loop (a model measured fast on one row may take far longer
        on a thousand). Grows as larger calls are timed fast, in threads or on the loop."""

    # -- on the loop --------------------------------------------------------------------------
    @property
    def mode(self) -> Mode:
        return self.placement.mode

    def step_inline(self, rows: int, in_progress: Callable[[], int]) -> bool:
        """Whether a call made by a pipeline's step runs on the loop now (as ``run_now``
        decides, placed by ``step_placement``)."""
        step = self.step_placement
        return (
            step is not None
            and step.mode is Mode.INLINE
            and rows <= self._fast_rows
            and self._idle == self.settings.instances
            and not self._queue
            and (not self.settings.batch_rows or in_progress() == 1)
        )

    def retune(self, threshold_ns: int) -> None:
        """A new inline bound (a live edit): learn where calls run over again."""
        self.placement.retune(threshold_ns)
        if self.step_placement is not None:
            self.step_placement.retune(threshold_ns)
        self._fast_rows = 0

    @property
    def queued(self) -> int:
        return len(self._queue)

    def load(self) -> tuple[int, int]:
        """Requests waiting in the queue (not started) and those taken by the model's
        instances (started, not answered): the scaling gauges of /metrics. Requests run on the
        loop never show: they start and end within one step of it."""
        queued = len(self._queue)
        return queued, self.held - queued

    def run_now(
        self,
        feed: Arrays,
        outputs: list[str],
        rows: int,
        in_progress: Callable[[], int],
        started: int,
        patient: bool = True,
    ) -> tuple[Arrays, int] | None:
        """Run the request on the loop now if it may, in one call (the common request's):
        None when it does not (the caller submits it), else its results and the clock
        (``time.perf_counter_ns``) at the call's end. ``started`` is the caller's own clock
        read just before (its checks' end), so the call is timed from there with no read of
        its own: the few instructions of the test below count as model time.

        It runs now when measured fast, no larger than a call already timed fast, and nothing
        is in flight (an instance busy in a thread must not be used by the loop at the same
        time). A batching version's request runs now only when it is the one request the
        server's listeners hold (``in_progress()``, app/servekit/services/execution/load.py): with
        others in progress, some may be about to reach this model in the same loop pass, so
        the request queues for one pass to let them join (``submit``). At one request in
        flight batching then costs nothing, not even that pass.

        An unbatched version's request read with others in one pass (``read_together``)
        queues for that pass too, and the pass's calls then run one after the other
        (``_gathers``): a model's call made between other requests' reads, decodes and writes
        finds its code and data gone from the core's caches (the tiny MLP's onnxruntime call:
        14-19 us there, 4.6 us in a loop; the second of two calls back to back 5.8 us). Not
        when it must start at once (``patient`` False: a ``timeout`` parameter, or the model's
        ``queueTimeoutMicroseconds``): it runs now, as it did before."""
        if (
            self.placement.mode is not Mode.INLINE
            or rows > self._fast_rows
            or self._idle != self.settings.instances
        ):
            return None
        if self.settings.batch_rows:
            if self._queue or in_progress() != 1:
                return None
        elif (
            self._may_wait(patient)
            and (self._queue or self.read_together())
            and self._room(len(self._queue) + 1)
        ):
            return None  # every instance idle: what queued is the pass's, run at its end
        return self._call_here(feed, outputs, rows, started, self.placement)

    def _room(self, gathered: int) -> bool:
        """Whether an unbatched version's pass may hold ``gathered`` requests to run back to
        back: within ``maxQueueSize`` (one that finds no room runs at once rather than be
        refused for waiting a pass), and their calls together, at the version's recent time
        per call, within the inline bound, the longest the loop may be held by one model at a
        time (a longer stretch of calls would also be preempted more often mid-call, and
        sent the version back to its threads)."""
        limit = self.settings.max_queue_size
        return (not limit or gathered <= limit) and (
            gathered * self._avg_ns <= self.placement.threshold_ns
        )

    def run_inline(
        self, feed: Arrays, outputs: list[str], rows: int, step: bool = False
    ) -> tuple[Arrays, int]:
        """Run on the loop thread; returns the results and the wall time of the call
        (``step``: as a pipeline's step, placed by ``step_placement``)."""
        started = time.perf_counter_ns()
        placement = self.step_placement if step and self.step_placement else self.placement
        results, ended = self._call_here(feed, outputs, rows, started, placement)
        return results, ended - started

    def _call_here(
        self, feed: Arrays, outputs: list[str], rows: int, started: int, placement: Placement
    ) -> tuple[Arrays, int]:
        """The model call on the loop thread, timed from ``started``: its results and the
        clock at its end; the time teaches ``placement`` (and ``_fast_rows``)."""
        traced = self._traced_here(CURRENT.get(), None, rows) if TRACING.on else None
        try:
            results = self._runtime.predict(feed, outputs)
        except (Exception, KeyboardInterrupt):  # the model's own error, or the user's interrupt
            raise
        except BaseException as exc:  # exit() in model code and the like: on the loop it
            raise _raised(exc) from None  # would stop the server; here it fails this request
        finally:
            if traced is not None:
                traced.end(sys.exc_info()[1])
        ended = time.perf_counter_ns()
        spent = ended - started
        self._avg_ns += 0.2 * (spent - self._avg_ns)  # what a pass may gather (``_room``)
        if spent > placement.threshold_ns or placement.strikes:
            placement.timed_inline(spent)
        elif rows > self._fast_rows:  # else nothing to note
            self._fast_rows = rows
        return results, ended

    async def submit(
        self,
        feed: Arrays,
        outputs: list[str],
        rows: int,
        deadline: float | None,
        queue_by: float | None = None,
        step: bool = False,
    ) -> tuple[Arrays, int, int]:
        """Queue one request and wait for it: its results, queue time and compute time (ns).

        ``deadline``: when the request expires, queued or running; ``queue_by``: when it must
        have started (the ``timeout`` parameter); both ``time.monotonic()`` seconds. ``step``:
        a pipeline's only running step, which may catch up on the loop (``_catch_up``) as
        ``step_inline`` would have let it run there.
        """
        if self._closed:
            raise Unavailable(f"model {self.name!r}: this version is unloading")
        limit = self.settings.max_queue_size
        if limit and len(self._queue) >= limit:
            raise Overloaded(
                f"model {self.name!r} has {len(self._queue)} requests waiting (maxQueueSize "
                f"{limit}); retry later",
                self._retry_after(),
            )
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        expiry = queue_by if deadline is None or (queue_by and queue_by < deadline) else deadline
        if self.settings.queue_timeout_s:
            by = time.monotonic() + self.settings.queue_timeout_s
            expiry = by if expiry is None else min(expiry, by)
        key = batching.batch_key(feed) if self.settings.batch_rows else ()
        job = Job(feed, tuple(outputs), rows, key, deadline, expiry, loop.create_future())
        job.step = step
        self._version.enter()
        self.held += 1
        self._queue.append(job)
        if expiry is not None:
            job.timer = loop.call_later(max(0.0, expiry - time.monotonic()), self._expire, job)
        if self._idle:
            # Requests decoded in this same loop pass may join (batching, unless this is the
            # one request the listeners hold: it starts now, as an unbatched one would), or run
            # right after (an unbatched version on the loop: ``_gathers``).
            if (
                self.settings.batch_rows and (len(self._queue) > 1 or self.in_progress() != 1)
            ) or self._gathers(job, queue_by is None):
                if self._soon is None:
                    self._soon = loop.call_soon(self._dispatch)
            elif self.placement.mode is Mode.LEARNING and self._idle == self.settings.instances:
                self._probe(job)
            else:
                self._dispatch(fresh=job)
        try:
            return await job.future
        except asyncio.CancelledError:
            self._abandon(job)
            raise

    def _may_wait(self, patient: bool) -> bool:
        """Whether a request may wait for the end of the loop pass: not one that must start at
        once (``patient`` False: a ``timeout`` parameter; or the model's
        ``queueTimeoutMicroseconds``). A deadline alone does not stop it: one that passes
        while it waits fails it, as it would anywhere."""
        return patient and not self.settings.queue_timeout_s

    def _gathers(self, job: Job, patient: bool) -> bool:
        """Whether an unbatched version's request waits for the end of the loop pass, to run
        on the loop right after the others read in that pass (``_dispatch``, ``_catch_up``):
        measured fast, every instance idle, read with others (``read_together``), and allowed
        to wait (``_may_wait``)."""
        return (
            self.placement.mode is Mode.INLINE
            and self._idle == self.settings.instances
            and job.rows <= self._fast_rows
            and self._may_wait(patient)
            and (self._soon is not None or self.read_together() != 0)
            and self._room(len(self._queue))
        )

    def _probe(self, job: Job, queued: bool = True) -> None:
        """Start a learning version's call and wait for it, at most the inline bound, with the
        GIL released. The worker thread then times the model alone: while the loop runs, a
        call in a thread also waits for the GIL (up to the 5 ms switch interval), so under load
        a fast model timed that way always looked slow and never reached the loop. Waiting
        here blocks the loop no longer than an inline call may take; a call that takes longer
        goes on in its thread and answers as any other."""
        self._probing = True
        try:
            if queued:
                self._dispatch(fresh=job)
            else:  # already taken from the queue (a batching version's lone request)
                self._start([job])
        finally:
            self._probing = False
        work = job.work
        if work is not None and work.probe is not None:
            work.probe.wait(self.placement.threshold_ns / 1e9)

    def close(self) -> None:
        """Stop the worker threads (each after its current call) and refuse what is queued."""
        self._closed = True
        for close in self.on_close:
            close()
        while self._queue:
            job = self._queue.popleft()
            self._done(job)
            if not job.future.done():
                job.future.set_exception(Unavailable(f"model {self.name!r} was unloaded"))
        for _ in self._threads:
            self._inbox.put(None)

    def _dispatch(self, fresh: Job | None = None) -> None:
        """Start queued requests while instances are free (``fresh``: a request that just
        arrived to a free instance, so it never waited and cannot have expired waiting)."""
        self._soon = None
        while self._idle and self._queue and not self._closed:
            if self.settings.batch_rows:
                jobs, reason = batching.take(
                    self._queue, self.settings.batch_rows, self.settings.preferred
                )
            else:
                jobs, reason = [self._queue.popleft()], ""
            now = time.monotonic()
            live = []
            for job in jobs:
                if job.future.done():  # cancelled this pass: its task has yet to see it
                    self._done(job)
                elif job.expiry is not None and now >= job.expiry and job is not fresh:
                    self._fail_queued(job, now)  # timers have ms resolution: never run it late
                else:
                    live.append(job)
            if not live:
                continue
            if reason:
                self._stats.record_dispatch(reason)
            lone = len(live) == 1 and not self._queue  # not one of a backlog that cannot stack
            if lone and self.settings.batch_rows and self._lone_call(live[0]):
                continue
            if live[0] is not fresh and self._catch_up(live[0]):
                continue
            self._start(live)

    def _catch_up(self, job: Job) -> bool:
        """Run on the loop a request of an unbatched version measured fast there that queued
        behind a call in a thread (learning, or sent back to learning by a slow call), now that
        every instance is idle; True if it ran. Without this, at steady concurrency each request
        queues behind the previous one's thread call, and a version measured fast never gets
        back to the loop: every request paid a thread hop (pipeline steps at 16 in flight)."""
        if self.settings.batch_rows or self._idle != self.settings.instances:
            return False
        placement = self.placement
        if placement.mode is not Mode.INLINE:
            step = self.step_placement
            if not job.step or step is None or step.mode is not Mode.INLINE:
                return False
            placement = step
        if job.rows > self._fast_rows:
            return False
        self._run_here(job, placement)
        return True

    def _lone_call(self, job: Job) -> bool:
        """A batching version's request that found nobody to batch with, an empty queue, every
        instance idle and no other request in progress in the server: run it on the loop if
        measured fast, or start it in a thread as a learning version's timed call (the probe);
        True if either was done, False to let the caller start it in a thread as usual.

        With others in progress (``in_progress() > 1``), it goes to a thread: a call on the
        loop, or the probe's wait, holds the loop while requests that could join the next
        batch are being read (medium model, REST binary at 64 in flight: half the model runs
        were of one row, each costing 3.5 times a batched row's compute)."""
        if self._idle != self.settings.instances or self.in_progress() > 1:
            return False  # others in progress may join the next batch: the loop stays free
        mode = self.placement.mode
        if mode is Mode.INLINE and job.rows <= self._fast_rows:
            self._run_here(job)
            return True
        if mode is Mode.LEARNING:
            self._probe(job, queued=False)
            return True
        return False

    def _run_here(self, job: Job, placement: Placement | None = None) -> None:
        """Run one request on the loop thread (see _lone_call and _catch_up), timed against
        ``placement`` (the version's own, or its ``step_placement``)."""
        work = Work([job], job.feed, list(job.outputs))
        job.state = JobState.RUNNING
        job.work = work
        self._idle -= 1
        interrupted: KeyboardInterrupt | None = None
        traced = self._traced_here(job.request, job.enqueued_ns, job.rows) if TRACING.on else None
        try:
            work.results = self._runtime.predict(work.feed, work.outputs)
        except Exception as exc:
            work.error = exc
        except KeyboardInterrupt as exc:  # the user's: answered, then passed on
            work.error = _raised(exc)
            interrupted = exc
        except BaseException as exc:  # exit() in model code and the like, as in a thread
            work.error = _raised(exc)
        work.spent_ns = spent = time.perf_counter_ns() - work.started_ns
        if traced is not None:
            traced.end(work.error)
        if placement is None:
            placement = self.placement
        if spent > placement.threshold_ns or placement.strikes:
            placement.timed_inline(spent)
        elif job.rows > self._fast_rows:
            self._fast_rows = job.rows
        self._complete(work)
        if interrupted is not None:
            raise interrupted

    def _start(self, jobs: list[Job]) -> None:
        feed, outputs = batching.stack(jobs)
        work = Work(jobs, feed, outputs)
        if self._probing:
            work.probe = threading.Event()
        for job in jobs:
            job.state = JobState.RUNNING
            job.work = work
        self._idle -= 1
        if len(self._threads) < self.settings.instances:
            self._spawn()
        self._inbox.put(work)

    def _finished(self, work: Work) -> None:
        """Back on the loop after a call in a thread: answer, free the instance, go on."""
        if len(work.jobs) == 1:  # a batch's time says nothing of where one request may run
            (job,) = work.jobs
            if self.placement.mode is Mode.LEARNING:
                self.placement.timed_in_thread(work.spent_ns)
            step = self.step_placement
            if step is not None and step.mode is Mode.LEARNING:
                step.timed_in_thread(work.spent_ns)
            if work.spent_ns <= self.placement.threshold_ns and job.rows > self._fast_rows:
                self._fast_rows = job.rows
        self._complete(work)
        if not self._closed:
            self._dispatch()

    def _complete(self, work: Work) -> None:
        """Answer a finished call's requests and free its instance."""
        self._idle += 1
        spent = work.spent_ns
        self._avg_ns += 0.2 * (spent - self._avg_ns)
        rows = sum(job.rows for job in work.jobs)
        self._stats.record_execution(rows, spent)
        parts: list[Arrays] = []
        error = work.error
        if error is None and work.results is not None:
            try:
                parts = batching.split(work.results, work.jobs, rows)
            except Internal as exc:
                error = exc
        for index, job in enumerate(work.jobs):
            self._done(job)
            if job.future.done():
                continue
            if error is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result((parts[index], work.started_ns - job.enqueued_ns, spent))

    def _expire(self, job: Job) -> None:
        job.timer = None
        now = time.monotonic()
        if job.state is JobState.QUEUED:
            self._queue.remove(job)
            self._fail_queued(job, now)
        elif job.state is JobState.RUNNING and job.deadline is not None:
            if now < job.deadline:  # the queue timeout passed, but it started in time
                assert self._loop is not None
                job.timer = self._loop.call_later(job.deadline - now, self._expire, job)
                return
            if not job.future.done():
                job.future.set_exception(
                    DeadlineExceeded(
                        f"model {self.name!r}: the request's deadline passed while the model "
                        f"was computing it ({DEADLINE_SOURCES}); its result is dropped"
                    )
                )
            self._maybe_cancel(job.work)

    def _fail_queued(self, job: Job, now: float) -> None:
        self._done(job)
        if job.future.done():
            return
        if job.deadline is not None and now >= job.deadline:
            why = f"the request's deadline passed while it waited in the queue ({DEADLINE_SOURCES})"
        else:
            timeout = round(self.settings.queue_timeout_s * 1e6)
            why = (
                "it waited in the queue longer than its timeout (the request's 'timeout' "
                f"parameter, or queueTimeoutMicroseconds: {timeout})"
            )
        job.future.set_exception(DeadlineExceeded(f"model {self.name!r}: {why}; it did not run"))

    def _abandon(self, job: Job) -> None:
        """The awaiting coroutine was cancelled (client gone): leave the queue or flag the call."""
        if job.state is JobState.QUEUED:
            self._queue.remove(job)
            self._done(job)
        elif job.state is JobState.RUNNING:
            self._maybe_cancel(job.work)

    def _maybe_cancel(self, work: Work | None) -> None:
        if work is not None and all(job.future.done() for job in work.jobs):
            work.cancel.set()  # nobody reads this call's answer: a model may stop early

    def _done(self, job: Job) -> None:
        """The request has left the executor for good (ran, failed, expired or abandoned)."""
        if job.state is JobState.DONE:
            return
        job.state = JobState.DONE
        job.work = None
        if job.timer is not None:
            job.timer.cancel()
            job.timer = None
        self.held -= 1
        self._version.leave()

    def _retry_after(self) -> int:
        """Seconds until the queue has likely drained (at least 1)."""
        waiting = len(self._queue) * self._avg_ns / 1e9 / self.settings.instances
        return max(1, math.ceil(waiting))

    def _spawn(self) -> None:
        index = len(self._threads)
        thread = threading.Thread(
            target=self._serve, args=(index,), name=f"servekit-{self.name}-{index}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    # -- in a worker thread -------------------------------------------------------------------
    def _serve(self, index: int) -> None:
        predict: Predict = self._runtime.predictor(index)
        loop = self._loop
        assert loop is not None
        while (work := self._inbox.get()) is not None:
            token = cancel.running_with(work.cancel)
            deadline = CALL_DEADLINE.set(work.deadline)
            request = CURRENT.set(work.request)
            traced = self._traced(work, index) if TRACING.on else None
            started = time.perf_counter_ns()
            try:
                work.results = predict(work.feed, work.outputs)
            except Exception as exc:
                work.error = exc
            except BaseException as exc:  # SystemExit and the like in model code
                work.error = _raised(exc)
            finally:
                if traced is not None:
                    traced.end(work.error)
                CURRENT.reset(request)
                CALL_DEADLINE.reset(deadline)
                cancel.restore(token)
            work.spent_ns = time.perf_counter_ns() - started
            if work.probe is not None:
                work.probe.set()
            try:
                loop.call_soon_threadsafe(self._finished, work)
            except RuntimeError:  # the loop is closed: nobody is waiting for this answer
                return

    def _traced_here(
        self, request: RequestInfo | None, queued: int | None, rows: int
    ) -> tracing.ModelCall | None:
        """The spans of a call on the event loop (tracing on)."""
        return tracing.call_started(((request, queued),), rows, None, self.name)

    def _traced(self, work: Work, index: int) -> tracing.ModelCall | None:
        """The queue and execute spans of a call in worker thread ``index`` (tracing on)."""
        rows = sum(job.rows for job in work.jobs)
        requests = [(job.request, job.enqueued_ns) for job in work.jobs]
        return tracing.call_started(requests, rows, index, self.name)


def _one() -> int:
    return 1


def _zero() -> int:
    return 0


def _raised(exc: BaseException) -> Internal:
    """What a request gets when its model raised something that is not an Exception."""
    return Internal(f"the model raised {type(exc).__name__}")
