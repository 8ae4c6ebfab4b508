"""Hot reload (``servekit serve --watch`` or ``server.watch: true``): apply serve.yaml edits live.

watchfiles (Rust ``notify``) reports changes to serve.yaml's folder and to the model folders it
names; every change, and a once-a-second look at serve.yaml's content (which also catches
ConfigMap-style symlink swaps), re-reads the file. A valid edit becomes a new plan that
:meth:`ModelControl.apply_plan` applies (added models load, removed unload, changed reload, models
whose files changed on disk reload). An invalid edit is logged and recorded in
``control.recent_errors`` with its YAML location, and the running configuration stays as it was.
Each server setting is marked live or restart-only where it is declared
(app/servekit/config/schema.py, ``RESTART_ONLY``): live ones take effect with the new plan; an edit
of a restart-only one (listeners, tokens, TLS, storage dir) is reported as needing a restart, and
the running value stays in force (ServerState.replace_plan).

Two guards stand between a half-written file and the running models. A change is applied only once
serve.yaml has *settled*: unchanged (modification time, size and content) for ``SETTLE_STEP_S``,
waited for at most ``SETTLE_MAX_S`` (a template writer or an editor writes in several steps; a shell
redirect truncates first). And an edit that would leave no models at all while models are served is
refused (logged, recorded in ``recent_errors``, the running configuration kept) unless the file says
so explicitly with a ``models:`` list (``models: []`` unloads every model on purpose): an empty or
cut-short file (``> serve.yaml``, a failed template render) once unloaded every model of a busy
server. Every re-read goes through :func:`servekit.config.overrides.load_plan` with the command
line's :class:`~servekit.config.overrides.Overrides`, so ``--only``, ``--storage-uri`` and the
listener flags hold for the edited file as they did at start (a setting a flag overrides is not
changed by editing it, so no restart is asked for).

A serve.yaml in object storage (``servekit serve s3://bucket/prod/serve.yaml --watch``, every
replica started from the same object) has no file events: the object is read again every
``server.storage.pollSeconds`` (app/servekit/models/remote_config.py), and content that differs
from the last read is written to the local copy the server loaded and applied by the same
:meth:`_Watcher.check` as a local edit (settled, compiled, refused with the old configuration
kept, or applied). A store that cannot be read is logged and recorded once per outage and
the running configuration keeps serving; the next read that succeeds says so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any, Protocol

import yaml
from pydantic.alias_generators import to_camel
from watchfiles import Change, awatch

from servekit.config.compiler import ServePlan
from servekit.config.loader import ConfigError
from servekit.config.overrides import Overrides, load_plan
from servekit.config.schema import ServerConfig
from servekit.models.remote_config import (
    RemoteConfigError,
    RemoteConfigMissing,
    in_daemon_thread,
    is_remote_config,
    local_copy,
    read_remote_config,
)
from servekit.services.model_control import ModelControl
from servekit.services.state import restart_only_edits
from servekit.shown_paths import shown_uri


class ServeKit(Protocol):
    """What the watcher needs of the server it reloads (servekit.server.ServeKit is one)."""

    @property
    def control(self) -> ModelControl: ...

    async def wait_until_loaded(self) -> None: ...


__all__ = [
    "RemoteConfigError",
    "RemoteConfigMissing",
    "is_remote_config",
    "remote_config_copy",
    "watch_config",
]


log = logging.getLogger("servekit.watch")

SETTLE_STEP_S = 0.15
"""serve.yaml must stay unchanged this long before an edit is applied."""
SETTLE_MAX_S = 2.0
"""At most this long is waited for it to settle; then the latest content is taken."""
NO_MODELS = (
    "serve.yaml now names no models (empty, cut short or no 'models:' list); still serving "
    "the previous configuration. To unload every model on purpose, write 'models: []'"
)


class _Watcher:
    """The state of one server's watch: what was applied last and what to look at."""

    def __init__(self, server: ServeKit, path: Path, overrides: Overrides) -> None:
        self.server = server
        self.path = path
        self.overrides = overrides
        # Not read here: the file may have been edited since the start plan was loaded from
        # it, so the first check compiles it once more (an unchanged file applies no change).
        self.applied: bytes | None = None
        self.effective: ServerConfig = server.control.plan.server
        """Server settings of the last plan read (file, environment and flags), to tell edits."""
        self.roots: set[Path] = set()

    def relevant(self, _: Change, name: str) -> bool:
        """Whether a change concerns serve.yaml or a model location it names (read live)."""
        changed = Path(name)
        return changed in (self.path.resolve(), self.path.absolute()) or any(
            changed == root or changed.is_relative_to(root) for root in self.roots
        )

    def targets(self) -> set[Path]:
        """Folders to watch (non-recursively); updates the model locations that matter."""
        plan = self.server.control.plan
        folders = {self.path.parent.resolve()}
        roots: set[Path] = set()
        for model in plan.models:
            if model.config is None or model.config.storage_uri is None:
                continue
            location = (plan.base_dir / model.config.storage_uri).resolve()
            roots.add(location)
            if location.is_dir():
                folders.add(location)
                folders.update(
                    p
                    for p in location.iterdir()
                    if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
                )  # hidden folders (.ipynb_checkpoints) are never versions
            elif location.parent.is_dir():
                folders.add(location.parent)
        self.roots = roots
        return folders

    async def check(self, touched: bool) -> None:
        """Re-read serve.yaml if it changed or a model file was touched, and apply it once the
        file has settled (see the module docstring)."""
        text = _read(self.path)
        if text == self.applied and not touched:
            return
        text = await settled(self.path)
        if text == self.applied and not touched:
            return
        self.applied = text
        try:
            plan = await asyncio.to_thread(self._compile)
        except ConfigError as exc:
            self.server.control.record_error(
                "watch",
                f"serve.yaml edit rejected; still serving the previous configuration:\n{exc}",
            )
            return
        if not plan.models and self.server.control.plan.models and not names_models(text):
            self.server.control.record_error("watch", NO_MODELS)  # logged there, once
            return
        report_outcome(await self.server.control.apply_plan(plan))

    def _compile(self) -> ServePlan:
        plan = load_plan(self.path, self.overrides)  # the same rule as at start
        edited = [to_camel(k) for k in restart_only_edits(plan.server, self.effective)]
        if edited:
            self.server.control.record_error(
                "watch",
                f"serve.yaml changed server.{', server.'.join(edited)}: "
                "restart servekit to apply (the rest of the edit is applied)",
            )
        self.effective = plan.server
        return plan  # apply_plan keeps the restart-only settings as they run


