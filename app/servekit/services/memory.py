"""Models loaded on demand under a memory budget: the one owner of that policy.

A model marked ``load: onDemand`` is registered at start and not loaded. The first inference
request for it finds it not READY in the repository; the DataPlane then asks :class:`OnDemand`
to load it (``ensure``) and the request waits for the load, within its deadline: when the load
would take longer (its last load's time says so) or has not finished by then, the request is
answered 503 with ``Retry-After`` while the load goes on, so the retry finds the model.

Under ``server.modelMemory`` each load first makes room: loaded on-demand models are unloaded,
least recently used first (the last inference in the version's statistics, or the load's end),
until the loaded models' measured resident sizes (app/servekit/models/resident.py) and the
expected size of the new one fit. A model is never unloaded while a request is in flight in it
(``VersionEntry.in_flight``) or waits to run in it after its load (``_waiting``). When nothing
is idle, the load waits for a model to become idle. On-demand loads run one at a time, so each
one's measured size is its own; the size of a model not measured yet is taken to be the
largest one measured so far, so the budget can be passed by at most one model's size until its
load is measured, and what it passes by is then given back at once. A model that alone needs
more than the budget leaves for on-demand models is unloaded again and refused with a clear
error until its entry changes, as is a model whose load failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from servekit.config.compiler import ModelPlan
from servekit.errors import NotFound, Unavailable
from servekit.models import resident
from servekit.models.repository import ModelEntry, ModelRepository, VersionEntry
from servekit.services.deadlines import request_deadlines
from servekit.services.state import ServerState
from servekit.services.stats import Statistics
from servekit.types import InferRequest, ModelMetadata, TensorSpec

log = logging.getLogger("servekit.memory")

NOT_LOADED = "not loaded (load: onDemand): its first inference request loads it"
"""The index's reason for an on-demand model before its first request."""


def not_loaded(plan: ModelPlan) -> str:
    """The index's reason for a model registered before its first load."""
    return NOT_LOADED if plan.on_demand else "not loaded"


UNLOADED = (
    "unloaded to stay within server.modelMemory (load: onDemand): its next inference request "
    "loads it again"
)
"""The index's reason for an on-demand model unloaded to make room."""
ON_DEMAND_REASONS = (NOT_LOADED, UNLOADED)
"""Reasons of on-demand models not loaded that are no failure (the dashboard shows none)."""
ROOM_POLL_S = 0.05
"""How often a load waiting for room looks again when no idle event tells it (a model that
stops being protected by a request about to run in it sets no event)."""


@dataclass(frozen=True, slots=True)
class ModelMemory:
    """What the policy knows of one model: its measured resident size, its on-demand loads
    and unloads, and how long its loads took."""

    name: str
    on_demand: bool
    loaded: bool
    resident_bytes: int | None
    """The size measured at its last load (kept while it is unloaded); None: never measured."""
    loads: int = 0
    unloads: int = 0
    load_seconds_total: float = 0.0
    last_load_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class MemoryStatus:
    """``server.modelMemory`` in bytes (None: no budget), what loaded models hold, and each
    model's figures (the dashboard, /metrics and the notebook read this)."""

    budget_bytes: int | None
    used_bytes: int
    models: tuple[ModelMemory, ...]


def budget_bytes(setting: int | str | None) -> int | None:
    """``server.modelMemory`` in bytes: as given, or its percentage of the memory this process
    may use (resident.physical_bytes); None: no budget (or RAM unknown)."""
    if setting is None or isinstance(setting, int):
        return setting
    ram = resident.physical_bytes()
    return None if ram is None else int(ram * float(setting.rstrip("%")) / 100)


def megabytes(size: int | None) -> str:
    return "unknown" if size is None else f"{size / 2**20:.1f} MiB"


@dataclass(slots=True)
class _Record:
    size: int | None = None
    loads: int = 0
    unloads: int = 0
    seconds_total: float = 0.0
    last_seconds: float | None = None
    loaded_at: float = 0.0
    """``time.time()`` at the end of its last on-demand load (recency before any request)."""


