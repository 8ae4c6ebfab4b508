"""Sequence batching (serve.yaml ``sequenceBatching``, Triton's meaning) for stateful models.

A request names its sequence with the ``sequence_id`` parameter (a non-zero unsigned integer
or a non-empty string: its correlation ID) and marks the first and last requests with
``sequence_start`` and ``sequence_end``; every protocol passes these parameters as they come
(HTTP JSON, gRPC ModelInfer and ModelStreamInfer). Here:

* a sequence is given one slot of one instance at its START and keeps it until its END or
  until it has been idle ``maxSequenceIdleMicroseconds``; with no slot free it waits in the
  backlog (its requests queue) until one frees. ``direct``: maxBatchSize slots per instance
  (one without batching); ``oldest``: maxCandidateSequences.
* each instance has its own worker thread (its own Python object or session: the runtime's
  ``predictor(index)``); when it is free it runs one batch made of the next request of each
  of its sequences that has one waiting (oldest request first, at most maxBatchSize rows), so
  the requests of a sequence run one at a time, in the order they arrived.
* each row gets its control inputs (START, END, READY, CORRID, with the configured values)
  and, for models with implicit state, the state its sequence left (zeros at START); the
  state output the model returns is kept for the next request of the sequence.
* a request for a sequence that is not in progress without START is refused with Triton's
  words, as are a missing correlation ID and a batch of more than one row.

The request kind (handler.py) queues a sequence model's requests here; this module owns the
sequences and their threads, the version's ModelExecutor (closed when the version is
retired) closes them. A request's flags are read by flags.py.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servekit.config.sequences import SequenceBatching, SequenceControl
from servekit.datatypes import lookup
from servekit.errors import (
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    Overloaded,
    ServeError,
    Unavailable,
    internal_error,
)
from servekit.models.repository import VersionEntry
from servekit.runtimes.base import Arrays, ModelRuntime, Predict
from servekit.services.sequences.flags import CorrelationId, SequenceFlags
from servekit.services.stats import VersionStats

log = logging.getLogger("servekit.sequences")


@dataclass(slots=True, eq=False)
class _Step:
    """One request of a sequence, waiting for or in its instance's call."""

    feed: Arrays
    outputs: tuple[str, ...]
    start: bool
    end: bool
    future: asyncio.Future[tuple[Arrays, int, int]]
    enqueued_ns: int = field(default_factory=time.perf_counter_ns)
    timer: asyncio.TimerHandle | None = None


@dataclass(slots=True, eq=False)
class _Sequence:
    """A sequence in progress: its slot, its waiting requests, its state."""

    correlation_id: CorrelationId
    client: str | None = None
    """The address of the client that started it (None: this process), for its share."""
    pending: deque[_Step] = field(default_factory=deque)
    instance: _Instance | None = None
    running: bool = False
    state: dict[str, np.ndarray] = field(default_factory=dict)
    idle_timer: asyncio.TimerHandle | None = None
    ended: bool = False
    """Its END request has arrived (its ID is free for a new sequence)."""


@dataclass(slots=True, eq=False)
class _Instance:
    """One model instance: its sequences (slots) and its worker thread."""

    index: int
    predict: Predict | None = None
    sequences: list[_Sequence] = field(default_factory=list)
    busy: bool = False
    inbox: queue.SimpleQueue[_Call | None] = field(default_factory=queue.SimpleQueue)
    thread: threading.Thread | None = None


@dataclass(slots=True, eq=False)
class _Call:
    """One batch on an instance: a row per sequence."""

    rows: list[tuple[_Sequence, _Step]]
    feed: Arrays
    outputs: list[str]
    results: Arrays | None = None
    error: BaseException | None = None
    spent_ns: int = 0
    started_ns: int = 0


@dataclass(slots=True)
class SequenceCounts:
    """Sequence statistics of one model version."""

    started: int = 0
    ended: int = 0
    expired: int = 0
    """Ended by ``maxSequenceIdleMicroseconds`` without their END."""
    active: int = 0
    """Holding a slot now."""
    backlog: int = 0
    """Waiting for a slot now."""


