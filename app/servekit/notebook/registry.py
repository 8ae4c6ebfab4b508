"""The process-wide registry of servers started with ``servekit.serve``.

A notebook cell is re-run far more often than it is thought about, so ``servekit.serve`` keys every
server by its ``name`` (``"default"`` unless given) and stops the previous server of that name
before starting the new one: re-running a cell, or calling ``servekit.serve`` again, never leaves a
port or a thread behind. Servers with different names run side by side. At interpreter exit
(including a kernel restart) every server still registered is stopped.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servekit.notebook.handle import Server

_lock = threading.RLock()
_servers: dict[str, Server] = {}
_atexit_registered = False


def replace(name: str, start: Callable[[], Server]) -> Server:
    """Stop the server registered as ``name`` (if any), then start and register a new one."""
    global _atexit_registered
    with _lock:
        previous = _servers.pop(name, None)
        if previous is not None:
            previous._stop(grace=1.0, note=" (replaced by a newer servekit.serve)")
        server = start()
        _servers[name] = server
        if not _atexit_registered:
            atexit.register(stop_all)
            _atexit_registered = True
        return server


def forget(server: Server) -> None:
    """Drop ``server`` from the registry (it was stopped by its owner)."""
    with _lock:
        if _servers.get(server.name) is server:
            del _servers[server.name]


def running() -> dict[str, Server]:
    """The servers this process runs, by name."""
    with _lock:
        return dict(_servers)


def stop_all() -> None:
    """Stop every registered server (registered with ``atexit``)."""
    with _lock:
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        server._stop(grace=1.0, note=" (interpreter exit)")
