"""The model repository: (name, version) -> state, reason and loaded runtime.

Loading runs in worker threads so the event loop keeps serving other models while one loads.
A model whose load fails is UNAVAILABLE with the reason, and nothing else is affected. Reloading
builds the new versions beside the old ones and swaps them in one assignment, so requests never
see a half-loaded model; the old runtimes close once their in-flight requests have finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from servekit.codecs.grps_message import CODEC as GRPS_MESSAGES
from servekit.config.compiler import ModelPlan
from servekit.config.versions import VersionSource
from servekit.errors import Unavailable, shown_name, unknown_model, version_not_integral
from servekit.models import resident
from servekit.models.remote_progress import Download
from servekit.models.warmup import WarmupError, warm_up
from servekit.observability.custom_metrics import LOADING
from servekit.results import DownloadStatus, IndexRow, LoggedError
from servekit.runtimes import load_runtime
from servekit.runtimes.base import LoadError, ModelRuntime, Supervised
from servekit.runtimes.isolated import IsolatedModel
from servekit.runtimes.python import MESSAGE_CODECS
from servekit.shown_paths import hide_paths

log = logging.getLogger("servekit.repository")

# Whole-message Python models take grps messages: the runtime gets the codec from the layer
# that loads runtimes, so it imports no protocol module itself.
MESSAGE_CODECS.setdefault("grps", GRPS_MESSAGES)

MAX_RECENT_ERRORS = 50
DRAIN_TIMEOUT_S = 120.0
"""How long a retired version waits for its in-flight requests before it is closed anyway."""


class State(StrEnum):
    """Lifecycle of a model version, as Triton reports it."""

    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"


class Closeable(Protocol):
    def close(self) -> None: ...


_SERVING = (State.READY, State.UNAVAILABLE)
_READY = State.READY
"""States a loaded version's runtime may move it between (see ModelRepository._watch)."""


@dataclass(slots=True)
class VersionEntry:
    """One version of a model and, once READY, its runtime."""

    version: int
    state: State
    reason: str = ""
    runtime: ModelRuntime | None = None
    in_flight: int = 0
    """Requests using this version, counted until their compute has really ended (a request
    whose client left still counts while its worker thread runs)."""
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    warmup_s: float | None = None
    """Seconds its warm-up took (None: it has none), for the statistics and /metrics."""
    executor: Closeable | None = None
    """How requests reach the runtime (app/servekit/services/execution/executor.py): built
    by the repository's ``on_loaded`` hook when the version loads, closed with the runtime
    when the version is retired."""
    prepared: Any = None
    """What the DataPlane works out once for this version's requests, built with its
    executor (app/servekit/services/prepared.py; this layer does not know its type)."""
    resident_bytes: int | None = None
    """Resident memory its load took (resident.py; None: not measured), what
    ``server.modelMemory`` counts."""

    def __post_init__(self) -> None:
        self.idle.set()

    def enter(self) -> None:
        """A request starts using this version (unload waits for it). ``idle`` is clear
        exactly while requests are in flight: only the first one clears it."""
        if not self.in_flight:
            self.idle.clear()
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.idle.set()


@dataclass(slots=True)
class ModelEntry:
    """A model the server knows, with its versions (replaced as a whole on reload)."""

    plan: ModelPlan
    versions: dict[int, VersionEntry]
    """Fixed once the entry exists (a reload or unload builds a new entry); each version's
    state changes in place."""
    serving: tuple[VersionEntry, tuple[VersionEntry, ...]] | None = field(
        default=None, compare=False, repr=False
    )
    """What ``ModelRepository.resolve`` last found for a request naming no version: that
    version and the versions that would take its place on becoming READY (higher numbers,
    none when serve.yaml names a default version). Still right while the first is READY and
    none of the others is, which a request checks with a compare or two instead of sorting
    the versions (kept here rather than updated on every state change: states are set in
    several places, and a stale value is never used)."""

    def ready_versions(self) -> list[int]:
        return sorted(v for v, e in self.versions.items() if e.state is State.READY)

    def serving_version(self) -> int | None:
        """The version a request naming none reaches: serve.yaml's default version, else the
        highest ready one (None: no version is ready). The one copy of that rule."""
        default = self.plan.default_version
        if default is not None:
            return default
        ready = self.ready_versions()
        return ready[-1] if ready else None

    def reason(self) -> str:
        return (
            "; ".join(
                f"version {v}: {e.reason}" for v, e in sorted(self.versions.items()) if e.reason
            )
            or self.plan.problem  # e.g. a missing storageUri: no version to carry the reason
            or "no version is ready"
        )

    def failed_versions(self) -> list[int]:
        """Versions that were to load but are not READY."""
        return sorted(v for v, e in self.versions.items() if e.state is not State.READY)

    def is_loaded(self) -> bool:
        """Whether any version serves, is on its way or holds a runtime (an isolated model
        restarting its process): what unload and reload act on."""
        return any(
            e.state in (State.READY, State.LOADING) or e.runtime is not None
            for e in self.versions.values()
        )