def outcome(done: dict[str, list[str]]) -> tuple[int, str, dict[str, list[str]]]:
    """A reload's outcome as a log line: its level, its words and its fields (for JSON).

    A model that failed to load is named as failed only (ModelControl lists it as reloaded or
    added too: it was tried), and the line is a warning then, never "applied"."""
    failed = list(done.get("failed", []))
    fields = {
        "added": [n for n in done.get("added", []) if n not in failed],
        "reloaded": [n for n in done.get("reloaded", []) if n not in failed],
        "removed": list(done.get("removed", [])),
        "failed": failed,
    }
    parts = [
        f"{what} {', '.join(names)}" for what, names in fields.items() if names and what != "failed"
    ]
    if failed:
        head = (
            f"serve.yaml edit: {', '.join(failed)} failed to load (reason above and in the index)"
        )
        text = head + ("; " + "; ".join(parts) if parts else "")
        return logging.WARNING, text, fields
    if not parts:
        return logging.DEBUG, "serve.yaml re-read: nothing to change", fields
    return logging.INFO, "serve.yaml applied: " + "; ".join(parts), fields


def report_outcome(done: dict[str, list[str]]) -> None:
    level, text, fields = outcome(done)
    log.log(level, "%s", text, extra={"reload": fields})


async def settled(path: Path) -> bytes | None:
    """serve.yaml's content once unchanged for ``SETTLE_STEP_S`` (mtime, size and bytes), or
    the latest after ``SETTLE_MAX_S`` of changes."""
    last = _snapshot(path)
    deadline = time.monotonic() + SETTLE_MAX_S
    while time.monotonic() < deadline:
        await asyncio.sleep(SETTLE_STEP_S)
        now = _snapshot(path)
        if now == last:
            break
        last = now
    else:
        log.warning("serve.yaml kept changing for %.1f s; reading it as it is now", SETTLE_MAX_S)
    return last[2]


