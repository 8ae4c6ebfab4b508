"""A small keep-alive HTTP client over the standard library's ``http.client``.

One persistent connection per thread (a notebook may call from several threads, and a
connection is not thread-safe); a connection the server closed while idle is reopened once.
Error bodies (``{"error": "..."}``) become the same transport-neutral errors the core raises,
so ``server.infer`` fails the same way in process and over the network.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from servekit.errors import HTTP_STATUS, Internal, ServeError

# The server's own code -> status table, read backwards: a client-side error is the same
# transport-neutral error the core raised on the server (500 and unknown statuses: Internal).
_ERROR_CLASS = {cls.code: cls for cls in ServeError.__subclasses__()}
_BY_STATUS: dict[int, type[ServeError]] = {
    status: _ERROR_CLASS[code] for code, status in HTTP_STATUS.items() if code in _ERROR_CLASS
}
# 429 comes from the table: Overloaded (a full model queue, or a proxy answering "too many").


@dataclass(frozen=True)
class Reply:
    """One HTTP response, fully read."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body) if self.body else None


class _Connection(http.client.HTTPConnection):
    """http.client sends headers and body in two writes; without TCP_NODELAY, Nagle's algorithm
    holds the body back until the headers are acknowledged, which triples small-request latency."""

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _TLSConnection(http.client.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Transport:
    """HTTP/1.1 to one server, with per-thread keep-alive connections."""

    def __init__(
        self, url: str, timeout: float = 60.0, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected a URL such as http://127.0.0.1:8000, got {url!r}")
        self.url = f"{parts.scheme}://{parts.netloc}"
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._timeout = timeout
        self._ssl_context = ssl_context  # https only; None: the system's trusted CAs
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self._https:
                conn = _TLSConnection(
                    self._host, self._port, timeout=self._timeout, context=self._ssl_context
                )
            else:
                conn = _Connection(self._host, self._port, timeout=self._timeout)
            self._local.conn = conn
        return conn

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        """Send one request; retry once on a connection the server had already closed."""
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request(method, path, body=body, headers=headers or {})
                response = conn.getresponse()
                data = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if attempt == 2:
                    raise
                continue
            except BaseException:
                self.close()  # a half-read response leaves the connection unusable
                raise
            return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, data)
        raise AssertionError("unreachable")

    def call(
        self, method: str, path: str, obj: Any = None, headers: dict[str, str] | None = None
    ) -> Any:
        """A JSON request; an error status raises the matching ServeError with its message."""
        body = None if obj is None else orjson.dumps(obj)
        sent = dict(headers or {})
        if body is not None:
            sent["Content-Type"] = "application/json"
        return check(self.request(method, path, body, sent)).json()

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


def check(reply: Reply) -> Reply:
    """Raise the ServeError an error reply stands for, with the server's own message."""
    if reply.status < 400:
        return reply
    message = reply.body.decode("utf-8", "replace")
    try:
        parsed = orjson.loads(reply.body)
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
            message = parsed["error"]
    except orjson.JSONDecodeError:
        pass
    raise _BY_STATUS.get(reply.status, Internal)(f"HTTP {reply.status}: {message}")
