"""Services: what every protocol adapter calls, and the only names adapters import from here.

The DataPlane (health, metadata, inference, configuration, statistics, the models as read-only
views), ModelControl (load, unload, push, hot reload) and ServerState (the plan in force,
online, addresses), plus the frozen result types their methods return. Adapters import these
names from ``servekit.services`` and nothing behind it (pyproject.toml's import-linter
contracts hold that line); the modules of this folder are the services' own business. No
transport framework is imported here.
"""

from __future__ import annotations

from servekit.services.dataplane import DataPlane, server_extensions
from servekit.services.model_control import ModelControl
from servekit.services.state import Listening, ServerState

__all__ = ["DataPlane", "Listening", "ModelControl", "ServerState", "server_extensions"]
