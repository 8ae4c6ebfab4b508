"""How far a remote model's download is: bytes, rate and time left, for the log, the index, the
dashboard and the notebook.

One :class:`Download` per model fetch, written by the thread that downloads (each chunk adds its
bytes) and read by the event loop (the index, the dashboard) and by a notebook's waiting
``serve()``, so its fields change under a lock and readers get a frozen
:class:`~servekit.results.DownloadStatus`. Log lines are throttled: a large download (at least
:data:`LOG_FROM_BYTES`) logs a line every :data:`LOG_EVERY_S` seconds or every tenth of the
way, whichever comes first, never two within :data:`LOG_GAP_S`. A line names the URI as it may
be shown (``shown_uri``: no user info, no query), so no secret or signed URL is ever logged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from servekit.results import DownloadStatus

log = logging.getLogger("servekit.storage")

LOG_FROM_BYTES = 16 * 1024 * 1024
"""Downloads at least this large log their progress (smaller ones only their end)."""
LOG_EVERY_S = 5.0
LOG_STEP = 0.10
LOG_GAP_S = 1.0
RATE_AFTER_S = 0.5
"""No rate or time left is claimed before this much time has passed (too noisy)."""


class Cancelled(Exception):
    """A download stopped because the server stops."""


class Download:
    """One model's fetch: listing first (sizes unknown), then ``begin(total)`` and ``add``."""

    def __init__(
        self, model: str, shown_uri: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.model = model
        self.uri = shown_uri
        self._clock = clock
        self._lock = threading.Lock()
        self._total = -1
        self._done = 0
        self._started = clock()
        self._logged_at = self._started
        self._logged_fraction = 0.0
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Make the download fail at its next chunk (the server is stopping)."""
        self._cancelled.set()

    def begin(self, total: int, files: int) -> None:
        """The download starts: ``total`` bytes in ``files`` files are to come."""
        with self._lock:
            self._total, self._done = max(total, 0), 0
            self._started = self._logged_at = self._clock()
            self._logged_fraction = 0.0
        if total >= LOG_FROM_BYTES:
            log.info("model %s: downloading %s: %.1f MB in %d file(s)",
                     self.model, self.uri, total / 2**20, files)  # fmt: skip

    def add(self, count: int) -> None:
        """``count`` more bytes are written (from the downloading thread). Raises
        :class:`Cancelled` once the download is cancelled."""
        if self._cancelled.is_set():
            raise Cancelled("the server is stopping")
        line = None
        with self._lock:
            self._done += count
            now = self._clock()
            if self._total >= LOG_FROM_BYTES and now - self._logged_at >= LOG_GAP_S:
                fraction = self._done / self._total
                due = now - self._logged_at >= LOG_EVERY_S
                if due or fraction - self._logged_fraction >= LOG_STEP:
                    self._logged_at, self._logged_fraction = now, fraction
                    line = self._status(now).text()
        if line is not None:
            log.info("model %s: %s", self.model, line)

    def status(self) -> DownloadStatus:
        with self._lock:
            return self._status(self._clock())

    def _status(self, now: float) -> DownloadStatus:
        elapsed = now - self._started
        rate = self._done / elapsed if elapsed >= RATE_AFTER_S else 0.0
        left = None
        if rate > 0 and self._total >= 0:
            left = max(self._total - self._done, 0) / rate
        return DownloadStatus(self.model, self.uri, self._done, self._total, rate, left)

    def finished(self) -> str:
        """How the download went, for the closing log line (MB, seconds, MB/s)."""
        with self._lock:
            elapsed = max(self._clock() - self._started, 1e-6)
            done = self._done
        return f"{done / 2**20:.1f} MB in {elapsed:.1f} s ({done / 2**20 / elapsed:.1f} MB/s)"
