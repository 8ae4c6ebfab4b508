"""Dynamic batching: which queued requests run together, and how the answers are split back.

The executor (executor.py) decides *when* a batch leaves: as soon as an instance of the model is
free and requests are queued, so a request is never held back while the model could run it, and
batching costs nothing at low load. Batches therefore form from the requests that queue while every
instance is busy, which is exactly when stacking them pays. This module decides *which*: the oldest
request and the later ones it can be stacked with (same input datatypes and same dimensions but the
first), in arrival order, up to ``maxBatchSize`` rows, stopping at the largest preferred size
reachable when there are more. Requests asking for different outputs still share a batch: the model
computes the union and each request gets only its own. Nothing is padded, so nothing padded can leak
into an answer."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import islice
from typing import Any, Protocol, TypeVar

import numpy as np

from servekit.errors import Internal
from servekit.runtimes.base import Arrays

Key = tuple[tuple[str, np.dtype[Any], tuple[int, ...]], ...]

QUEUE_DRAINED = "queue_drained"
"""Why a batch was smaller than it could be: the queue held nothing more to add."""
MAX_SIZE = "max_size"
PREFERRED_SIZE = "preferred_size"
INCOMPATIBLE = "incompatible"
"""Requests were waiting, but none could be stacked with the oldest (other dimensions)."""
REASONS: dict[str, str] = {
    QUEUE_DRAINED: "Queue empty when an instance freed",
    PREFERRED_SIZE: "Reached a preferred batch size",
    MAX_SIZE: "Reached maxBatchSize",
    INCOMPATIBLE: "Others waiting had other shapes",
}
"""Why a dynamic batch stopped at its size, in words (the dashboard's model page shows them).
There is no "delay expired": a batch leaves as soon as an instance is free, so a small batch
means the queue held nothing more when an instance freed."""


class Batchable(Protocol):
    feed: Arrays
    outputs: tuple[str, ...]
    rows: int
    key: Key


J = TypeVar("J", bound=Batchable)


def batch_key(feed: Arrays) -> Key:
    """What must agree for two requests to be stacked: each input's datatype and the
    dimensions after the first (the batch dimension). Paid by every request of a batching
    model, so a single input (the usual case) is keyed without a sort or a generator, and
    by its dtype object (equal dtypes compare equal; ``dtype.str`` builds a string)."""
    if len(feed) == 1:
        for name, array in feed.items():
            return ((name, array.dtype, array.shape[1:]),)
    return tuple((n, a.dtype, a.shape[1:]) for n, a in sorted(feed.items()))


def take(queue: deque[J], max_rows: int, preferred: frozenset[int]) -> tuple[list[J], str]:
    """Remove the next batch from ``queue`` (not empty) and say why it stopped where it did."""
    first = queue[0]
    chosen = [first]
    sums = [first.rows]
    rows = first.rows
    reason = QUEUE_DRAINED
    skipped = False
    for job in islice(queue, 1, None):
        if job.key != first.key:
            skipped = True
            continue
        if rows + job.rows > max_rows:
            reason = MAX_SIZE
            break
        chosen.append(job)
        rows += job.rows
        sums.append(rows)
        if rows == max_rows:
            reason = MAX_SIZE
            break
    if reason == QUEUE_DRAINED and skipped and len(chosen) == 1:
        reason = INCOMPATIBLE
    if preferred and rows not in preferred and reason == MAX_SIZE:
        cut = max((i for i, total in enumerate(sums) if total in preferred), default=None)
        if cut is not None:
            chosen = chosen[: cut + 1]
            reason = PREFERRED_SIZE
    elif preferred and rows in preferred:
        reason = PREFERRED_SIZE
    _remove(queue, chosen)
    return chosen, reason


def _remove(queue: deque[J], chosen: list[J]) -> None:
    if all(queue[i] is job for i, job in enumerate(chosen)):  # the usual case: a prefix
        for _ in chosen:
            queue.popleft()
        return
    ids = {id(job) for job in chosen}
    kept = [job for job in queue if id(job) not in ids]
    queue.clear()
    queue.extend(kept)


def stack(batch: Sequence[Batchable]) -> tuple[Arrays, list[str]]:
    """The model's feed for a batch, and the outputs to compute (every request's, in order)."""
    if len(batch) == 1:
        return batch[0].feed, list(batch[0].outputs)
    names = batch[0].feed.keys()
    feed = {n: np.concatenate([job.feed[n] for job in batch]) for n in names}
    outputs = list(dict.fromkeys(name for job in batch for name in job.outputs))
    return feed, outputs


def split(results: Arrays, batch: Sequence[Batchable], total: int | None = None) -> list[Arrays]:
    """Each request's own rows of each output it asked for (views, not copies); ``total``:
    the batch's rows, if the caller has them."""
    if len(batch) == 1:
        return [results]
    if total is None:
        total = sum(job.rows for job in batch)
    for name, array in results.items():
        if not isinstance(array, np.ndarray) or array.ndim == 0 or array.shape[0] != total:
            got = list(array.shape) if isinstance(array, np.ndarray) else type(array).__name__
            raise Internal(
                f"output {name!r} of a batch of {total} rows has shape {got}: a batched model "
                "must return one row per input row"
            )
    parts = []
    offset = 0
    for job in batch:
        end = offset + job.rows
        names = job.outputs
        if len(names) == 1:  # the usual request: no comprehension (a frame of its own)
            name = names[0]
            parts.append({name: results[name][offset:end]})
        else:
            parts.append({n: results[n][offset:end] for n in names})
        offset = end
    return parts
