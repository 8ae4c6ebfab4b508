"""Dynamic batching: concurrent requests to one model version run as one model call.

Requests wait at most ``maxQueueDelayMicroseconds`` for others to join; a batch is cut as soon as
it reaches ``maxBatchSize`` rows (or a preferred size). Only requests whose inputs agree on every
dimension but the first (and ask for the same outputs) are stacked together; the others simply
form batches of their own. The batched call runs in a worker thread, so the event loop keeps
accepting requests that join the next batch meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np

from app.runtimes.base import Arrays, ModelRuntime
from app.services.stats import VersionStats


@dataclass(slots=True)
class _Pending:
    feed: Arrays
    outputs: tuple[str, ...]
    rows: int
    key: tuple[object, ...]
    enqueued_ns: int
    future: asyncio.Future[tuple[Arrays, int]] = field(repr=False)


class DynamicBatcher:
    """Collects requests for one model version and runs them in batches."""

    def __init__(
        self,
        runtime: ModelRuntime,
        stats: VersionStats,
        max_batch_size: int,
        max_delay_us: int,
        preferred: list[int] | None = None,
    ) -> None:
        self._runtime = runtime
        self._stats = stats
        self._max = max_batch_size
        self._delay = max_delay_us / 1e6
        self._preferred = set(preferred or ())
        self._pending: list[_Pending] = []
        self._timer: asyncio.TimerHandle | None = None

    async def submit(self, feed: Arrays, outputs: list[str]) -> tuple[Arrays, int]:
        """Queue one request; returns its outputs and how long it waited for its batch (ns)."""
        loop = asyncio.get_running_loop()
        first = next(iter(feed.values()))
        key = (tuple(outputs), *((n, a.dtype.str, a.shape[1:]) for n, a in sorted(feed.items())))
        item = _Pending(
            feed, tuple(outputs), first.shape[0], key, time.perf_counter_ns(), loop.create_future()
        )
        self._pending.append(item)
        rows = sum(p.rows for p in self._pending if p.key == key)
        if rows >= self._max or rows in self._preferred:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self._delay, self._flush)
        result, waited_ns = await item.future
        return result, waited_ns

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, []
        while pending:
            key = pending[0].key
            batch: list[_Pending] = []
            rest: list[_Pending] = []
            rows = 0
            for item in pending:
                if item.key == key and rows + item.rows <= self._max:
                    batch.append(item)
                    rows += item.rows
                else:
                    rest.append(item)
            if not batch:  # a single request larger than maxBatchSize was refused earlier
                batch, rest = [rest[0]], rest[1:]
            pending = rest
            asyncio.get_running_loop().create_task(self._run(batch))

    async def _run(self, batch: list[_Pending]) -> None:
        started = time.perf_counter_ns()
        names = batch[0].feed.keys()
        if len(batch) == 1:
            feed = batch[0].feed
        else:
            feed = {n: np.concatenate([p.feed[n] for p in batch]) for n in names}
        try:
            results = await asyncio.to_thread(self._runtime.predict, feed, list(batch[0].outputs))
        except Exception as exc:
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(exc)
            return
        rows = sum(p.rows for p in batch)
        self._stats.record_execution(rows, time.perf_counter_ns() - started)
        offset = 0
        for item in batch:
            part = {n: a[offset : offset + item.rows] for n, a in results.items()}
            offset += item.rows
            if not item.future.done():
                item.future.set_result((part, started - item.enqueued_ns))
