"""The protocol extensions server metadata names (KServe V2 / Triton's ``extensions``), for
what the composition root enables."""

from __future__ import annotations

BINARY_DATA: tuple[str, ...] = ("binary_tensor_data", "classification")
"""The protocol extensions every DataPlane implements: binary tensor data (its codecs) and
classification (app/servekit/services/classification.py)."""
SHARED_MEMORY: tuple[str, ...] = ("system_shared_memory",)
"""System shared memory (app/servekit/services/shared_memory.py; both adapters offer its
registration), named only when ``server.sharedMemory: system`` turns it on."""
CONFIG_AND_STATISTICS: tuple[str, ...] = ("model_configuration", "statistics")
"""Triton's model configuration and statistics extensions (``model_config``, ``statistics``)."""
REPOSITORY: tuple[str, ...] = ("model_repository", "model_repository(unload_dependents)")
"""Triton's model repository extension (index, load, unload)."""


def server_extensions(
    *, config_and_statistics: bool, repository: bool, shared_memory: bool = False
) -> tuple[str, ...]:
    """The extensions server metadata names for what the composition root enables."""
    return (
        *BINARY_DATA,
        *(SHARED_MEMORY if shared_memory else ()),
        *(CONFIG_AND_STATISTICS if config_and_statistics else ()),
        *(REPOSITORY if repository else ()),
    )
