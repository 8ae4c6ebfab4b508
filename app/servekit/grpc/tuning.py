"""How grpcio's own threads are set up, chosen by measurement (docs/performance.md, "gRPC").

grpcio's asyncio server is three kinds of thread handing work to each other: the event loop runs
the handlers; grpcio's completion-queue poller thread turns core events into loop callbacks;
and, by default in grpcio 1.81, EventEngine threads do the socket reads and writes. On one core
every hand-off is a context switch (about 12 per unary call were counted with ``perf stat``), and
the woken thread preempts the loop in the middle of its work. Two settings cut that down:

* ``GRPC_EXPERIMENTS`` turning the EventEngine listener and endpoints off: the poller thread then
  does the socket I/O itself (gRPC core's iomgr path), one hop fewer per event. Measured on one
  pinned core: ServerLive ~8,100 -> ~10,000 calls/s, ModelInfer c1 +280 -> +216 us.
  It is applied only when the user has not set ``GRPC_EXPERIMENTS`` (an empty value restores
  grpcio's defaults), and only before gRPC core starts: a process that already used grpc (a
  notebook that imported a gRPC client first) keeps its settings.
* A lower scheduling priority (``nice``) for the poller thread, so that waking it does not
  preempt the loop: the poller runs when the loop waits, and then handles many events at once.
  Only threads of this process are touched, and only towards less priority (never needs
  privileges). On several cores the poller simply runs on another core.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger("servekit.grpc")

LEGACY_IO_EXPERIMENTS = "-event_engine_listener,-event_engine_for_all_other_endpoints"
"""grpcio experiments that put socket I/O back on the completion-queue poller thread."""

CORE_MODULE = "grpc._cython.cygrpc"
"""grpcio's extension module; once imported, gRPC core has read ``GRPC_EXPERIMENTS``."""

POLLER_THREAD_TARGET = "_poll_wrapper"
"""Name of the method grpcio's asyncio poller thread runs (how the thread is recognised)."""


def prefer_poller_io() -> bool:
    """Ask gRPC core to do socket I/O on the poller thread; False when it is too late or the
    user chose ``GRPC_EXPERIMENTS`` themselves."""
    if "GRPC_EXPERIMENTS" in os.environ:
        return False
    if CORE_MODULE in sys.modules:  # gRPC core reads its experiments when it is imported
        return False
    os.environ["GRPC_EXPERIMENTS"] = LEGACY_IO_EXPERIMENTS
    return True


def lower_poller_priority(nice: int) -> int:
    """Give grpcio's poller thread(s) ``nice`` more than they have; return how many changed."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return 0
    changed = 0
    for thread in threading.enumerate():
        if POLLER_THREAD_TARGET not in thread.name or thread.native_id is None:
            continue
        try:
            current = os.getpriority(os.PRIO_PROCESS, thread.native_id)
            os.setpriority(os.PRIO_PROCESS, thread.native_id, min(19, current + nice))
        except OSError as exc:  # e.g. a sandbox without setpriority: a speed hint, not a need
            log.debug("cannot lower the priority of %s: %s", thread.name, exc)
            continue
        changed += 1
    return changed
