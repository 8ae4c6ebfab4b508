"""The dashboard's view of model memory (``load: onDemand``, ``server.modelMemory``): the home
page's line, the index's label beside each model and the model page's Memory block, from the
Catalog's ``memory()`` (app/servekit/services/memory.py)."""

from __future__ import annotations

from typing import Any

from servekit.services import MemoryStatus, ModelMemory, megabytes


def memory_summary(status: MemoryStatus) -> dict[str, Any] | None:
    """The home page's line on model memory: what the loaded models hold against
    ``server.modelMemory``; None when there is no budget and nothing loads on demand."""
    on_demand = sum(m.on_demand for m in status.models)
    if status.budget_bytes is None and not on_demand:
        return None
    return {
        "used": megabytes(status.used_bytes),
        "budget": megabytes(status.budget_bytes) if status.budget_bytes is not None else None,
        "on_demand": on_demand,
        "loaded_on_demand": sum(m.on_demand and m.loaded for m in status.models),
    }


def memory_label(model: ModelMemory | None) -> str:
    """A model's memory as the index shows it: "on demand", its measured size, or both."""
    if model is None:
        return ""
    size = megabytes(model.resident_bytes) if model.resident_bytes is not None else ""
    return ", ".join(part for part in ("on demand" if model.on_demand else "", size) if part)


def model_memory(model: ModelMemory | None) -> dict[str, Any] | None:
    """The model page's Memory section: measured size, on-demand loads and their time."""
    if model is None or (model.resident_bytes is None and not model.on_demand):
        return None
    average = model.load_seconds_total / model.loads if model.loads else None
    return {
        "on_demand": model.on_demand,
        "loaded": model.loaded,
        "resident": megabytes(model.resident_bytes) if model.resident_bytes is not None else None,
        "resident_bytes": model.resident_bytes,
        "loads": model.loads,
        "unloads": model.unloads,
        "last_load_ms": _ms(model.last_load_seconds),
        "avg_load_ms": _ms(average),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 1)
