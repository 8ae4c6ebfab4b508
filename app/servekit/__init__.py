"""servekit: serve.yaml -> one server speaking the Open Inference Protocol over HTTP and gRPC.

The notebook API (``servekit.serve``, ``servekit.connect``) is imported lazily so that
``import servekit`` stays cheap and never starts anything. The package's source is
``app/servekit/`` (``app/`` is the source root). Modules inside the package never import this
root: the version is :mod:`servekit.version`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["__version__", "connect", "serve"]


def __getattr__(name: str) -> Any:
    """Resolve the notebook entry points and the version on first use (no work at import)."""
    if name == "serve":
        from servekit.notebook import serve

        return serve
    if name == "connect":
        from servekit.client import connect

        return connect
    if name == "__version__":
        from servekit.version import __version__

        return __version__
    raise AttributeError(f"module 'servekit' has no attribute {name!r}")
