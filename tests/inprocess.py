"""The services of one server, built from a serve.yaml in this process, without any listener.

``ServeKit`` (the composition root) builds the repository, DataPlane and ModelControl exactly as
``servekit serve`` does; no port is bound and nothing is started but the loading of models.
Tests then call the services' public methods (``dataplane.infer``, ``control.load``, ...), so
they run in milliseconds and hold whatever the adapters hold in common.

This module is the one place that knows how the composition root is put together: if the
services' wiring changes, only ``Services`` changes, not the tests.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from servekit.config.compiler import ServePlan, compile_plan
from servekit.config.loader import parse_config
from servekit.rest.triton_json import statistics_json
from servekit.results import LoggedError
from servekit.server import ServeKit
from servekit.services.catalog import Catalog
from servekit.services.dataplane import DataPlane
from servekit.services.model_control import ModelControl


def plan_of(yaml_text: str, base_dir: Path) -> ServePlan:
    """serve.yaml text compiled as if the file lived in ``base_dir``."""
    return compile_plan(parse_config(yaml_text), base_dir)


class Services:
    """DataPlane, Catalog and ModelControl of one in-process server."""

    def __init__(self, plan: ServePlan) -> None:
        self.kit = ServeKit(plan)

    @property
    def dataplane(self) -> DataPlane:
        return self.kit.dataplane

    @property
    def control(self) -> ModelControl:
        return self.kit.control

    @property
    def catalog(self) -> Catalog:
        return self.kit.catalog

    async def start(self) -> None:
        """Load the start-up models (``startupModels``), as the server does after binding."""
        await self.kit.control.start()

    async def stop(self) -> None:
        await self.kit.stop()

    def statistics(self, name: str, version: str = "1") -> dict[str, Any]:
        """Triton's statistics entry of one version, as the statistics endpoints answer it."""
        (entry,) = statistics_json(self.catalog.model_statistics(name, version))["model_stats"]
        return dict(entry)

    def states(self) -> dict[tuple[str, str], str]:
        """(model, version) -> state, from the repository index."""
        return {(r.name, r.version): r.state for r in self.control.index()}

    def recent_errors(self) -> list[LoggedError]:
        """Failed loads and rejected edits, newest last (what the dashboard lists)."""
        return list(self.control.recent_errors)

    def reason(self, name: str) -> str:
        """The reasons the index gives for ``name``'s versions, joined."""
        return "; ".join(r.reason for r in self.control.index() if r.name == name)


Serve = Callable[..., Awaitable[Services]]


@asynccontextmanager
async def services_factory(base_dir: Path) -> AsyncIterator[Serve]:
    """``await serve(yaml_text, start=True)`` builds (and loads) Services over ``base_dir``;
    every one is stopped on exit, and ``sys.path`` is restored (ModelControl appends the
    serve.yaml folder for Python models)."""
    made: list[Services] = []
    path = list(sys.path)

    async def serve(yaml_text: str = "models: []\n", *, start: bool = True) -> Services:
        services = Services(plan_of(yaml_text, base_dir))
        made.append(services)
        if start:
            await services.start()
        return services

    try:
        yield serve
    finally:
        for services in made:
            await services.stop()
        sys.path[:] = path
