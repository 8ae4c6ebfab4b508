"""A socket's transport for driving the HTTP edge's protocol in process
(app/servekit/http/connection.py): it records what the protocol writes, one entry per
would-be system call, and whether it paused reading or closed, so a test feeds raw HTTP/1.1
bytes with ``data_received`` and reads the bytes that would have been sent."""

from __future__ import annotations

import asyncio
from typing import Any


class Wire(asyncio.Transport):
    """A transport that records calls instead of sending: one entry per would-be syscall."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, bytes]] = []
        self.closing = False
        self.paused = False

    def write(self, data: Any) -> None:
        assert not self.closing, "written after close"
        self.calls.append(("write", bytes(data)))

    def writelines(self, list_of_data: Any) -> None:
        assert not self.closing, "written after close"
        self.calls.append(("writelines", b"".join(bytes(d) for d in list_of_data)))

    def close(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    @property
    def sent(self) -> bytes:
        """Everything written so far, in order."""
        return b"".join(data for _, data in self.calls)
