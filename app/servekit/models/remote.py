"""Remote models: a plan whose storageUri is remote, turned into a plan of local files.

The compiler leaves a remote model's versions open (it never reads the network); before such a model
loads, :meth:`RemoteModels.materialize` lists the remote, brings its cache snapshot up to date
(app/servekit/models/remote_cache.py) and plans the versions found there. A failure (bad
credentials, no bucket, a timeout, a store that is down, an unsafe archive) becomes the plan's
problem: that model is UNAVAILABLE with the reason, every other model serves; unless the store could
not be reached and the cache holds a complete copy taken earlier, which then serves with a warning
(``server.storage.whenUnreachable``; the plan's ``cached_copy`` says why) until the store answers
again. Reasons never hold a secret or a signed URL: the URI is shown without user info or query, and
any credential the environment holds is blanked out of a library's message."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from servekit.config.compiler import ModelPlan, plan_at
from servekit.config.schema import StorageConfig
from servekit.config.versions import VersionSource
from servekit.models.remote_cache import cache_dir, cached_copy, snapshot
from servekit.models.remote_progress import Download
from servekit.models.remote_stores import StoreError, StoreRefused, open_store
from servekit.shown_paths import hide_uri_secrets, shown_uri, uri_secrets

T = TypeVar("T")

log = logging.getLogger("servekit.storage")

SECRET_VARIABLES = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_SAS_TOKEN",
    "GOOGLE_APPLICATION_CREDENTIALS",
)
MAX_REASON = 400
RETRY_FIRST_S = 5.0
RETRY_MAX_S = 600.0


class RemoteModels:
    """The cache and the snapshots this server's models use."""

    def __init__(
        self,
        settings: StorageConfig,
        base_dir: Path,
        downloads: dict[str, Download] | None = None,
    ) -> None:
        self.settings = settings
        self.root = cache_dir(settings, base_dir)
        self.base_dir = base_dir
        self.downloads: dict[str, Download] = {} if downloads is None else downloads
        """Model name -> its fetch in progress (the repository shows them as LOADING)."""
        self._in_use: dict[str, Path] = {}  # model name -> its snapshot
        self._failures: dict[str, tuple[int, float]] = {}  # name -> (count, when to retry)
        self._cancelled = False

    def materialize(self, plan: ModelPlan) -> ModelPlan:
        """``plan`` with its versions read from the local copy of its remote URI (blocking:
        run it in a thread). A plan that is not remote, or already has a problem, is
        returned as it is."""
        if plan.remote is None or plan.problem is not None:
            return plan
        shown = shown_uri(plan.remote)
        started = time.monotonic()
        download = Download(plan.name, shown)
        if self._cancelled:
            download.cancel()
        self.downloads[plan.name] = download
        try:
            protected = set(self._in_use.values())
            location = fetch(plan.remote, self.settings, self.root, protected, download)
        except Exception as exc:  # any library's failure is this model's problem
            reason = f"cannot fetch {shown}: {shown_error(exc, plan.remote)}"
            count = self._failures.get(plan.name, (0, 0.0))[0] + 1
            wait = min(RETRY_FIRST_S * 2 ** (count - 1), RETRY_MAX_S)
            self._failures[plan.name] = (count, time.monotonic() + wait)
            log.warning("model %s: %s", plan.name, reason)
            cached = self._stand_in(plan, exc)
            if cached is None:
                return replace(plan, versions=(VersionSource(1, None),), problem=reason)
            location, when = cached
            taken = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))
            note = (
                f"serving the copy cached at {taken}: {reason}; the store is looked at again "
                "in the background"
            )
            log.warning("model %s: the store cannot be reached: serving the copy cached at %s",
                        plan.name, taken)  # fmt: skip
            return replace(self._at(plan, location), cached_copy=note)
        finally:
            if self.downloads.get(plan.name) is download:
                del self.downloads[plan.name]
        self._failures.pop(plan.name, None)
        log.info("model %s: %s is at hand (%.2f s)", plan.name, shown, time.monotonic() - started)
        return self._at(plan, location)

    def _at(self, plan: ModelPlan, location: Path) -> ModelPlan:
        """``plan`` read from ``location`` (a snapshot, or its one file), which this process
        now uses (eviction leaves it)."""
        folder = location if location.is_dir() else location.parent
        self._in_use[plan.name] = folder if folder.parent.parent == self.root else folder.parent
        return replace(plan_at(plan, location, self.base_dir), cached_copy=None)

    def _stand_in(self, plan: ModelPlan, exc: Exception) -> tuple[Path, float] | None:
        """The cached copy that serves while ``plan``'s store cannot be reached, and when it
        was last taken; None when ``server.storage.whenUnreachable`` is ``unavailable``, the
        store answered with a refusal (nothing there, too large, unsafe), the server stops,
        or nothing was ever cached."""
        if self.settings.when_unreachable != "serveCached" or self._cancelled:
            return None
        if isinstance(exc, StoreRefused) or plan.remote is None:
            return None
        return cached_copy(plan.remote, self.root)

    async def materialized(self, plan: ModelPlan) -> ModelPlan:
        """:meth:`materialize` in a daemon thread of its own (:func:`in_daemon_thread`): a
        store that went away can hold a listing for minutes in its library's own retries
        (Azure's backoff alone is over a minute), which :meth:`cancel` cannot reach between
        chunks. The thread is left behind instead; its temporary folder is never served."""
        return await in_daemon_thread(
            lambda: self.materialize(plan), name=f"servekit-fetch-{plan.name}"
        )

    def cancel(self) -> None:
        """The server stops: every download under way fails at its next chunk (so a stop
        does not wait for a large model to arrive) and none starts any more."""
        self._cancelled = True
        for download in list(self.downloads.values()):
            download.cancel()

    def due_for_retry(self, name: str) -> bool:
        """Whether a model whose fetch failed may be tried again now (backoff doubling from
        5 s to 10 min); a model that never failed is always due."""
        failure = self._failures.get(name)
        return failure is None or time.monotonic() >= failure[1]

    def forget(self, name: str) -> None:
        """``name`` no longer serves: its snapshot may be evicted."""
        self._in_use.pop(name, None)
        self._failures.pop(name, None)


