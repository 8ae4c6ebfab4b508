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


@dataclass(frozen=True, slots=True)
class DownloadStatus:
    """A remote model's fetch in progress (app/servekit/models/remote_progress.py), as the
    index, the dashboard and the notebook show it. ``uri`` is the shown URI: no user info, no
    query (a signed URL's signature), so nothing here is a secret."""

    model: str
    uri: str
    done_bytes: int
    total_bytes: int
    """-1 while the remote is being listed (nothing known yet)."""
    bytes_per_s: float
    seconds_left: float | None
    """None while the rate is not known yet."""

    @property
    def percent(self) -> int | None:
        if self.total_bytes <= 0:
            return None
        return min(100, self.done_bytes * 100 // self.total_bytes)

    def text(self) -> str:
        """One line: ``downloading s3://b/m: 40.0 of 100.0 MB (40%), 12.3 MB/s, about 5 s
        left`` (or ``listing s3://b/m`` before the sizes are known)."""
        if self.total_bytes < 0:
            return f"listing {self.uri}"
        mb = 1024 * 1024
        line = (
            f"downloading {self.uri}: {self.done_bytes / mb:.1f} of {self.total_bytes / mb:.1f} "
            f"MB ({self.percent or 0}%)"
        )
        if self.bytes_per_s > 0:
            line += f", {self.bytes_per_s / mb:.1f} MB/s"
        if self.seconds_left is not None:
            line += f", about {self.seconds_left:.0f} s left"
        return line

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "uri": self.uri, "done_bytes": self.done_bytes,
                "total_bytes": self.total_bytes, "percent": self.percent,
                "bytes_per_s": round(self.bytes_per_s, 1), "seconds_left": self.seconds_left,
                "text": self.text()}  # fmt: skip
