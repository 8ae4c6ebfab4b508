"""The edge holds (issue 13): timeouts, connection and header limits, bounded memory, clean errors.

Two servers of their own, each serving two small models: ``short`` with 1 s header and body
timeouts and 8 requests in flight at most (cuts, 503, the 64 MiB JSON request), ``crowded``
started under a 1,024 open-file limit (RLIMIT_NOFILE lowered in the child before it starts)
with the default timeouts, held by 1,100 slowloris connections while normal requests are timed.
All sockets are on 127.0.0.1; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import http.client
import resource
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import onnx
import onnx_builders
import orjson
import pytest
from onnx import TensorProto, helper
from servers import ServerProcess, identity_name, running_server

pytestmark = pytest.mark.slow  # end to end: real server processes

FILE_LIMIT = 1024
SLOW_CONNECTIONS = 1100
"""As in the issue: more slow clients than the child has descriptors."""
REQUESTS = 300
"""Normal requests timed while the slow connections are held (p99: the 3rd slowest)."""


def _reduce_sum() -> onnx.ModelProto:
    """``x[-1, 16] FP32 -> total[1, 1]``: a model whose answer is tiny, so a large request's
    memory is the request's own."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 16])
    total = helper.make_tensor_value_info("total", TensorProto.FLOAT, [1, 1])
    node = helper.make_node("ReduceSum", ["x"], ["total"], keepdims=1)
    graph = helper.make_graph([node], "reduce_sum", [x], [total])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _store(root: Path, server: str) -> Path:
    models = root / "models"
    models.mkdir(parents=True)
    onnx.save(onnx_builders.identity("FP32"), str(models / "identity.onnx"))
    onnx.save(_reduce_sum(), str(models / "reduce.onnx"))
    config = models / "serve.yaml"
    config.write_text(
        f"server: {server}\nmodels:\n"
        f"  - {{name: {identity_name('FP32')}, modelFormat: {{name: onnx}}, "
        "storageUri: identity.onnx}\n"
        "  - {name: reduce, modelFormat: {name: onnx}, storageUri: reduce.onnx}\n"
    )
    return config


@pytest.fixture(scope="module")
def short(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # (every client here is 127.0.0.1: it may take all eight slots, to fill the cap itself)
    network = (
        "{headerTimeoutSeconds: 1, bodyTimeoutSeconds: 1, maxRequestsInFlight: 8,"
        " clientShareOfRequests: 1}"
    )
    config = _store(tmp_path_factory.mktemp("short"), f"{{network: {network}}}")
    with running_server(config) as server:
        yield server


def _lower_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILE_LIMIT, FILE_LIMIT))


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    config = _store(tmp_path_factory.mktemp("crowded"), "{}")
    with running_server(config, preexec_fn=_lower_file_limit) as server:
        yield server


def _address(server: ServerProcess) -> tuple[str, int]:
    host, port = server.http_host_port.rsplit(":", 1)
    return host, int(port)


def _raw(server: ServerProcess, data: bytes, timeout: float = 10.0) -> tuple[float, bytes]:
    """Send ``data`` on a new connection; read until the server closes it. Returns the seconds
    that took and what was read."""
    with socket.create_connection(_address(server), timeout=timeout) as sock:
        started = time.monotonic()
        # Refused mid-send (431): the answer is already there to read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
        return time.monotonic() - started, answer


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


# --- read timeouts -----------------------------------------------------------------------------


