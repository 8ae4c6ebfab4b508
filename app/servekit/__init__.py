"""servekit: serve.yaml -> one server speaking the Open Inference Protocol over HTTP and gRPC.

The notebook API (``servekit.serve``, ``servekit.connect``) is imported lazily so that
``import servekit`` stays cheap and never starts anything. The package's source is
``app/servekit/`` (``app/`` is the source root).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "connect", "serve"]


def __getattr__(name: str) -> Any:
    """Resolve the notebook entry points on first use (no work at import time)."""
    if name in ("serve", "connect"):
        from servekit import notebook

        return getattr(notebook, name)
    raise AttributeError(f"module 'servekit' has no attribute {name!r}")