def _snapshot(path: Path) -> tuple[int, int, bytes | None]:
    try:
        stat = path.stat()
    except OSError:
        return (0, -1, None)
    return (stat.st_mtime_ns, stat.st_size, _read(path))


def names_models(text: bytes | None) -> bool:
    """Whether serve.yaml has a ``models:`` list of its own (``models: []`` included): the
    explicit way to serve no models, as opposed to an empty or cut-short file."""
    if not text:
        return False
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError:
        return False
    return isinstance(data, dict) and isinstance(data.get("models"), list)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


async def watch_config(
    server: ServeKit, overrides: Overrides | None = None, *, debounce_ms: int = 300
) -> None:
    """Apply serve.yaml edits to ``server`` until cancelled; ``overrides`` must be those the
    server's plan was loaded with (the command line), so that every reload applies them too."""
    path = server.control.plan.config_path
    if path is None:
        log.warning("--watch: this server has no serve.yaml file to watch")
        return
    watcher = _Watcher(server, path, overrides or Overrides())
    if watcher.overrides.config_uri is not None:
        await _poll_remote(watcher, watcher.overrides.config_uri)
        return
    log.info("watching %s for changes", path)
    await server.wait_until_loaded()  # edits made meanwhile are seen by the first check
    while True:
        folders = watcher.targets()
        config = path.resolve()
        try:
            async for changes in awatch(
                *folders,
                watch_filter=watcher.relevant,
                recursive=False,
                debounce=debounce_ms,
                step=50,
                rust_timeout=1000,
                yield_on_timeout=True,
            ):
                try:
                    await watcher.check(touched=_touches_models(changes, config))
                except Exception:  # the watcher must outlive any one bad reload
                    log.exception("applying serve.yaml failed")
                if watcher.targets() != folders:
                    break  # models moved or version folders appeared: watch the new set
        except (OSError, RuntimeError) as exc:  # a watched folder vanished under us
            log.warning("watching restarts: %s", exc)
            await asyncio.sleep(1.0)


def remote_config_copy(uri: str) -> Path:
    """The local copy of the remote serve.yaml ``uri`` a server starts from (read now, once;
    ``--watch`` reads it again). Raises RemoteConfigMissing or RemoteConfigError, whose
    messages can be shown as they are."""
    return local_copy(read_remote_config(uri))


async def _poll_remote(watcher: _Watcher, uri: str) -> None:
    """Read the remote serve.yaml every ``server.storage.pollSeconds`` and apply what changed,
    as a local edit is applied; an outage of the store keeps the running configuration."""
    shown = shown_uri(uri)
    log.info("watching %s for changes (read every server.storage.pollSeconds)", shown)
    await watcher.server.wait_until_loaded()
    last = _read(watcher.path)  # the copy this server started from
    failing = False
    while True:
        interval = watcher.server.control.plan.server.storage.poll_seconds
        await asyncio.sleep(interval)
        try:
            text = await in_daemon_thread(lambda: read_remote_config(uri))
        except RemoteConfigError as exc:
            if not failing:  # once per outage, not at every read
                watcher.server.control.record_error(
                    "watch",
                    f"{exc}; still serving the current configuration, read again every "
                    f"{interval:g} s",
                )
            failing = True
            continue
        if failing:
            log.info("%s can be read again", shown)
            failing = False
        if text == last:
            continue
        last = text
        try:
            await asyncio.to_thread(local_copy, text, watcher.path.parent)
            await watcher.check(touched=False)
        except Exception:  # the watcher must outlive any one bad reload
            log.exception("applying %s failed", shown)


def _touches_models(changes: set[tuple[Change, str]], config: Path) -> bool:
    return any(Path(name) != config for _, name in changes)