def test_slow_headers_are_cut_at_the_header_timeout(short: ServerProcess) -> None:
    took, answer = _raw(short, b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\nx-slow: 1")
    assert _status(answer) == 408, answer
    assert 0.9 < took < 3.0
    assert b"request headers not received within 1 s" in answer


def test_an_idle_connection_is_cut_at_the_header_timeout(short: ServerProcess) -> None:
    took, answer = _raw(short, b"")
    assert 0.9 < took < 3.0
    assert answer == b"" or _status(answer) == 408


def test_a_body_announced_but_not_sent_is_cut_at_the_body_timeout(short: ServerProcess) -> None:
    head = (
        b"POST /v2/models/reduce/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 100000\r\n\r\n"
    )
    took, answer = _raw(short, head + b'{"inputs":')
    assert _status(answer) == 408, answer
    assert 0.9 < took < 3.0
    assert b"request body not received within 1 s" in answer
    short.assert_healthy()


def test_requests_over_the_in_flight_cap_get_503_at_once(short: ServerProcess) -> None:
    """Eight requests waiting for their bodies fill maxRequestsInFlight; the ninth is refused
    at once with Retry-After; once the eight are cut (body timeout), requests pass again."""
    head = b"POST /v2/models/reduce/infer HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n"
    waiting = [socket.create_connection(_address(short), timeout=10) for _ in range(8)]
    try:
        for sock in waiting:
            sock.sendall(head)
        deadline = time.monotonic() + 5
        while True:  # bounded: until the eight are in flight (the ninth is refused)
            # (not a health probe: those pass the cap, tests/test_liveness_e2e.py)
            took, answer = _raw(short, b"GET /v2 HTTP/1.1\r\nhost: x\r\n\r\n")
            if _status(answer) == 503 or time.monotonic() > deadline:
                break
        assert _status(answer) == 503, answer
        assert b"retry-after: 1" in answer.lower()
        assert took < 0.5
        for sock in waiting:
            assert _status(sock.recv(65536)) == 408
    finally:
        for sock in waiting:
            sock.close()
    short.assert_healthy()


# --- header limits -----------------------------------------------------------------------------


def test_an_oversized_header_gets_431(short: ServerProcess) -> None:
    huge = b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 16 * 1024 * 1024
    _took, answer = _raw(short, huge + b"\r\n\r\n")
    assert _status(answer) == 431, answer[:200]
    assert b"request headers larger than 65536 bytes" in answer


def test_many_headers_get_431(short: ServerProcess) -> None:
    lines = b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 100) for i in range(101))
    _took, answer = _raw(short, b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\n" + lines + b"\r\n")
    assert _status(answer) == 431, answer[:200]
    assert b"more than 100 header lines" in answer


def test_headers_just_under_the_limits_pass(short: ServerProcess) -> None:
    lines = b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 500) for i in range(98))
    _took, answer = _raw(
        short,
        b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\nconnection: close\r\n" + lines + b"\r\n",
    )
    assert _status(answer) == 200, answer[:200]


# --- connections under a file limit ------------------------------------------------------------


def _timed_request(address: tuple[str, int], path: str) -> tuple[float, int]:
    """One request on a new connection, as a client without keep-alive makes it."""
    started = time.perf_counter()
    connection = http.client.HTTPConnection(*address, timeout=5)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return time.perf_counter() - started, response.status
    finally:
        connection.close()