class OnDemand:
    """Loads ``load: onDemand`` models for their requests and unloads the least recently used
    ones under ``server.modelMemory`` (see the module docstring)."""

    def __init__(self, state: ServerState, repository: ModelRepository, statistics: Statistics):
        self._state = state
        self._repository = repository
        self._statistics = statistics
        self._lock = asyncio.Lock()
        """Held by one on-demand load at a time (its measured size is then its own)."""
        self._loads: dict[str, asyncio.Task[None]] = {}
        self._waiting: dict[str, int] = {}
        """Requests waiting for (or just woken by) a model's load: it is not unloaded then."""
        self._records: dict[str, _Record] = {}
        self._refused: dict[str, tuple[ModelPlan, str]] = {}
        """Models whose on-demand load failed or that are too big, with why, until their entry
        changes (an edit, a repository load): not loaded again by every request."""
        self.fetch: Callable[[ModelPlan], Awaitable[ModelPlan]] | None = None
        """Brings a remote model's files before it loads (ModelControl's, set by the server)."""
        plan = state.plan
        if plan.server.model_memory is not None or any(m.on_demand for m in plan.models):
            resident.exact_frees()  # what an unloaded model held leaves the process

    # -- what the DataPlane asks --------------------------------------------------------------
    def wanted(self, name: str) -> bool:
        """Whether a request for ``name`` that found no READY version should load it: an
        on-demand model not loaded, or loading on demand now."""
        try:
            entry = self._repository.get(name)
        except NotFound:
            return False
        return entry.plan.on_demand and (name in self._loads or not entry.is_loaded())

    async def loaded(
        self, request: InferRequest, deadline: float | None, error: Unavailable
    ) -> tuple[ModelEntry, VersionEntry]:
        """The version ``request`` reaches once its on-demand model has loaded, waiting within
        the request's deadline (``DataPlane.infer``'s ``deadline``, its ``timeout`` parameter,
        ``server.requestTimeoutSeconds``); ``error`` (not READY) for any other model."""
        if not self.wanted(request.model_name):
            raise error
        until, _ = request_deadlines(request, deadline, self._state.request_timeout_s)
        await self.ensure(request.model_name, until)
        return self._repository.resolve(request.model_name, request.model_version)

    async def ensure(self, name: str, deadline: float | None) -> None:
        """Load ``name`` for a request that expires at ``deadline`` (``time.monotonic()``;
        None: it waits for the load). Unavailable with ``Retry-After`` when the load would
        not be done in time (it goes on), or with the reason when it cannot load."""
        refused = self._refused.get(name)
        if refused is not None:
            if refused[0] is self._repository.get(name).plan:
                raise Unavailable(refused[1])
            del self._refused[name]  # its entry changed: try again
        self._waiting[name] = self._waiting.get(name, 0) + 1
        try:
            task = self._loads.get(name)
            if task is None:
                task = self._loads[name] = asyncio.create_task(self._load(name))
                task.add_done_callback(lambda done: self._finished(name, done))
            remaining = None if deadline is None else deadline - time.monotonic()
            expected = self._expected_seconds(name)
            if remaining is not None and expected is not None and expected > remaining:
                raise self._not_yet(name, expected, "would take longer than the request may wait")
            try:
                await asyncio.wait_for(asyncio.shield(task), remaining)
            except TimeoutError:
                late = "did not finish within the request's deadline"
                raise self._not_yet(name, expected, late) from None
        finally:
            self._waiting[name] -= 1
            if not self._waiting[name]:
                del self._waiting[name]

    def _finished(self, name: str, task: asyncio.Task[None]) -> None:
        """A load ended: forget it, and take its error (its waiters may all have gone)."""
        self._loads.pop(name, None)
        if not task.cancelled():
            task.exception()

    def _not_yet(self, name: str, expected: float | None, why: str) -> Unavailable:
        wait = math.ceil(expected) if expected is not None else 1
        return Unavailable(
            f"model {name!r} is loading on demand and its load {why}; retry in {wait} s",
            retry_after_seconds=wait,
        )

    def _expected_seconds(self, name: str) -> float | None:
        """How long ``name``'s load is expected to take: its last one, else the others'
        average (None: nothing loaded on demand yet)."""
        record = self._records.get(name)
        if record is not None and record.last_seconds is not None:
            return record.last_seconds
        done = [r for r in self._records.values() if r.loads]
        return sum(r.seconds_total / r.loads for r in done) / len(done) if done else None

    # -- loading and unloading ----------------------------------------------------------------
    async def _load(self, name: str) -> None:
        async with self._lock:
            entry = self._repository.get(name)
            if entry.ready_versions():  # loaded meanwhile (a client's load)
                return
            plan = entry.plan
            resident.exact_frees()  # (once: an edit may have added the first on-demand model)
            record = self._records.setdefault(name, _Record())
            budget = self.budget()
            expected = record.size if record.size is not None else self._largest()
            if budget is not None and record.size is not None and record.size > self._room(budget):
                raise self._refuse(plan, record.size, budget)
            await self._make_room(expected or 0, wait=True)
            started = time.monotonic()
            loadable = await self.fetch(plan) if self.fetch is not None else plan
            loaded = await self._repository.load(loadable)
            seconds = time.monotonic() - started
            record.loads += 1
            record.seconds_total += seconds
            record.last_seconds = seconds
            record.loaded_at = time.time()
            if loaded.plan is not loadable or loaded.failed_versions() or not loaded.versions:
                message = f"model {name!r} failed to load on demand: {loaded.reason()}"
                self._refused[name] = (self._repository.get(name).plan, message)
                raise Unavailable(message)
            record.size = _size(loaded)
            log.info(
                "loaded %s on demand in %.3f s, resident %s", name, seconds, megabytes(record.size),
                extra={"model": name, "load_s": seconds, "resident_bytes": record.size},
            )  # fmt: skip
            if budget is not None and record.size is not None and record.size > self._room(budget):
                error = self._refuse(loaded.plan, record.size, budget)
                await self._repository.unload(name, error.message)
                raise error
            await self._make_room(0, wait=False)  # measured more than expected: give it back

    def _refuse(self, plan: ModelPlan, size: int, budget: int) -> Unavailable:
        message = (
            f"model {plan.name!r} needs {megabytes(size)} resident, more than "
            f"server.modelMemory ({megabytes(budget)}) leaves for models loaded on demand "
            f"({megabytes(self._room(budget))}); raise server.modelMemory or shrink the model"
        )
        self._refused[plan.name] = (plan, message)
        self._repository.record_error("load", message, plan.name)
        return Unavailable(message)

    async def _make_room(self, need: int, *, wait: bool) -> None:
        """Unload idle on-demand models, least recently used first, until the loaded models
        and ``need`` more bytes fit the budget; with ``wait``, wait for models in use to
        become idle when that is not enough."""
        while True:
            budget = self.budget()
            if budget is None or self.used() + need <= budget:
                return
            idle = self._idle()
            if idle:
                await self._unload(idle[0])
                continue
            busy = [
                version.idle
                for entry in self._repository.entries()
                if entry.plan.on_demand
                for version in entry.versions.values()
                if version.runtime is not None
            ]
            if not wait or not busy:
                return  # nothing on demand holds memory: the load proceeds (checked after)
            waits = [asyncio.ensure_future(event.wait()) for event in busy]
            try:
                await asyncio.wait(waits, timeout=ROOM_POLL_S, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for future in waits:
                    future.cancel()

    def _idle(self) -> list[ModelEntry]:
        """Loaded on-demand models no request uses or waits for, least recently used first."""
        found = []
        for entry in self._repository.entries():
            name = entry.plan.name
            if not entry.plan.on_demand or name in self._waiting or name in self._loads:
                continue
            loaded = [v for v in entry.versions.values() if v.runtime is not None]
            if not loaded or any(v.in_flight for v in loaded):
                continue
            found.append((self._last_used(entry), name, entry))
        found.sort(key=lambda item: (item[0], item[1]))
        return [entry for _, _, entry in found]

    def _last_used(self, entry: ModelEntry) -> float:
        """When ``entry`` was last used: its latest inference, or its load's end."""
        name = entry.plan.name
        record = self._records.get(name)
        latest = record.loaded_at if record is not None else 0.0
        for number in entry.versions:
            stats = self._statistics.find(name, number)
            if stats is not None:
                latest = max(latest, stats.last_inference_ms / 1000)
        return latest

    async def _unload(self, entry: ModelEntry) -> None:
        name = entry.plan.name
        size = _size(entry)
        log.info(
            "unloading %s (load: onDemand, least recently used) to stay within "
            "server.modelMemory", name, extra={"model": name, "resident_bytes": size},
        )  # fmt: skip
        record = self._records.setdefault(name, _Record())
        record.unloads += 1
        await self._repository.unload(name, UNLOADED)
        await asyncio.to_thread(resident.give_back)  # what it held leaves the process

    # -- figures ------------------------------------------------------------------------------
    def budget(self) -> int | None:
        """``server.modelMemory`` in force, in bytes (read on use: an edit applies at once)."""
        return budget_bytes(self._state.plan.server.model_memory)

    def used(self) -> int:
        """The measured resident sizes of every loaded version, of every model."""
        return sum(_size(entry) or 0 for entry in self._repository.entries())

    def _room(self, budget: int) -> int:
        """What the budget leaves for on-demand models: models loaded otherwise stay."""
        pinned = sum(
            _size(entry) or 0 for entry in self._repository.entries() if not entry.plan.on_demand
        )
        return budget - pinned

    def _largest(self) -> int | None:
        sizes = [r.size for r in self._records.values() if r.size is not None]
        return max(sizes) if sizes else None

    def status(self) -> MemoryStatus:
        """The budget, what is held and each model's figures, sorted by name."""
        models = []
        for entry in sorted(self._repository.entries(), key=lambda e: e.plan.name):
            name = entry.plan.name
            record = self._records.get(name, _Record())
            size = _size(entry)
            loaded = any(v.runtime is not None for v in entry.versions.values())
            models.append(
                ModelMemory(
                    name,
                    entry.plan.on_demand,
                    loaded,
                    size if size is not None else record.size,
                    record.loads,
                    record.unloads,
                    record.seconds_total,
                    record.last_seconds,
                )
            )
        return MemoryStatus(self.budget(), self.used(), tuple(models))

    async def close(self) -> None:
        """Stop the loads under way (the server is stopping)."""
        for task in list(self._loads.values()):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


def declared_metadata(plan: ModelPlan) -> ModelMetadata | None:
    """The metadata of an on-demand model that is not loaded, from its serve.yaml entry when
    that declares every tensor (a Python model's does), as Triton answers from a model's
    config; None otherwise (the request then says why the model is not ready)."""
    if not plan.on_demand or plan.implementation != "python":
        return None
    specs = []
    for declared in (plan.inputs, plan.outputs):
        if not declared or any(t.datatype is None or t.shape is None for t in declared):
            return None
        specs.append(
            tuple(TensorSpec(t.name, t.datatype or "", tuple(t.shape or ())) for t in declared)
        )
    return ModelMetadata(plan.name, (), "python", specs[0], specs[1])


def _size(entry: ModelEntry) -> int | None:
    """The resident size of ``entry``'s loaded versions (None: none loaded, or not measured)."""
    sizes = [v.resident_bytes for v in entry.versions.values() if v.runtime is not None]
    known = [size for size in sizes if size is not None]
    return sum(known) if known else None
