"""servekit: serve.yaml -> one server speaking the Open Inference Protocol over HTTP and gRPC.

The notebook API (``app.serve``, ``app.connect``) is imported lazily so that ``import app``
stays cheap and never starts anything.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "connect", "serve"]


def __getattr__(name: str) -> Any:
    """Resolve the notebook entry points on first use (no work at import time)."""
    if name in ("serve", "connect"):
        from app import notebook

        return getattr(notebook, name)
    raise AttributeError(f"module 'app' has no attribute {name!r}")