def test_slow_connections_beyond_the_file_limit_do_not_shut_out_others(
    crowded: ServerProcess,
) -> None:
    """1,100 slowloris connections against a server limited to 1,024 descriptors: normal
    requests, each on a new connection, keep answering (p99 under 20 ms) and gRPC too."""
    pid = crowded.process.pid
    limit = Path(f"/proc/{pid}/limits").read_text()
    assert f"Max open files            {FILE_LIMIT}" in limit
    address = _address(crowded)
    slow: list[socket.socket] = []
    try:
        for _ in range(SLOW_CONNECTIONS):
            sock = socket.create_connection(address, timeout=5)
            sock.setblocking(False)
            # Displaced already, maybe: the server keeps its descriptors for new clients.
            with contextlib.suppress(OSError):
                sock.send(b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\n")
            slow.append(sock)
        for _ in range(5):  # the server has taken in the burst of connections
            assert _timed_request(address, "/v2/health/live")[1] == 200
        latencies = []
        for _ in range(REQUESTS):
            took, status = _timed_request(address, f"/v2/models/{identity_name('FP32')}/ready")
            assert status == 200
            latencies.append(took)
        p99 = float(np.percentile(latencies, 99))
        assert p99 < 0.020, f"p99 {p99 * 1000:.1f} ms"
        assert crowded.grpc_target is not None
        with grpc.insecure_channel(crowded.grpc_target) as channel:
            live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
            assert live(b"", timeout=2) == b"\x08\x01"  # ServerLiveResponse(live=true)
        print(
            f"\n{SLOW_CONNECTIONS} slow connections: p99 {p99 * 1000:.2f} ms ({REQUESTS} requests)"
        )
    finally:
        for sock in slow:
            sock.close()
    assert "Too many open files" not in crowded.log()
    crowded.assert_healthy()


# --- bounded memory per request ----------------------------------------------------------------


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{key} not in /proc/{pid}/status")


def _json_body(target_bytes: int) -> tuple[bytes, float]:
    """A V2 JSON request of about ``target_bytes`` for ``reduce``, and the sum it must answer."""
    pattern = np.arange(100, dtype=np.float64) / 100
    text = b",".join(b"%.2f" % v for v in pattern)
    repeats = target_bytes // (len(text) + 1) // 4 * 4  # rows of 16: 100 * repeats % 16 == 0
    data = b",".join([text] * repeats)
    rows = 100 * repeats // 16
    head = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[%d,16],"data":[' % rows
    expected = float(pattern.astype(np.float32).sum()) * repeats
    return head + data + b"]}]}", expected


def test_a_64_mib_json_request_is_bounded_and_health_keeps_answering(short: ServerProcess) -> None:
    """A JSON request just under the 64 MiB default peaks under 4x its size above the server's
    resident memory before it (VmHWM reset through clear_refs), gives that memory back, and
    health probes, each on a new connection, keep answering within 100 ms throughout."""
    body, expected = _json_body(64 * 1024 * 1024 - 4096)
    pid = short.process.pid
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _status_kib(pid, "VmRSS")
    address = _address(short)
    outcome: dict[str, object] = {}

    sending = threading.Event()

    def big() -> None:
        connection = http.client.HTTPConnection(*address, timeout=60)
        try:
            connection.connect()
            sending.set()
            connection.request("POST", "/v2/models/reduce/infer", body=body)
            response = connection.getresponse()
            outcome["status"], outcome["body"] = response.status, response.read()
        finally:
            connection.close()

    worker = threading.Thread(target=big)
    worker.start()
    assert sending.wait(10)
    probes = []
    while worker.is_alive():
        took, status = _timed_request(address, "/v2/health/live")
        assert status == 200
        probes.append(took)
        time.sleep(0.01)
    worker.join(60)
    assert outcome.get("status") == 200, outcome
    answer = np.asarray(orjson.loads(outcome["body"])["outputs"][0]["data"])  # type: ignore[arg-type]
    assert answer[0] == pytest.approx(expected, rel=1e-3)
    peak = _status_kib(pid, "VmHWM") - before
    after = _status_kib(pid, "VmRSS") - before
    size_kib = len(body) / 1024
    print(
        f"\n{len(body) / 2**20:.1f} MiB JSON: peak +{peak / 1024:.0f} MiB "
        f"({peak / size_kib:.2f}x), after +{after / 1024:.0f} MiB, "
        f"{len(probes)} health probes: p99 {np.percentile(probes, 99) * 1000:.1f} ms, "
        f"slowest {max(probes) * 1000:.1f} ms"
    )
    assert peak < 4 * size_kib
    assert after < size_kib
    # p99 under 100 ms; the slowest under 500 ms, not 100: on a shared 2-core machine one
    # probe in hundreds can wait that long for a core, while a decode on the event loop (the
    # bug this guards against) blocks every probe for seconds.
    assert len(probes) >= 3
    assert np.percentile(probes, 99) < 0.100 and max(probes) < 0.500


def test_json_over_the_json_limit_is_413_with_the_way_out(short: ServerProcess) -> None:
    head = (
        b"POST /v2/models/reduce/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 70000000\r\n\r\n"
    )
    _took, answer = _raw(short, head)
    assert _status(answer) == 413, answer
    assert b"Inference-Header-Content-Length" in answer
