"""Server readiness: the one rule every surface answers (V2 HTTP and gRPC, gRPC health, grps,
the dashboard), through ``DataPlane.ready`` and ``DataPlane.not_ready_reason``."""

from __future__ import annotations

from servekit.errors import NotFound
from servekit.models.repository import ModelRepository, State, VersionEntry
from servekit.services.state import ServerState


def not_ready_reason(state: ServerState, repository: ModelRepository) -> str | None:
    """Why the server is not ready, or None when it is: online, start-up loading finished and,
    with ``server.strictReadiness`` (the default, as Triton), every model asked for READY.
    Says how many models are missing, not which: readiness is open to unauthenticated probes,
    model names are not."""
    if state.draining:
        return "the server is stopping (requests already accepted finish first)"
    if state.withdrawn:
        return (
            "the server is stopping: it serves what still arrives for "
            "server.drainDelaySeconds, then refuses new requests"
        )
    if not state.online:
        return "the server is offline (draining); Online brings it back"
    if not state.startup_done:
        return "models are still loading"
    waiting = models_not_ready(state, repository)
    if waiting:
        return (
            f"{len(waiting)} model(s) asked for are not READY (see the repository index; "
            "server.strictReadiness: false answers ready without them)"
        )
    return None


def models_not_ready(state: ServerState, repository: ModelRepository) -> list[str]:
    """Models asked for (``ModelRepository.requested``) with a version that has not loaded
    (loading, or its load failed), or with no version at all; always empty when
    ``server.strictReadiness`` is false.

    A version that loaded and then reported itself down (an isolated model's process
    restarting, or its circuit breaker tripped: app/servekit/runtimes/isolated.py) is not
    counted: a client's poison request would otherwise take the whole server out of its
    load balancer while every other model serves. Per-model readiness and the repository
    index say it, with the reason."""
    if not state.plan.server.strict_readiness:
        return []
    waiting = []
    for name in sorted(repository.requested):
        try:
            entry = repository.get(name)
        except NotFound:  # asked for, then left serve.yaml: no longer served at all
            continue
        if not entry.versions or any(map(_not_loaded, entry.versions.values())):
            waiting.append(name)
    return waiting


def _not_loaded(version: VersionEntry) -> bool:
    """Not READY and holding no runtime: still loading, or its load failed (a version holding
    its runtime while UNAVAILABLE is a loaded one reporting itself down: ModelRepository._watch)."""
    return version.state is not State.READY and version.runtime is None
