"""servekit's version, in a module of its own.

Not kept in ``servekit/__init__.py``: every module that names the version (server metadata,
the CLI, saved projects) would import the package root, whose lazy ``serve``/``connect``
reach the notebook and, through it, the server: an import circle across the whole package.
``servekit.__version__`` still answers (resolved lazily by the root).
"""

from __future__ import annotations

__version__ = "0.1.0"
