"""``servekit bench`` behind a port mapping (issue 27): gRPC goes where ``--grpc`` says, failed
requests are counted by kind and fail the command, and a figure made of no request is ``-``,
never ``nan``.

The port mapping is stood in for by a TCP forwarder in this test (a container run with
``-p HP:8001`` does the same: the server reports the port it bound, the client reaches another
one). tests/test_container.py drives the same flag against the built image's mapped port.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import numpy as np
import onnx_builders
import pytest

import servekit

pytestmark = pytest.mark.slow


class Forwarder:
    """Accepts on 127.0.0.1:<port 0> and relays each connection to ``target``, counting them."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self.target, timeout=10)
            upstream.settimeout(None)
            self.connections += 1
            self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                thread = threading.Thread(target=self._pipe, args=(a, b), daemon=True)
                self._threads.append(thread)
                thread.start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()
        self._accepting.join(5)
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(5)


@contextlib.contextmanager
def forwarding(target: tuple[str, int]) -> Iterator[Forwarder]:
    forwarder = Forwarder(target)
    try:
        yield forwarder
    finally:
        forwarder.close()


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servekit", "bench", *args, "--concurrency", "1,2",
         "--seconds", "0.3"],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_bench_sends_grpc_where_the_flag_says_and_fails_on_errors() -> None:
    with servekit.serve() as server:
        server.add_model("mlp", onnx_builders.mlp())
        assert server.grpc_target is not None
        host, _, port = server.grpc_target.rpartition(":")
        with forwarding((host, int(port))) as mapped:
            ok = bench(server.url, "mlp", "--grpc", f"127.0.0.1:{mapped.port}")
            assert ok.returncode == 0, ok.stderr
            assert mapped.connections >= 1  # the gRPC traffic went through the "mapping"
        rows = [line.split() for line in ok.stdout.splitlines()[2:]]
        assert [r[:2] for r in rows] == [["http", "1"], ["http", "2"], ["grpc", "1"], ["grpc", "2"]]
        assert all(r[-1] == "0" and float(r[2]) > 0 for r in rows)

        # Nothing listens at the address (the port is held, unlistened: a refused connect).
        with socket.socket() as held:
            held.bind(("127.0.0.1", 0))
            closed = held.getsockname()[1]
            failed = bench(server.url, "mlp", "--grpc", f"127.0.0.1:{closed}")
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert "nan" not in failed.stdout.lower()
        grpc_rows = [
            line.split() for line in failed.stdout.splitlines() if line.startswith("grpc ")
        ]
        assert grpc_rows and all(r[3:6] == ["-", "-", "-"] and int(r[6]) > 0 for r in grpc_rows)
        assert "errors (grpc): " in failed.stdout and "x gRPC UNAVAILABLE" in failed.stdout
        assert f"gRPC was sent to 127.0.0.1:{closed}" in failed.stderr
        assert "requests failed" in failed.stderr

        bad = bench(server.url, "mlp", "--grpc", "no-port")
        assert bad.returncode == 2 and "--grpc takes HOST:PORT" in bad.stderr


def test_benchmark_counts_server_errors_by_status_and_code() -> None:
    def broken(x: np.ndarray) -> dict[str, np.ndarray]:
        raise RuntimeError("this model always fails")

    with servekit.serve() as server:
        server.add_model(
            "broken", broken, inputs=[("x", "FP32", [-1])], outputs=[("y", "FP32", [-1])]
        )
        table = server.benchmark("broken", concurrency=(1,), seconds=0.3)
    http_row, grpc_row = table.rows
    assert http_row.requests == 0 and http_row.errors > 0
    assert list(http_row.error_kinds) == ["HTTP 500"]
    assert list(grpc_row.error_kinds) == ["gRPC INTERNAL"]
    assert "this model always fails" in http_row.error_samples["HTTP 500"]
    assert table.to_list()[0]["p99_ms"] is None
    text = table.text()
    assert "nan" not in text.lower() and "errors (http): " in text and "x HTTP 500" in text
    assert "nan" not in table._repr_html_().lower()
