"""Where a model version's calls run: on the event loop thread, or in its own worker threads.

On the loop a call costs no thread hop, which for a small model is most of its cost; but the
loop serves every request of every model, so only a call that is sure to be short may run there.
Only a runtime that says it cannot block (``may_run_inline``, app/servekit/runtimes/base.py:
ONNX Runtime, a tabular model that is its library's own code) is ever placed on the loop; a
Python model's code may sleep or wait on I/O on any call, after any number of fast ones, and the
loop also answers the liveness probes, so its versions start and stay in ``THREADS``. The
rules, per loaded version of the others:

* A new version's calls run in its threads and are timed there by wall clock (a model that
  sleeps, does I/O or waits on a device burns no CPU but blocks whatever thread runs it). After
  ``LEARN_FAST`` calls within ``server.inlineBelowMicroseconds`` it moves onto the loop. After
  ``LEARN_SLOW`` slower ones first, it stays in its threads until it is reloaded. (Under load a
  fast model's time in a thread includes waits for the GIL, so a slow sample proves little,
  while learning costs nothing: the calls run in the threads meanwhile.)
* A call on the loop that takes longer sends the version back to learning. It counts against
  the version only if the next call, timed in a thread, is slow too: another process
  preempting the loop mid-call is common on a busy machine and says nothing about the model.
  After ``MAX_STRIKES`` counted ones the version stays in its threads until it is reloaded;
  ``STRIKE_DECAY_CALLS`` calls on the loop within the bound forgive one.
* Versions with dynamic batching run their batches of several requests in their threads
  (executor.py); only their calls of one request are timed here and may run on
  the loop, so the time of a large batch never decides where a lone request runs.
"""

from __future__ import annotations

import logging
from enum import Enum

log = logging.getLogger("servekit.executor")

LEARN_FAST = 2
LEARN_SLOW = 32
MAX_STRIKES = 3
STRIKE_DECAY_CALLS = 4096


class Mode(Enum):
    LEARNING = "learning"
    INLINE = "inline"
    THREADS = "threads"


class Placement:
    """The loop-or-threads decision of one loaded version (see the module docstring)."""

    __slots__ = (
        "_calm",
        "_fast",
        "_may_inline",
        "_slow",
        "_suspect",
        "mode",
        "name",
        "strikes",
        "threshold_ns",
    )

    def __init__(self, name: str, threshold_ns: int, may_inline: bool) -> None:
        self.name = name
        self._may_inline = may_inline
        self.retune(threshold_ns)

    def retune(self, threshold_ns: int) -> None:
        """Start over with a new bound (``server.inlineBelowMicroseconds`` edited while the
        server runs): what was learnt against the old one says nothing about the new one."""
        self.threshold_ns = threshold_ns
        self.mode = Mode.LEARNING if threshold_ns > 0 and self._may_inline else Mode.THREADS
        self.strikes = 0
        self._fast = self._slow = self._calm = 0
        self._suspect = False

    def timed_inline(self, spent: int) -> None:
        """A call on the loop took ``spent`` ns (called when slow, or while strikes stand)."""
        if spent > self.threshold_ns:
            log.debug("%s: %.2f ms on the event loop, measuring again", self.name, spent / 1e6)
            self._fast = self._slow = 0
            self._suspect = True
            self.mode = Mode.LEARNING
            return
        self._calm += 1
        if self._calm >= STRIKE_DECAY_CALLS:
            self._calm = 0
            self.strikes = max(0, self.strikes - 1)

    def timed_in_thread(self, spent: int) -> None:
        """A call of a learning version took ``spent`` ns in a worker thread."""
        slow = spent > self.threshold_ns
        if self._suspect:  # the first call timed in a thread after a slow call on the loop
            self._suspect = False
            if slow:
                self.strikes += 1
                if self.strikes > MAX_STRIKES:
                    self._stay_in_threads(f"slow on the event loop {self.strikes} times")
                    return
        if not slow:
            self._fast += 1
            if self._fast >= LEARN_FAST:
                self.mode = Mode.INLINE
        else:
            self._slow += 1
            if self._slow >= LEARN_SLOW:
                self._stay_in_threads(f"measured slow ({spent / 1e6:.1f} ms)")

    def _stay_in_threads(self, why: str) -> None:
        self.mode = Mode.THREADS
        log.info("%s: %s; runs in its threads until reloaded", self.name, why)
