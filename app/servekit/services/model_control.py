"""Model control: what the repository extension, hot reload and the notebook API ask for.

Transport-neutral (REST and gRPC adapters are a few lines over it). It is the one writer of the plan
in force (held by :class:`~servekit.services.state.ServerState`), and keeps models pushed by clients
(their files live in one folder each under the storage dir, see app/servekit/models/storage.py) and
in-memory Python objects, and turns requests into repository loads:

* ``load`` with no parameters (re)loads a model as it is known, and a serve.yaml model a
  client's ``config`` replaced as serve.yaml declares it (as Triton's load without override
  goes back to the repository's model); with ``config`` (Triton's ModelConfig JSON or a
  servekit entry) and ``file:`` parameters it loads that, a new model if the name is new. A
  failed reload keeps the previous load serving and raises with the reason.
* ``unload`` unloads. For a pushed model it also deletes the pushed files, as Triton deletes
  the files of a model loaded with file overrides: a model that exists only because it was
  pushed leaves the index (a later load without config answers NOT_FOUND, as Triton does for a
  model that is not in its repository), and a serve.yaml model whose files were replaced by a
  push goes back to its serve.yaml entry, unloaded (a load without config loads that again).
* ``start`` registers serve.yaml's models and loads those ``startupModels`` asks for.
* ``apply_plan`` applies an edited serve.yaml: added models load (as ``startupModels`` says),
  removed ones unload and leave the index, changed ones (entry, runtime or model files) reload;
  a model whose reload failed is not tried again until its entry or files change again.
  Restart-only server settings keep their running values (ServerState.replace_plan).
* ``add`` serves a ModelConfig (and optionally a Python object) from inside the process.

A load request is a client's data and may not become code or reach files of its choosing, whatever
the auth settings: its config cannot choose code (a Python model's entrypoint, parameters, runtime
and options come from serve.yaml only; see app/servekit/models/pushed_config.py), its storageUri
stays inside serve.yaml's folder, its files are only an ONNX model and the external data that model
references (app/servekit/formats/onnx_files.py), checked before anything is written, and it is
bounded by ``server.limits`` (instances, threads, versions, how many pushed models and bytes).
Nothing answered to a client names where pushed files live (app/servekit/shown_paths.py)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Literal

from servekit.config.compiler import (
    ModelPlan,
    ServePlan,
    available_cores,
    choose_runtime,
    plan_model,
    plan_pipeline,
    resolve_options,
)
from servekit.config.pipelines import pipeline_issues
from servekit.config.schema import MODEL_NAME, ModelConfig, RuntimeConfig
from servekit.errors import (
    POLL_FAILED,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    ServeError,
    load_failed,
)
from servekit.formats import onnx_files
from servekit.models import storage
from servekit.models.pushed_config import check_code, check_limits, check_sources, parse_load_config
from servekit.models.remote import RemoteModels
from servekit.models.repository import ModelEntry, ModelRepository, State
from servekit.models.warmup import warmup_problems
from servekit.results import DownloadStatus, IndexRow, LoggedError
from servekit.runtimes.python import forget_object, import_root, register_object
from servekit.runtimes.python_check import python_problems
from servekit.services.composition.pipelines import with_steps_waiting
from servekit.services.memory import not_loaded
from servekit.services.state import ServerState

Fingerprint = tuple[tuple[int, str, int, int], ...]


class ModelControl:
    """Load, unload, push and hot-reload models of one repository.

    Operations on one model run one at a time (a lock per model name); operations on
    different models do not wait for each other, so unloading a model whose stuck request
    holds it for minutes leaves every other model loadable. serve.yaml edits are applied one
    at a time too, each model's change under that model's lock.
    """

    FILE_PREFIX = storage.FILE_PREFIX
    """Parameters of a push (Triton's model load) starting with it carry a file of the model."""

    @staticmethod
    def python_problems(plan: ServePlan) -> dict[str, str]:
        """Model name -> why a load would refuse it, for each Python model of ``plan`` that
        would fail to load (``servekit validate``; app/servekit/runtimes/python_check.py)."""
        return python_problems(plan)

    @staticmethod
    def warmup_problems(plan: ModelPlan) -> list[str]:
        """Why ``plan``'s warm-up samples would fail its load, where the model file tells
        without loading it (app/servekit/models/warmup.py)."""
        return warmup_problems(plan)

    def __init__(self, state: ServerState, repository: ModelRepository) -> None:
        self._state = state
        self._repository = repository
        self._locks: dict[str, asyncio.Lock] = {}
        self._plan_lock = asyncio.Lock()
        self._staged: dict[str, Path] = {}  # pushed folders written, their load not yet done
        self._pushed: dict[str, Path] = {}  # model -> its push folder in storage
        self._overridden: set[str] = set()
        """serve.yaml's models a client's load with ``config`` replaced (a plain load restores
        them)."""
        plan = state.plan
        self._fingerprints = {m.name: fingerprint(m) for m in plan.models}
        self.remote = RemoteModels(plan.server.storage, plan.base_dir, repository.downloads)
        """The cache of models whose storageUri is remote (fetched before they load)."""
        self._refresher: asyncio.Task[None] | None = None
        import_root(plan.base_dir)
        storage.clean(self.storage_dir)

    @property
    def plan(self) -> ServePlan:
        """The plan in force (held by ServerState; replaced only by ``apply_plan``)."""
        return self._state.plan

    @property
    def mode(self) -> Literal["none", "explicit"]:
        """``server.modelControl`` in force: whether clients may load and unload models."""
        return self._state.plan.model_control

    @property
    def storage_dir(self) -> Path:
        plan = self._state.plan
        return storage.default_storage_dir(plan.base_dir, plan.server.storage_dir)

    @property
    def recent_errors(self) -> list[LoggedError]:
        """Failed loads and rejected serve.yaml edits, newest last (a copy)."""
        return list(self._repository.recent_errors)

    def record_error(self, source: str, message: str) -> None:
        """Log a problem with serve.yaml (a rejected edit, a setting that needs a restart) where
        the dashboard shows it."""
        self._repository.record_error(source, message)

    def index(self, ready_only: bool = False) -> list[IndexRow]:
        """One row per model version: name, version, state, reason (ready ones only if asked;
        a pipeline whose steps cannot run is not READY)."""
        rows = with_steps_waiting(self._repository, self._repository.index())
        return [r for r in rows if r.state == State.READY.value] if ready_only else rows

    def downloads(self) -> list[DownloadStatus]:
        """Remote models being fetched now, with bytes, rate and time left (safe to call from
        any thread: a notebook's ``serve()`` shows them while it waits)."""
        names = sorted(self._repository.downloads)
        found = (self._repository.downloading(name) for name in names)
        return [status for status in found if status is not None]

    def served_plans(self) -> list[ModelPlan]:
        """The plan of every model in the index, as it serves now: serve.yaml's, pushed by a
        client, or added from memory (what ``save`` writes as a project)."""
        return [entry.plan for entry in self._repository.entries()]

    async def start(self) -> None:
        """Register every planned model and load those ``startupModels`` asks for; readiness
        waits for this (ServerState.startup_done)."""
        plan = self._state.plan
        # Not under the lock: clients may load and unload while start-up models load (the
        # repository serialises loads per model), as the watcher waits for this to finish.
        for model in plan.models:
            self._repository.register(model, not_loaded(model))
        # Remote models download side by side (each in a thread) while the local ones load:
        # a large download keeps no other model from serving.
        starting = [m for m in plan.models if plan.loads_at_start(m.name)]
        self._repository.requested.update(m.name for m in starting)
        remote = [asyncio.create_task(self._fetch_and_load(m)) for m in starting if m.remote]
        try:
            for model in starting:
                if model.remote is None:
                    await self._repository.load(model)
            await asyncio.gather(*remote)
        finally:
            for task in remote:
                task.cancel()
        self._state.startup_done = True
        if self._refresher is None:
            self._refresher = asyncio.create_task(self._refresh_remote_models())

    async def _fetch_and_load(self, model: ModelPlan) -> None:
        fetched = await self.fetched(model)
        self._fingerprints[model.name] = fingerprint(fetched)
        await self._repository.load(fetched)

    async def close(self) -> None:
        """Stop looking at remote storage; downloads under way stop at their next chunk."""
        self.remote.cancel()
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
            self._refresher = None

    async def fetched(self, plan: ModelPlan) -> ModelPlan:
        """``plan`` with a remote storageUri's files at hand (downloaded in a thread, so the
        loop keeps serving); any other plan as it is."""
        if plan.remote is None:
            return plan
        return await self.remote.materialized(plan)

    async def _refresh_remote_models(self) -> None:
        """Remote models, looked at again every ``server.storage.pollSeconds``: under
        ``--watch`` every remote model served or asked for (a new version folder becomes a new
        version, a changed object a reload, and a failed reload keeps the old load serving);
        without it, only those whose download failed or that serve a cached copy because
        their store could not be reached, with a backoff doubling up to 10 min. Once the
        store answers, a model serving a cached copy loads what it holds (the warning goes,
        even if the files are the same)."""
        while True:
            await asyncio.sleep(self.plan.server.storage.poll_seconds)
            for plan in self.plan.models:
                if plan.remote is None or plan.name not in self._repository.requested:
                    continue
                entry = self._entry(plan.name)
                failed = entry is None or not entry.ready_versions()
                stale = entry is not None and entry.plan.cached_copy is not None
                if not self.plan.server.watch and not failed and not stale:
                    continue
                if (failed or stale) and not self.remote.due_for_retry(plan.name):
                    continue
                async with self._lock(plan.name):
                    current = self._current(plan.name)
                    if current is None or current.remote is None:
                        continue  # replaced by a push or removed meanwhile
                    fresh = await self.fetched(current)
                    reached = fresh.cached_copy is None
                    same = fingerprint(fresh) == self._fingerprints.get(plan.name)
                    if not failed and same and not (stale and reached):
                        continue
                    with contextlib.suppress(ServeError):  # the repository recorded why
                        await self._load(fresh, None)

    # -- repository extension ---------------------------------------------------------------
    async def load(self, name: str, parameters: dict[str, object] | None = None) -> None:
        """Load or reload ``name``; ``config`` and ``file:<version>/<path>`` as in Triton.

        Any refusal after the client-control check says "failed to load '<name>', ..." first,
        as Triton's does (its clients look for those words)."""
        self._check_client_control("load")
        try:
            await self._load_request(name, parameters)
        except ServeError as exc:
            raise load_failed(name, exc) from None

    async def _load_request(self, name: str, parameters: dict[str, object] | None) -> None:
        _check_name(name)
        params = dict(parameters or {})
        config_text = params.pop("config", None)
        files = {k: params.pop(k) for k in list(params) if k.startswith(storage.FILE_PREFIX)}
        if params:
            raise InvalidArgument(
                f"unknown load parameter(s) {', '.join(map(repr, params))}; accepted: config, "
                "file:<version>/<name>"
            )
        if files and config_text is None:
            raise InvalidArgument("file: parameters need a config parameter as well")
        try:
            pushed_files = storage.validate_files(files, self.plan.server.max_request_bytes)
        except InvalidArgument as exc:  # Triton's words for file parameters it cannot use
            raise InvalidArgument(f"{POLL_FAILED}: {exc.message}") from None
        async with self._lock(name):
            current = self._current(name)
            if config_text is None:
                if current is None:
                    raise NotFound(
                        f"{POLL_FAILED}: serve.yaml has no model of that name; push it with a "
                        "config parameter"
                    )
                declared = self.plan.model(name)
                if declared is not None and name in self._overridden:
                    # As in Triton, a load without config goes back to the repository's model
                    # (serve.yaml's entry); the pushed files are deleted once it serves.
                    await self._load(self._recompile(declared), None)
                    self._overridden.discard(name)
                    return
                await self._load(self._recompile(current), None)
                return
            base = current.config if current is not None else None
            model = parse_load_config(name, config_text, base, [p for p, _ in pushed_files])
            runtime = self._runtime_for(model)
            model = check_code(model, runtime, current)
            versions = {p.parts[0] for p, _ in pushed_files}
            check_limits(model, base, self.plan.server.limits, len(versions))
            if pushed_files:
                if runtime.implementation != "onnxruntime":
                    raise PermissionDenied(
                        f"{model.model_format.name} models cannot be pushed as files (only "
                        "ONNX models can: Python code and pickled models run code when they "
                        "load); declare them in serve.yaml"
                    )
                await asyncio.to_thread(onnx_files.check_pushed, pushed_files)
                self._check_room(name, pushed_files)
            else:
                check_sources(model, base, self.plan.base_dir, self.storage_dir)
            # Everything is checked: only now is anything written.
            folder = storage.stage(self.storage_dir, name, pushed_files) if pushed_files else None
            if folder is None:
                await self._load(self.compile_model(model), None)
            else:
                model = model.model_copy(update={"storage_uri": str(folder)})
                self._staged[name] = folder  # counted by _check_room while it loads
                try:
                    await self._load(self.compile_model(model), folder)
                finally:
                    self._staged.pop(name, None)
            if self.plan.model(name) is not None:
                self._overridden.add(name)

    def _check_room(self, name: str, files: list[tuple[PurePosixPath, bytes]]) -> None:
        """``server.limits.maxPushedModels`` and ``maxPushedBytes``, counted on disk; a push
        replacing ``name``'s files does not count those (they are deleted once it loads)."""
        limits = self.plan.server.limits
        folders = {**self._pushed, **self._staged}  # a push of another model may be loading
        others = [folder for model, folder in folders.items() if model != name]
        if len(others) + 1 > limits.max_pushed_models:
            raise ResourceExhausted(
                f"{len(others)} pushed models are stored, server.limits.maxPushedModels is "
                f"{limits.max_pushed_models}: unload one first"
            )
        stored = sum(storage.disk_bytes(folder) for folder in others)
        wanted = stored + sum(len(data) for _, data in files)
        if wanted > limits.max_pushed_bytes:
            raise ResourceExhausted(
                f"pushed models would take {wanted} bytes on disk ({stored} stored), beyond "
                f"server.limits.maxPushedBytes ({limits.max_pushed_bytes})"
            )

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Unload ``name`` (in-flight requests finish); a pushed model's files are deleted (see
        the module docstring). servekit has no ensembles, so no model depends on another and
        ``unload_dependents`` has nothing more to unload."""
        self._check_client_control("unload")
        _check_name(name)
        async with self._lock(name):
            plan = self._repository.get(name).plan
            if not self._is_pushed(name, plan):
                await self._repository.unload(name)
                return
            declared = self.plan.model(name)
            if declared is None:
                await self._forget(name)
                return
            await self._repository.unload(name)
            self._release_push(name, declared)
            self._repository.register(declared, "unloaded")
            self._overridden.discard(name)
            self._fingerprints[name] = fingerprint(declared)

    async def remove(self, name: str) -> None:
        """Unload ``name`` and forget it: it leaves the index and its pushed files are deleted."""
        _check_name(name)
        async with self._lock(name):
            self._repository.get(name)
            await self._forget(name)

    async def add(self, model: ModelConfig, python_object: object | None = None) -> None:
        """Serve ``model`` (replacing a model of that name); ``python_object`` is used instead
        of importing the entrypoint (a function, class or instance held in memory)."""
        if python_object is not None:
            model = model.model_copy(update={"entrypoint": register_object(python_object)})
        try:
            async with self._lock(model.name):
                await self._load(self.compile_model(model), None)
                self._overridden.discard(model.name)
        except BaseException:
            if python_object is not None:
                forget_object(model.entrypoint)
            raise

    # -- hot reload ---------------------------------------------------------------------------
    async def apply_plan(self, new_plan: ServePlan) -> dict[str, list[str]]:
        """Apply an edited serve.yaml; returns the names added, removed, reloaded and failed."""
        done: dict[str, list[str]] = {"added": [], "removed": [], "reloaded": [], "failed": []}
        async with self._plan_lock:
            old = self._state.plan
            new_plan = self._state.replace_plan(new_plan)
            import_root(new_plan.base_dir)
            wanted = {m.name: m for m in new_plan.models}
            for model in old.models:
                if model.name in wanted:
                    continue
                async with self._lock(model.name):
                    if self._current(model.name) is not None:
                        await self._forget(model.name)
                        done["removed"].append(model.name)
            previous = {m.name: m for m in old.models}
            for plan in new_plan.models:
                async with self._lock(plan.name):
                    await self._apply_one(plan, previous.get(plan.name), old, new_plan, done)
        return done

    async def _apply_one(
        self,
        plan: ModelPlan,
        before: ModelPlan | None,
        old: ServePlan,
        new_plan: ServePlan,
        done: dict[str, list[str]],
    ) -> None:
        """One model of an edited serve.yaml (under that model's lock)."""
        plan = await self.fetched(plan)  # under --watch, every edit looks at the remote too
        if before is not None and self._unchanged(before, plan, old, new_plan):
            return
        entry = self._entry(plan.name)
        if (
            entry is not None
            and before is not None
            and self._routing_only(before, plan, old, new_plan)
        ):
            entry.plan = plan  # a new traffic split or shadow: the next request follows it
            done["reloaded"].append(plan.name)
            return
        loaded = entry is not None and entry.is_loaded()
        if before is None and new_plan.loads_at_start(plan.name):
            self._repository.requested.add(plan.name)
        # A model asked for loads again when its entry changes (a failed one may be fixed)
        should_load = loaded or plan.name in self._repository.requested
        done["added" if before is None else "reloaded"].append(plan.name)
        if not should_load:
            self._release_push(plan.name, plan)
            self._repository.register(plan, not_loaded(plan))
            self._fingerprints[plan.name] = fingerprint(plan)
            self._overridden.discard(plan.name)
            return
        try:
            await self._load(plan, None)
            self._overridden.discard(plan.name)
        except InvalidArgument:
            done["failed"].append(plan.name)  # the repository recorded why
            # Tried as it stands: an unrelated edit must not retry it (and report it
            # "reloaded" again); an edit of its entry or files will.
            self._fingerprints[plan.name] = fingerprint(plan)

    # -- helpers ------------------------------------------------------------------------------
    @property
    def client_control(self) -> bool:
        """Whether clients may load and unload models (``server.modelControl`` in force)."""
        return self.mode == "explicit"

    def _lock(self, name: str) -> asyncio.Lock:
        """The lock of one model name (kept: a handful of bytes per name ever used)."""
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock

    def _check_client_control(self, action: str) -> None:
        if not self.client_control:
            raise PermissionDenied(
                f"model {action} is disabled: server.modelControl is none (the default when the "
                "server listens beyond loopback without a repository token); set "
                "server.modelControl: explicit with server.auth.repository to allow it"
            )

    def compile_model(self, model: ModelConfig) -> ModelPlan:
        """Plan one model against the runtimes of the plan in force; a pipeline against the
        models served now (its steps must be served, with matching tensors, and no cycle)."""
        if model.pipeline is not None:
            served = [
                e.plan.config
                for e in self._repository.entries()
                if e.plan.config is not None and e.plan.name != model.name
            ]
            issues = pipeline_issues([*served, model], None)
            if issues:
                raise InvalidArgument(
                    f"pipeline {model.name!r}: " + "; ".join(i.message for i in issues)
                )
            return plan_pipeline(model)
        runtime = self._runtime_for(model)
        total = sum(e.plan.instances for e in self._repository.entries()) + model.instances
        options = resolve_options(runtime.options, model.runtime_options, available_cores(), total)
        return plan_model(model, runtime, options, self.plan.base_dir)

    def _runtime_for(self, model: ModelConfig) -> RuntimeConfig:
        try:
            return choose_runtime(model, {r.name: r for r in self.plan.runtimes})
        except ValueError as exc:
            raise InvalidArgument(f"model {model.name!r}: {exc}") from None

    def _entry(self, name: str) -> ModelEntry | None:
        try:
            return self._repository.get(name)
        except NotFound:
            return None

    def _current(self, name: str) -> ModelPlan | None:
        entry = self._entry(name)
        return entry.plan if entry is not None else None

    def _recompile(self, plan: ModelPlan) -> ModelPlan:
        """The plan again, with versions rediscovered on disk (a new version folder counts)."""
        return self.compile_model(plan.config) if plan.config is not None else plan

    async def _load(self, plan: ModelPlan, folder: Path | None) -> None:
        plan = await self.fetched(plan)
        before = self._current(plan.name)
        try:
            entry = await self._repository.load(plan)
        except BaseException:
            storage.discard(self.storage_dir, folder)
            raise
        if entry.plan is not plan or entry.failed_versions() or not entry.versions:
            storage.discard(self.storage_dir, folder)
            raise load_failed(plan.name, InvalidArgument(entry.reason()))
        self._fingerprints[plan.name] = fingerprint(plan)
        if not plan.on_demand:  # loaded on request: now asked for (on demand: it may go)
            self._repository.requested.add(plan.name)
        self._release_push(plan.name, plan)
        if folder is not None:
            self._pushed[plan.name] = folder
        old_entrypoint = before.config.entrypoint if before and before.config else None
        if plan.config is not None and old_entrypoint != plan.config.entrypoint:
            forget_object(old_entrypoint)  # the object registered for the replaced load

    def _is_pushed(self, name: str, plan: ModelPlan) -> bool:
        """Whether ``name`` serves (or failed to load) files a client pushed."""
        uri = plan.config.storage_uri if plan.config is not None else None
        if name in self._pushed or uri is None or not Path(uri).is_absolute():
            return name in self._pushed
        return Path(uri).is_relative_to(self.storage_dir.resolve())

    def _release_push(self, name: str, plan: ModelPlan) -> None:
        """Forget the previous push folder of ``name`` once ``plan`` no longer uses it."""
        old = self._pushed.get(name)
        if old is not None and (plan.config is None or plan.config.storage_uri != str(old)):
            storage.discard(self.storage_dir, self._pushed.pop(name))

    async def _forget(self, name: str) -> None:
        self.remote.forget(name)
        plan = self._current(name)
        await self._repository.remove(name)
        storage.discard(self.storage_dir, self._pushed.pop(name, None))
        self._fingerprints.pop(name, None)
        self._overridden.discard(name)
        if plan is not None and plan.config is not None:
            forget_object(plan.config.entrypoint)

    def _unchanged(self, a: ModelPlan, b: ModelPlan, old: ServePlan, new: ServePlan) -> bool:
        """Same entry, same runtime definition, same files (derived thread counts ignored)."""
        runtime_a = next((r for r in old.runtimes if r.name == a.runtime), None)
        runtime_b = next((r for r in new.runtimes if r.name == b.runtime), None)
        if a.remote is not None and b.remote == a.remote:  # versions come from the fetch
            b = replace(b, versions=a.versions, labels_file=a.labels_file, problem=a.problem)
        return (
            replace(a, options=b.options) == b
            and runtime_a == runtime_b
            and self._fingerprints.get(a.name) == fingerprint(b)
        )

    def _routing_only(self, a: ModelPlan, b: ModelPlan, old: ServePlan, new: ServePlan) -> bool:
        """Only ``traffic`` or ``shadow`` changed: applied to the loaded versions as they are,
        so moving a canary's share reloads nothing."""
        if a.config is None or b.config is None or a.routing == b.routing:
            return False
        routed = {"traffic": b.config.traffic, "shadow": b.config.shadow}
        moved = replace(a, routing=b.routing, config=a.config.model_copy(update=routed))
        return self._unchanged(moved, b, old, new)


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not MODEL_NAME.match(name):
        raise InvalidArgument(
            f"invalid model name {str(name)[:200]!r}: use letters, digits, '_', '.', '-' "
            "(starting with a letter or digit, at most 128 characters)"
        )


def fingerprint(plan: ModelPlan) -> Fingerprint:
    """Model files by version, size and modification time: a changed file means a reload."""
    out = []
    for version in plan.versions:
        if version.path is not None:
            try:
                stat = version.path.stat()
            except OSError:
                continue
            out.append((version.version, str(version.path), stat.st_mtime_ns, stat.st_size))
    return tuple(out)