class SequenceBatcher:
    """The sequences of one loaded version of a sequence model (see the module docstring)."""

    def __init__(
        self,
        name: str,
        config: SequenceBatching,
        runtime: ModelRuntime,
        version: VersionEntry,
        instances: int,
        max_batch_size: int,
        max_queue_size: int,
        stats: VersionStats,
    ) -> None:
        self.name = name
        self._stats = stats
        self.config = config
        self.counts = SequenceCounts()
        self._runtime = runtime
        self._version = version
        self._batch = max_batch_size
        self._max_queue = max_queue_size
        self._slots = config.slots(max_batch_size)
        self._per_client = config.per_client(self._slots * instances)
        self._clients: dict[str, int] = {}  # address -> its sequences in progress
        self._instances = [_Instance(i) for i in range(instances)]
        self._by_id: dict[CorrelationId, _Sequence] = {}
        self._backlog: deque[_Sequence] = deque()
        self._waiting = 0
        self._closed = False
        self._loop = asyncio.get_running_loop()
        self._idle_s = config.max_sequence_idle_microseconds / 1e6
        self._controls = [
            (c.name, c.control[0]) for c in config.control_inputs
        ]  # (input name, control)
        corrid = config.control("CONTROL_SEQUENCE_CORRID")
        self._corrid_type = corrid[1].datatype if corrid is not None else None

    # -- on the loop ----------------------------------------------------------------------------
    def enqueue(
        self,
        flags: SequenceFlags,
        feed: Arrays,
        outputs: list[str],
        deadline: float | None,
        client: str | None = None,
    ) -> asyncio.Future[tuple[Arrays, int, int]]:
        """Queue one request on its sequence (synchronously, so requests of a sequence keep
        the order in which they arrived) and return the future of its results. ``client``:
        the address of the client (None: this process), whose new sequences are bounded by
        its share of the slots."""
        if self._closed:
            raise Unavailable(f"model {self.name!r}: this version is unloading")
        self._check_corrid(flags.correlation_id)
        if self._max_queue and self._waiting >= self._max_queue:
            raise Overloaded(
                f"model {self.name!r} has {self._waiting} sequence requests waiting "
                f"(maxQueueSize {self._max_queue}); retry later",
                1,
            )
        sequence = self._by_id.get(flags.correlation_id)
        if sequence is None:
            if not flags.start:
                raise InvalidArgument(
                    f"inference request for sequence {flags.correlation_id} to model "
                    f"'{self.name}' must specify the START flag on the first request of the "
                    "sequence"
                )
            self._check_share(client)
            sequence = _Sequence(flags.correlation_id, client)
            if client is not None:
                self._clients[client] = self._clients.get(client, 0) + 1
            self._by_id[flags.correlation_id] = sequence
            self.counts.started += 1
            self._place(sequence)
        elif flags.start:
            log.warning(
                "sequence %s for model '%s' has a conflict. The previous sequence did not end "
                "before this sequence start. Previous sequence will be terminated early.",
                flags.correlation_id,
                self.name,
            )
            self.counts.started += 1
        if sequence.idle_timer is not None:
            sequence.idle_timer.cancel()
            sequence.idle_timer = None
        step = _Step(feed, tuple(outputs), flags.start, flags.end, self._loop.create_future())
        sequence.pending.append(step)
        self._waiting += 1
        if flags.end:  # its ID is free for a new sequence from now on
            sequence.ended = True
            del self._by_id[flags.correlation_id]
        if deadline is not None:
            delay = max(0.0, deadline - time.monotonic())
            step.timer = self._loop.call_later(delay, self._expire_step, sequence, step)
        if sequence.instance is not None:
            self._pump(sequence.instance)
        return step.future

    def abandon(self, future: asyncio.Future[Any]) -> None:
        """The request's client left: drop it if it has not started."""
        for sequence in self._sequences():
            for step in sequence.pending:
                if step.future is future:
                    self._drop(sequence, step)
                    return

    def close(self) -> None:
        """The version is retired: refuse what waits, stop the threads after their call."""
        self._closed = True
        for sequence in self._sequences():
            for step in list(sequence.pending):
                self._drop(sequence, step, Unavailable(f"model {self.name!r} was unloaded"))
            if sequence.idle_timer is not None:
                sequence.idle_timer.cancel()
        for instance in self._instances:
            if instance.thread is not None:
                instance.inbox.put(None)

    def _sequences(self) -> list[_Sequence]:
        held = [s for i in self._instances for s in i.sequences]
        return held + list(self._backlog)

    def _check_share(self, client: str | None) -> None:
        """A client address may have ``clientSlotShare`` of the model's slots in progress
        (holding one or waiting for one): beyond it, busy (429), so that one client cannot
        hold every slot while others wait."""
        limit = self._per_client
        if client is None or limit is None:
            return
        held = self._clients.get(client, 0)
        if held >= limit:
            total = self._slots * len(self._instances)
            raise Overloaded(
                f"model {self.name!r}: client {client} has {held} sequences in progress, its "
                f"share of the model's {total} sequence slots (sequenceBatching.clientSlotShare "
                f"{self.config.client_slot_share}); end one, or retry later",
                1,
            )

    def _check_corrid(self, correlation_id: CorrelationId) -> None:
        """A CORRID control of type string takes string IDs only, of an integer type integers
        only (Triton's words)."""
        wanted = self._corrid_type
        if wanted is None:
            return
        is_string = isinstance(correlation_id, str)
        if is_string != (wanted == "BYTES"):
            given = "BYTES" if is_string else "UINT64"
            name = self.config.control("CONTROL_SEQUENCE_CORRID")
            assert name is not None
            raise InvalidArgument(
                f"sequence batching control '{name[0]}' data-type is '{given}', but model "
                f"'{self.name}' expects '{wanted}'"
            )

    def _place(self, sequence: _Sequence) -> None:
        """Give a new sequence the instance with the most free slots, or the backlog."""
        best = min(self._instances, key=lambda i: len(i.sequences))
        if len(best.sequences) < self._slots:
            best.sequences.append(sequence)
            sequence.instance = best
            self.counts.active += 1
        else:
            self._backlog.append(sequence)
            self.counts.backlog += 1

    def _release(self, sequence: _Sequence, expired: bool = False) -> None:
        """The sequence is over: free its slot and give it to the backlog's oldest."""
        instance = sequence.instance
        if sequence.idle_timer is not None:
            sequence.idle_timer.cancel()
            sequence.idle_timer = None
        if self._by_id.get(sequence.correlation_id) is sequence:
            del self._by_id[sequence.correlation_id]
        client = sequence.client
        if client is not None:
            left = self._clients.pop(client) - 1
            if left:
                self._clients[client] = left
        if expired:
            self.counts.expired += 1
        else:
            self.counts.ended += 1
        if instance is None:  # never got a slot
            if sequence in self._backlog:
                self._backlog.remove(sequence)
                self.counts.backlog -= 1
            return
        instance.sequences.remove(sequence)
        sequence.instance = None
        self.counts.active -= 1
        while self._backlog and len(instance.sequences) < self._slots:
            waiting = self._backlog.popleft()
            self.counts.backlog -= 1
            waiting.instance = instance
            instance.sequences.append(waiting)
            self.counts.active += 1
        self._pump(instance)

    def _idle(self, sequence: _Sequence) -> None:
        """No request for maxSequenceIdleMicroseconds: the sequence ends, its slot frees."""
        sequence.idle_timer = None
        if sequence.pending or sequence.running:
            return
        log.info(
            "sequence %s of model '%s' was idle %d us: ended, its slot is free",
            sequence.correlation_id,
            self.name,
            self.config.max_sequence_idle_microseconds,
        )
        self._release(sequence, expired=True)

    def _settle(self, sequence: _Sequence) -> None:
        """After a request of the sequence left: end it after its END, else watch it idle."""
        if sequence.running or sequence.pending:
            return
        if sequence.ended:
            self._release(sequence)
        elif not self._closed:
            sequence.idle_timer = self._loop.call_later(self._idle_s, self._idle, sequence)

    def _drop(self, sequence: _Sequence, step: _Step, error: ServeError | None = None) -> None:
        sequence.pending.remove(step)
        self._waiting -= 1
        if step.timer is not None:
            step.timer.cancel()
        if error is not None and not step.future.done():
            step.future.set_exception(error)
        self._settle(sequence)

    def _expire_step(self, sequence: _Sequence, step: _Step) -> None:
        step.timer = None
        if step in sequence.pending:
            why = f"model {self.name!r}: the request's deadline passed while it waited"
            self._drop(sequence, step, DeadlineExceeded(why))
        elif not step.future.done():
            step.future.set_exception(
                DeadlineExceeded(
                    f"model {self.name!r}: the request's deadline passed while the model was "
                    "computing it; its result is dropped (the sequence's state is kept)"
                )
            )

    def _pump(self, instance: _Instance) -> None:
        """Start the instance's next batch if it is free and a sequence has a request."""
        if instance.busy or self._closed:
            return
        ready = [s for s in instance.sequences if s.pending and not s.running]
        if not ready:
            return
        ready.sort(key=lambda s: s.pending[0].enqueued_ns)  # the oldest request first
        rows = [(s, s.pending.popleft()) for s in ready[: max(1, self._batch)]]
        for sequence, step in rows:
            sequence.running = True
            self._waiting -= 1
            if step.start:  # a new sequence (or one restarted): its state starts over
                sequence.state = {}
        call = _Call(rows, *self._stack(rows))
        instance.busy = True
        self._version.enter()
        if instance.thread is None:
            instance.thread = threading.Thread(
                target=self._serve,
                args=(instance,),
                name=f"servekit-{self.name}-seq{instance.index}",
                daemon=True,
            )
            instance.thread.start()
        instance.inbox.put(call)

    def _stack(self, rows: list[tuple[_Sequence, _Step]]) -> tuple[Arrays, list[str]]:
        """The batch's feed (the rows' inputs, controls and states) and outputs to compute."""
        batched = self._batch > 0
        feed: Arrays = {}
        first = rows[0][1]
        for name in first.feed:
            parts = [step.feed[name] for _, step in rows]
            feed[name] = np.concatenate(parts) if batched and len(parts) > 1 else parts[0]
        for name, control in self._controls:
            values = [self._control_value(control, seq, step) for seq, step in rows]
            dtype = lookup(control.datatype).dtype
            if control.datatype == "BYTES":
                array = np.array([str(v).encode() for v in values], dtype=object)
            else:
                array = np.array(values, dtype=dtype)
            feed[name] = array.reshape(len(rows), 1) if batched else array.reshape(1)
        for state in self.config.state:
            dtype = lookup(state.datatype).dtype
            tensors = [
                seq.state.get(state.input_name, np.zeros(state.dims, dtype=dtype))
                for seq, _ in rows
            ]
            feed[state.input_name] = np.stack(tensors) if batched else tensors[0]
        outputs = list(dict.fromkeys(n for _, step in rows for n in step.outputs))
        outputs += [s.output_name for s in self.config.state if s.output_name not in outputs]
        return feed, outputs

    @staticmethod
    def _control_value(control: SequenceControl, sequence: _Sequence, step: _Step) -> Any:
        kind = control.kind
        if kind == "CONTROL_SEQUENCE_CORRID":
            return sequence.correlation_id
        flag = {
            "CONTROL_SEQUENCE_START": step.start,
            "CONTROL_SEQUENCE_END": step.end,
            "CONTROL_SEQUENCE_READY": True,
        }[kind]
        return control.value(flag)

    def _finished(self, instance: _Instance, call: _Call) -> None:
        """Back on the loop: answer the batch's requests, keep the states, go on."""
        instance.busy = False
        self._version.leave()
        self._stats.record_execution(len(call.rows), call.spent_ns)
        results, error = call.results, call.error
        if error is not None and not isinstance(error, ServeError):  # a runtime's own error
            where = f"model {self.name!r}"
            error = Internal(f"{where} failed: {internal_error(log, error, where)}")
        mine: Arrays = {}
        for row, (sequence, step) in enumerate(call.rows):
            sequence.running = False
            if step.timer is not None:
                step.timer.cancel()
                step.timer = None
            if error is None and results is not None:
                try:
                    mine = self._row(results, row, len(call.rows))
                    for state in self.config.state:
                        sequence.state[state.input_name] = self._kept(state.output_name, mine)
                except ServeError as exc:
                    error = exc
            if not step.future.done():
                if error is not None:
                    step.future.set_exception(error)
                else:
                    queue_ns = call.started_ns - step.enqueued_ns
                    step.future.set_result((mine, max(0, queue_ns), call.spent_ns))
            self._settle(sequence)
        self._pump(instance)

    def _row(self, results: Arrays, row: int, rows: int) -> Arrays:
        if self._batch <= 0:
            return results
        out: Arrays = {}
        for name, array in results.items():
            if not array.shape or array.shape[0] != rows:
                raise Internal(
                    f"model {self.name!r} returned {name!r} with {array.shape[:1] or 'no'} "
                    f"rows for a batch of {rows}"
                )
            out[name] = array[row : row + 1]
        return out

    def _kept(self, output: str, results: Arrays) -> np.ndarray:
        array = results.pop(output, None)
        if array is None:
            raise Internal(f"model {self.name!r} did not return its state output {output!r}")
        kept = array[0] if self._batch > 0 else array
        return np.array(kept, copy=True)

    # -- in an instance's thread ----------------------------------------------------------------
    def _serve(self, instance: _Instance) -> None:
        predict = self._runtime.predictor(instance.index)
        while (call := instance.inbox.get()) is not None:
            call.started_ns = started = time.perf_counter_ns()
            try:
                call.results = dict(predict(call.feed, call.outputs))
            except Exception as exc:
                call.error = exc
            except BaseException as exc:  # SystemExit and the like in model code
                call.error = Internal(f"the model raised {type(exc).__name__}")
            call.spent_ns = time.perf_counter_ns() - started
            try:
                self._loop.call_soon_threadsafe(self._finished, instance, call)
            except RuntimeError:  # the loop is closed: nobody waits for this answer
                return
