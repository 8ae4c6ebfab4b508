"""Model control in a worker: every change goes through the supervisor to every worker.

``ClusterControl`` is the ``ModelControl`` the adapters of a worker are given. A load, unload or
serve.yaml edit reaching this worker is checked here as far as it can be without changing anything
(model control allowed, a valid name), then forwarded to the supervisor, which applies it on every
worker one operation at a time (app/servekit/workers/supervisor.py) and answers once all have. What
the supervisor asks a worker to apply runs through the plain ``ModelControl`` methods (``apply``),
so the checks and the storage rules are those of a single server."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from servekit.config.compiler import ServePlan
from servekit.config.overrides import Overrides, load_plan
from servekit.errors import InvalidArgument
from servekit.models.repository import ModelRepository
from servekit.services.model_control import ModelControl, _check_name
from servekit.services.state import ServerState
from servekit.workers.protocol import decode_params, encode_params

Forward = Callable[[dict[str, Any]], Awaitable[Any]]


class ClusterControl(ModelControl):
    """ModelControl whose client-facing changes are applied by every worker."""

    def __init__(
        self, state: ServerState, repository: ModelRepository, overrides: Overrides
    ) -> None:
        super().__init__(state, repository)
        self._forward: Forward | None = None
        self._overrides = overrides

    def connect(self, forward: Forward) -> None:
        """Where operations go (the supervisor channel)."""
        self._forward = forward

    async def _send(self, message: dict[str, Any]) -> Any:
        if self._forward is None:  # pragma: no cover - connected before the listeners open
            raise RuntimeError("worker is not connected to its supervisor")
        return await self._forward(message)

    async def load(self, name: str, parameters: dict[str, object] | None = None) -> None:
        self._check_client_control("load")
        _check_name(name)
        await self._send(
            {"op": "control", "action": "load", "name": name, "params": encode_params(parameters)}
        )

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        self._check_client_control("unload")
        _check_name(name)
        await self._send({"op": "control", "action": "unload", "name": name})

    async def apply_plan(self, new_plan: ServePlan) -> dict[str, list[str]]:
        """A serve.yaml edit (the watcher): every worker re-reads serve.yaml and applies it."""
        done = await self._send({"op": "control", "action": "apply_config"})
        return {str(k): [str(n) for n in v] for k, v in dict(done).items()}

    # -- what the supervisor asks this worker to apply ----------------------------------------
    async def apply(self, message: dict[str, Any]) -> Any:
        """Apply one operation locally, as a single server would."""
        action = message.get("action")
        name = str(message.get("name", ""))
        if action == "load":
            await ModelControl.load(self, name, decode_params(dict(message.get("params") or {})))
            return None
        if action == "unload":
            await ModelControl.unload(self, name)
            return None
        if action == "apply_config":
            path = self.plan.config_path
            if path is None:
                return {}
            return await ModelControl.apply_plan(self, load_plan(path, self._overrides))
        if action == "fail":
            await self.mark_failed(name, str(message.get("reason", "")))
            return None
        raise InvalidArgument(f"unknown worker operation {str(action)[:40]!r}")

    async def mark_failed(self, name: str, reason: str) -> None:
        """Unload ``name`` and show it UNAVAILABLE with ``reason`` (it failed on some worker:
        it must not serve on the others)."""
        entry = self._entry(name)
        if entry is None:
            return
        await self._repository.unload(name)
        self._repository.register(entry.plan, reason)
        self._repository.record_error("load", reason, name)
