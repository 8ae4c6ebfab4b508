"""A TCP proxy on 127.0.0.1 that holds a download half-way until the test lets it go.

Put in front of a real store (moto's S3 server), it forwards every byte both ways, and once
``hold_after`` bytes have gone from the store to the client (over all its connections) it holds
the answers until ``release()``: a download that is deterministically under way for as long as
the test needs to look at it, with no sleep and no timing guess. ``holding`` is set when the
hold starts, ``held_since`` says when.

With ``tunnel_to`` (a host-name suffix) it is also an HTTPS proxy: a client's ``CONNECT`` to a
host ending so is answered 200 and the tunnel carried to the upstream port, whatever the host
(how ``HTTPS_PROXY`` lets a store on 127.0.0.1 stand in for a cloud host name a client cannot be
pointed away from); ``tunnelled`` lists the ``host:port`` each client asked for.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class GatedProxy:
    def __init__(self, upstream_port: int, hold_after: int, tunnel_to: str | None = None) -> None:
        self.upstream_port = upstream_port
        self.tunnel_to = tunnel_to
        self.tunnelled: list[str] = []
        self.hold_after = hold_after
        self.passed = 0
        self.holding = threading.Event()
        self.held_since = 0.0
        self._gate = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def release(self) -> None:
        self._gate.set()

    def cut(self) -> None:
        """The store goes away mid-download: every connection is closed, held bytes dropped,
        and nothing is accepted any more."""
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()

    def close(self) -> None:
        self.cut()
        self._gate.set()
        for thread in self._threads:
            thread.join(10)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.tunnel_to is not None and not self._connect(client):
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:  # the store is down: so is this connection
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for source, target, gated in ((client, upstream, False), (upstream, client, True)):
                thread = threading.Thread(target=self._pump, args=(source, target, gated),
                                          daemon=True)  # fmt: skip
                self._threads.append(thread)
                thread.start()

    def _connect(self, client: socket.socket) -> bool:
        """Read a ``CONNECT host:port`` request and answer it: 200 for a host under
        ``tunnel_to`` (the tunnel's bytes follow), 403 for any other."""
        client.settimeout(10)
        head = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in head and len(head) < 8192:
                if not (chunk := client.recv(1)):  # byte by byte: nothing past the head
                    break
                head += chunk
        method, _, rest = head.decode("latin-1").partition(" ")
        target = rest.partition(" ")[0]
        allowed = method == "CONNECT" and target.partition(":")[0].endswith(str(self.tunnel_to))
        with contextlib.suppress(OSError):
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n" if allowed
                           else b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")  # fmt: skip
        client.settimeout(None)
        if allowed:
            self.tunnelled.append(target)
        return allowed

    def _pump(self, source: socket.socket, target: socket.socket, gated: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if gated:
                    with self._lock:
                        self.passed += len(data)
                        hold = self.passed > self.hold_after and not self._gate.is_set()
                        if hold and not self.holding.is_set():
                            self.held_since = time.monotonic()
                            self.holding.set()
                    if hold:
                        self._gate.wait(120)
                        if self._listener.fileno() == -1 and not self._gate.is_set():
                            return  # cut while held: the held bytes never arrive
                target.sendall(data)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)
