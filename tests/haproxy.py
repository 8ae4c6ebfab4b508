"""HAProxy in front of servekit replicas, for the replica tests: where its binary is and what
its stats socket says of each server."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest
from needs import missing


@pytest.fixture
def haproxy_bin() -> str:
    """Debian's haproxy (``/usr/sbin`` is not on every PATH); missing: .ci/run installs it."""
    found = shutil.which("haproxy") or (
        "/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None
    )
    if found is None:
        missing("HAProxy", "apt-get install haproxy")
    return found


def statuses(folder: Path) -> dict[tuple[str, str], str]:
    """(backend, server) -> its status as HAProxy sees it (UP, DOWN, MAINT, ...), read from the
    stats socket ``folder/admin.sock`` (``show stat``: CSV, the status in column 18)."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(str(folder / "admin.sock"))
        sock.sendall(b"show stat\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    rows = [line.split(",") for line in data.decode().splitlines() if not line.startswith("#")]
    return {
        (row[0], row[1]): row[17].split(" ")[0]
        for row in rows
        if len(row) > 17 and row[1] not in ("FRONTEND", "BACKEND")
    }
