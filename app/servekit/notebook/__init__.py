"""The notebook API: ``servekit.serve`` a serve.yaml from a cell, ``servekit.connect`` to a server.

``serve`` runs the server in a background thread with its own event loop (a Jupyter kernel
already runs one on its main thread) and returns a :class:`Server` handle once it is ready;
``connect`` returns a :class:`RemoteServer` speaking HTTP to a server that runs elsewhere. Both
offer ``infer``, ``models``, ``add_model`` and ``remove_model`` and show as a card in Jupyter.
``serve(token=True)`` guards a server with a random token and ``connect(url, token=...)`` (or
the ``SERVEKIT_TOKEN`` environment variable) sends one; the handles' ``.token`` holds it.
"""

from __future__ import annotations

from servekit.client import RemoteServer, connect
from servekit.notebook.api import StartError, serve
from servekit.notebook.handle import Server
from servekit.notebook.registry import running, stop_all

__all__ = ["RemoteServer", "Server", "StartError", "connect", "running", "serve", "stop_all"]
