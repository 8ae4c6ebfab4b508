"""The overview's Payload log card: what a server with ``server.payloadLog`` shows of it."""

from __future__ import annotations

from typing import Any

from servekit.services import Catalog


def payload_log(catalog: Catalog) -> dict[str, Any] | None:
    """The card (None without a payload log): where it goes, as pages may show it, and what it
    logged and dropped in this process (admin data, as statistics)."""
    counts = catalog.payload_log()
    if counts is None:
        return None
    return {
        "sink": catalog.payload_sink(),
        "logged": counts.logged,
        "dropped": counts.dropped,
        "queue_full": counts.queue_full,
        "sink_failed": counts.sink_failed,
    }
