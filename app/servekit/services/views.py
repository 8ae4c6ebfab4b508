"""Read-only views of the models the server knows, for adapters (the dashboard's pages).

Built from the repository's live entries on each call and frozen: an adapter reads a model's
name, plan, versions with their state and reason, the runtime's platform and the version an
unversioned request reaches, and can change none of it nor reach a runtime. The version rule is
the repository's (``ModelEntry.serving_version``), never a copy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from servekit.config.compiler import ModelPlan
from servekit.models.repository import ModelEntry, State
from servekit.results import DownloadStatus

STATES: tuple[str, ...] = tuple(s.value for s in State)
"""Every state a version can be in, in the order pages list them."""
READY = State.READY.value
LOADING = State.LOADING.value
UNLOADING = State.UNLOADING.value
UNAVAILABLE = State.UNAVAILABLE.value


class ModelState:
    """The states of :data:`STATES` by name, as adapters compare and list them (plain
    strings: what every surface answers)."""

    READY = READY
    LOADING = LOADING
    UNLOADING = UNLOADING
    UNAVAILABLE = UNAVAILABLE
    ALL = STATES


@dataclass(frozen=True, slots=True)
class VersionView:
    number: int
    state: str
    """One of :data:`STATES`."""
    reason: str
    platform: str
    """The runtime's platform (e.g. onnxruntime_onnx); "" while no runtime is loaded."""
    warmup_s: float | None = None
    """How long its warm-up took when it loaded (serve.yaml ``warmup``); None: none ran."""


@dataclass(frozen=True, slots=True)
class ModelView:
    name: str
    plan: ModelPlan
    """The model's compiled serve.yaml entry (read-only: a frozen pydantic-free dataclass)."""
    versions: tuple[VersionView, ...]
    """Sorted by number."""
    reason: str
    """Why the model is not ready (every version's reason, or the plan's problem)."""
    serving_version: int | None
    """The version a request naming none reaches (None: none is ready)."""
    download: DownloadStatus | None = None
    """Its fetch from remote storage under way (bytes, rate, time left), if any."""

    def ready_versions(self) -> list[int]:
        return [v.number for v in self.versions if v.state == READY]


def view_of(
    entry: ModelEntry, download: DownloadStatus | None = None, waiting: str | None = None
) -> ModelView:
    """The view of ``entry``; while ``download`` brings the files of a model with no version
    serving, its versions show as LOADING with the progress as their reason (as the index).
    ``waiting``: why a pipeline's steps cannot run (services/composition/pipelines.py
    ``steps_waiting``): its READY versions show as UNAVAILABLE with that reason, as ``/ready``
    answers false."""
    fetching = download if download is not None and not entry.ready_versions() else None
    versions = tuple(
        VersionView(
            number,
            LOADING if fetching is not None else version.state.value,
            fetching.text() if fetching is not None else version.reason,
            version.runtime.platform if version.runtime is not None else "",
            version.warmup_s,
        )
        for number, version in sorted(entry.versions.items())
    )
    reason = fetching.text() if fetching is not None else entry.reason()
    serving = entry.serving_version()
    if waiting is not None:
        versions = tuple(
            replace(v, state=UNAVAILABLE, reason=waiting) if v.state == READY else v
            for v in versions
        )
        reason, serving = waiting, None
    return ModelView(entry.plan.name, entry.plan, versions, reason, serving, download)