class ModelRepository:
    """Every model the server knows, loaded or not."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        """serve.yaml's folder (fixed for a server's life): paths under it are shown relative
        in reasons and errors, others hidden (app/servekit/shown_paths.py)."""
        self._models: dict[str, ModelEntry] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.on_loaded: Callable[[ModelPlan, VersionEntry], Closeable] | None = None
        """Builds a version's executor when it has loaded (the DataPlane sets it), so that no
        request ever builds one."""
        self.requested: set[str] = set()
        """Models the server is asked to serve: the start-up set, models a serve.yaml edit adds
        that ``startupModels`` selects, and successful client loads, minus client unloads and
        models removed from serve.yaml (ModelControl keeps it). Strict readiness waits for
        these (DataPlane.ready)."""
        self.recent_errors: list[LoggedError] = []
        """Failed loads and rejected serve.yaml edits, newest last (the dashboard shows them)."""
        self.downloads: dict[str, Download] = {}
        """Remote models being fetched, by name (app/servekit/models/remote.py adds and removes
        them): a model with no version serving shows as LOADING with the download's progress."""

    def downloading(self, name: str) -> DownloadStatus | None:
        """The progress of ``name``'s fetch from remote storage, if one is under way."""
        download = self.downloads.get(name)
        return download.status() if download is not None else None

    def record_error(self, source: str, message: str, model: str | None = None) -> None:
        """Remember a failure for the dashboard (bounded, without absolute paths) and log it."""
        log.warning("%s: %s", source, message)
        shown = hide_paths(message, self.base_dir)
        self.recent_errors.append(LoggedError(time.time(), source, shown, model))
        del self.recent_errors[:-MAX_RECENT_ERRORS]

    # -- lookup (hot path) ----------------------------------------------------------------
    def resolve(self, name: str, version: str | None) -> tuple[ModelEntry, VersionEntry]:
        """The entry serving ``name`` at ``version`` (None: default or highest ready)."""
        entry = self._models.get(name)
        if entry is None:
            raise unknown_model(name)
        if not version:  # None or "": the serving version
            cached = entry.serving
            if cached is not None:
                found, higher = cached
                if found.state is _READY and (not higher or not any(map(_is_ready, higher))):
                    return entry, found
            return entry, self._serving(entry, name)
        number = int(version) if version.isdigit() else _labelled(entry, name, version)
        return entry, _ready(entry, name, number)

    def _serving(self, entry: ModelEntry, name: str) -> VersionEntry:
        """The version a request naming none reaches, found the long way and kept (see
        ``ModelEntry.serving``)."""
        serving = entry.serving_version()
        if serving is None:
            fetching = self.downloading(name)
            why = fetching.text() if fetching is not None else entry.reason()
            raise Unavailable(f"model {name!r} is not ready: {why}")
        found = _ready(entry, name, serving)
        higher: tuple[VersionEntry, ...] = ()
        if entry.plan.default_version is None:
            higher = tuple(v for n, v in entry.versions.items() if n > serving)
        entry.serving = (found, higher)
        return found

    def get(self, name: str) -> ModelEntry:
        entry = self._models.get(name)
        if entry is None:
            raise unknown_model(name)
        return entry

    def names(self) -> list[str]:
        return list(self._models)

    def entries(self) -> list[ModelEntry]:
        return list(self._models.values())

    # -- lifecycle --------------------------------------------------------------------------
    async def load(self, plan: ModelPlan) -> ModelEntry:
        """Load (or reload) a model; the previous versions keep serving until the swap.

        Returns the entry now serving ``plan.name``: the new one, or, when a reload failed in
        any version while the previous load was serving, the previous one (its reasons say
        why). Callers tell the two apart with ``entry.plan is plan``.
        """
        lock = self._locks.setdefault(plan.name, asyncio.Lock())
        async with lock:
            previous = self._models.get(plan.name)
            serving = previous is not None and bool(previous.ready_versions())
            if not serving:
                loading = {v.version: VersionEntry(v.version, State.LOADING) for v in plan.versions}
                self._models[plan.name] = ModelEntry(plan, loading)
            versions = {}
            for source in plan.versions:
                loaded = await asyncio.to_thread(_load_version, plan, source, self.base_dir)
                shown = hide_paths(loaded.reason, self.base_dir)  # clients read reasons
                if shown != loaded.reason:
                    log.info("%s version %s: %s", plan.name, source.version, loaded.reason)
                    loaded.reason = shown
                if plan.cached_copy and loaded.state is State.READY and not loaded.reason:
                    loaded.reason = plan.cached_copy  # its store could not be reached
                versions[source.version] = loaded
            entry = ModelEntry(plan, versions)
            for loaded in versions.values():
                self._watch(plan.name, loaded)
                if loaded.runtime is not None and self.on_loaded is not None:
                    loaded.executor = self.on_loaded(plan, loaded)
            failed = bool(entry.failed_versions()) or not versions
            if failed:
                why = entry.reason()
                self.record_error("load", f"model {plan.name!r}: {why}", plan.name)
            if previous is not None and serving and failed:
                # A failed reload keeps the old model serving and reports why.
                await _retire(entry)
                for old in previous.versions.values():
                    old.reason = f"reload failed, still serving the previous load: {why}"
                return previous
            self._models[plan.name] = entry
            if previous is not None:
                await _retire(previous)
            return entry

    def _watch(self, name: str, version: VersionEntry) -> None:
        """Follow a runtime whose health can change (an isolated model's process dies and
        restarts): its reports, from any thread, become the version's state and reason on the
        event loop, unless the version has been retired or replaced meanwhile."""
        runtime = version.runtime
        if not isinstance(runtime, Supervised):
            return
        loop = asyncio.get_running_loop()

        def apply(problem: str | None) -> None:
            if version.runtime is not runtime or version.state not in _SERVING:
                return
            if problem is None:
                version.state, version.reason = State.READY, ""
                log.info("%s version %s is READY again", name, version.version)
            else:
                version.reason, version.state = problem, State.UNAVAILABLE
                self.record_error("process", f"model {name!r}: {problem}", name)

        def report(problem: str | None) -> None:
            with contextlib.suppress(RuntimeError):  # a closed loop: the server has stopped
                loop.call_soon_threadsafe(apply, problem)

        runtime.watch(report)

    def register(self, plan: ModelPlan, reason: str = "not loaded") -> None:
        """Know a model without loading it (start-up, or a changed plan not loaded)."""
        current = self._models.get(plan.name)
        if current is not None and current.is_loaded():
            raise ValueError(f"model {plan.name!r} is loaded; reload or unload it instead")
        self._models[plan.name] = ModelEntry(plan, _unloaded(plan, reason))

    async def unload(self, name: str, reason: str = "unloaded") -> None:
        """Unload a model: new requests are refused, in-flight ones finish, then it is freed
        (and it is no longer asked for: see ``requested``); ``reason`` is what the index
        then says."""
        self.get(name)
        self.requested.discard(name)
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            entry = self.get(name)  # a load may have finished while we waited for the lock
            self._models[name] = ModelEntry(entry.plan, _unloaded(entry.plan, reason))
            await _retire(entry)

    async def remove(self, name: str) -> None:
        """Unload a model and forget it (it leaves the index)."""
        await self.unload(name)
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            self._models.pop(name, None)
        self._locks.pop(name, None)

    async def close(self) -> None:
        """Close every version at the server's stop, without waiting for their requests: the
        stop's drain (``server.drainSeconds``) already gave them their time, and a call still
        running then (a model that never returns) must not keep the process from exiting; its
        worker thread is a daemon."""
        for entry in list(self._models.values()):
            await _retire(entry, patience=0.0)

    def index(self) -> list[IndexRow]:
        """Triton's repository index: one row per model version (or per model if none)."""
        rows: list[IndexRow] = []
        for name, entry in sorted(self._models.items()):
            fetching = self.downloading(name)
            serving = bool(entry.ready_versions())
            for number, version in sorted(entry.versions.items()):
                if fetching is not None and not serving:  # its files are on their way
                    rows.append(IndexRow(name, str(number), State.LOADING.value, fetching.text()))
                    continue
                reason = version.reason
                if fetching is not None and fetching.total_bytes >= 0 and not reason:
                    # A new download (--watch) while this one serves on: say how far it is
                    # (not while the remote is only listed: that happens every poll).
                    reason = fetching.text()
                rows.append(IndexRow(name, str(number), version.state.value, reason))
            if not entry.versions:
                rows.append(IndexRow(name, "", State.UNAVAILABLE.value, entry.reason()))
        return rows


