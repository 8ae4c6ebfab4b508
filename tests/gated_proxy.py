"""A TCP proxy on 127.0.0.1 that holds a download half-way until the test lets it go.

Put in front of a real store (moto's S3 server), it forwards every byte both ways, and once
``hold_after`` bytes have gone from the store to the client (over all its connections) it holds
the answers until ``release()``: a download that is deterministically under way for as long as
the test needs to look at it, with no sleep and no timing guess. ``holding`` is set when the
hold starts, ``held_since`` says when.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class GatedProxy:
    def __init__(self, upstream_port: int, hold_after: int) -> None:
        self.upstream_port = upstream_port
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
