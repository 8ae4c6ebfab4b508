"""What the services answer beside inference, as frozen values: server metadata, the repository
index and the recent errors.

In the foundation, like :mod:`servekit.types`, because every layer passes them on: the
repository makes index rows and error entries, the services return them, and the adapters and
codecs encode them (V2 JSON, Triton's protobuf, grps' YAML text, the dashboard's pages). Nobody
hands out a dict a caller could change or misspell.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    """V2 server metadata: the server's name (``server.name``), servekit's version and the
    protocol extensions it speaks."""

    name: str
    version: str
    extensions: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "extensions": list(self.extensions)}


@dataclass(frozen=True, slots=True)
class IndexRow:
    """One row of Triton's repository index: a model version (version "" for a model without
    any), its state (READY, LOADING, UNLOADING, UNAVAILABLE) and why it is not ready."""

    name: str
    version: str
    state: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "state": self.state,
                "reason": self.reason}  # fmt: skip


@dataclass(frozen=True, slots=True)
class LoggedError:
    """A failed load or a rejected serve.yaml edit, as the dashboard lists them (no absolute
    paths in ``message``)."""

    time: float
    source: str
    message: str
    model: str | None = None