def _unloaded(plan: ModelPlan, reason: str) -> dict[int, VersionEntry]:
    return {
        v.version: VersionEntry(v.version, State.UNAVAILABLE, v.problem or plan.problem or reason)
        for v in plan.versions
    }


def _load_version(plan: ModelPlan, source: VersionSource, base_dir: Path) -> VersionEntry:
    """Load one version in a worker thread, then warm it up (serve.yaml ``warmup``): READY
    only once warm; any failure becomes an UNAVAILABLE reason."""
    if plan.problem or source.problem:
        return VersionEntry(source.version, State.UNAVAILABLE, source.problem or plan.problem or "")
    # Metrics the model's code creates while it loads are labelled with this version.
    LOADING.set((plan.name, str(source.version)))  # this thread's load only (to_thread's copy)
    resident.give_back()  # freed pages reused by this load would not show in the RSS
    before = resident.rss_bytes()
    try:
        runtime = load_runtime(plan, source)
    except LoadError as exc:
        return VersionEntry(source.version, State.UNAVAILABLE, str(exc))
    except Exception as exc:  # user code or a runtime library failing in an unexpected way
        log.exception("loading %s version %s failed", plan.name, source.version)
        return VersionEntry(source.version, State.UNAVAILABLE, f"{type(exc).__name__}: {exc}")
    try:
        calls, seconds = warm_up(plan, runtime, base_dir)
    except WarmupError as exc:
        log.error("%s version %s: %s", plan.name, source.version, exc)
        _close_quietly(runtime)
        return VersionEntry(source.version, State.UNAVAILABLE, str(exc))
    if calls:
        fields = {"model": plan.name, "version": str(source.version), "warmup_ms": seconds * 1e3}
        log.info(
            "loaded %s version %s, warmed up in %.1f ms (%d call(s))",
            plan.name, source.version, seconds * 1e3, calls, extra=fields,
        )  # fmt: skip
    else:
        log.info("loaded %s version %s", plan.name, source.version)
    if runtime.note:
        log.info("%s version %s: %s", plan.name, source.version, runtime.note)
    entry = VersionEntry(source.version, State.READY, runtime.note, runtime)
    entry.warmup_s = seconds if calls else None
    entry.resident_bytes = _resident(runtime, before)
    return entry