def fetch(
    uri: str,
    settings: StorageConfig,
    root: Path,
    in_use: set[Path] | None = None,
    download: Download | None = None,
) -> Path:
    """The local copy of ``uri`` in the cache at ``root`` (downloaded now unless the remote is
    unchanged): what a server's models and ``servekit build --include-models`` use. Raises
    the store's error; :func:`shown_error` words it without secrets."""
    root.mkdir(parents=True, exist_ok=True)
    store = open_store(uri, settings)
    return snapshot(uri, store, root, settings, set() if in_use is None else in_use, download)


def shown_error(exc: BaseException, uri: str | None = None) -> str:
    """A library's error as a reason: its type and first line, URLs as ``shown_uri`` shows
    them, and every secret part of ``uri`` and every credential the environment holds blanked
    out."""
    if isinstance(exc, StoreError):
        text = str(exc)
    else:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    text = hide_uri_secrets(text)
    secrets = uri_secrets(uri) if uri is not None else []
    secrets += [os.environ.get(variable) or "" for variable in SECRET_VARIABLES]
    for value in secrets:
        if len(value) >= 4:
            text = text.replace(value, "***")
    return text[:MAX_REASON]


async def in_daemon_thread(work: Callable[[], T], name: str = "servekit-store-read") -> T:
    """``work()`` in a daemon thread of its own, awaited without blocking the loop.

    Not ``asyncio.to_thread``: a server that stops joins the default executor's threads, and a
    store that went away can hold a read for minutes in its library's retries."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if answer.done():
            return
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result, error = work(), None
        except BaseException as exc:  # handed to the awaiting task
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await answer
