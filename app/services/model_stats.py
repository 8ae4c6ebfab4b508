"""Triton's statistics extension: which versions a statistics request covers, and their entries.

app/services/stats.py records; this module answers ``GET /v2/models[/{m}[/versions/{v}]]/stats``
and the
gRPC ModelStatistics RPC with the same rows. As in Triton: no model name means every model, no
version means every ready version of the model, and a named version must be ready. A version
that has served nothing yet reports zeros.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.services.stats import VersionStats

if TYPE_CHECKING:
    from app.services.dataplane import DataPlane


def model_statistics(
    dataplane: DataPlane, name: str | None = None, version: str | None = None
) -> dict[str, Any]:
    """``{"model_stats": [...]}`` for the versions the request names."""
    repository = dataplane.repository
    rows: list[tuple[str, int]] = []
    if not name:
        for entry in sorted(repository.entries(), key=lambda e: e.plan.name):
            rows.extend((entry.plan.name, v) for v in entry.ready_versions())
    elif not version:
        entry = repository.get(name)
        rows.extend((name, v) for v in entry.ready_versions())
    else:
        _, found = repository.resolve(name, version)
        rows.append((name, found.version))
    stats = dataplane.statistics
    return {
        "model_stats": [
            (stats.find(model, number) or VersionStats()).as_dict(model, str(number))
            for model, number in rows
        ]
    }