def _resident(runtime: ModelRuntime, before: int | None) -> int | None:
    """What loading ``runtime`` added to this process's resident memory, plus its child
    processes' (an isolated model's); None where RSS cannot be read."""
    after = resident.rss_bytes()
    if before is None or after is None:
        return None
    children = resident.children_bytes(runtime.pids()) if isinstance(runtime, IsolatedModel) else 0
    return max(0, after - before) + children


def _close_quietly(runtime: ModelRuntime) -> None:
    try:
        runtime.close()
    except Exception:
        log.exception("closing a model that failed its warm-up failed")


async def _retire(entry: ModelEntry, patience: float = DRAIN_TIMEOUT_S) -> None:
    """Close the runtimes of a replaced entry once no request uses them, or after
    ``patience`` seconds."""
    for version in entry.versions.values():
        if version.runtime is None:
            continue
        version.state = State.UNLOADING
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(version.idle.wait(), patience)
        if version.in_flight:
            log.warning(
                "%s version %s: closing with %d request(s) still running (waited %.0f s)",
                entry.plan.name,
                version.version,
                version.in_flight,
                patience,
            )
        if version.executor is not None:  # its worker threads end once their call returns
            version.executor.close()
            version.executor = None
        try:
            version.runtime.close()
        except Exception:  # a user model's unload() failing must not stop the others closing
            log.exception("closing %s version %s failed", entry.plan.name, version.version)
        version.runtime = None
        version.state = State.UNAVAILABLE
        version.reason = "unloaded"


def _ready(entry: ModelEntry, name: str, number: int) -> VersionEntry:
    """Version ``number`` of ``entry``, refused unless it exists and is READY."""
    found = entry.versions.get(number)
    if found is None:
        raise unknown_model(name, number, f"it has {_has(entry)}")
    if found.state is not State.READY:
        why = f": {found.reason}" if found.reason else ""
        raise Unavailable(f"model {name!r} version {number} is {found.state.value.lower()}{why}")
    return found


def _is_ready(version: VersionEntry) -> bool:
    return version.state is State.READY


def _has(entry: ModelEntry) -> str:
    """'versions 1, 2' (or 'no versions'): the detail a version error adds to Triton's words."""
    numbers = sorted(entry.versions)
    if not numbers:
        return "no versions"
    return ("version " if len(numbers) == 1 else "versions ") + ", ".join(map(str, numbers))


def _labelled(entry: ModelEntry, name: str, version: str) -> int:
    """The number serve.yaml's ``versionLabels`` gives ``version`` (grps' ``1.0.0``), else
    Triton's refusal of a version that is not a number."""
    config = entry.plan.config
    labels = config.version_labels if config is not None else {}
    number = labels.get(version)
    if number is None:
        named = f" or a label ({', '.join(map(repr, labels))})" if labels else ""
        raise version_not_integral(version, f"model {shown_name(name)} has {_has(entry)}{named}")
    return number
