"""The payload log of a real ``servekit serve``, sent to real HTTP sinks on 127.0.0.1.

KServe's logger format, as its code sends it (kserve/kserve at commit
aaac4e294dae2c7b1aa1886447793f3aa1c30912: pkg/logger/worker.go ``sendHttpCloudEvent``,
pkg/logger/handler.go ``ServeHTTP``, pkg/logger/types.go ``LogRequest``): a POST per event in
CloudEvents' HTTP binary mode (the Go SDK, github.com/cloudevents/sdk-go/v2 2.16, writes the
attributes as ``Ce-*`` headers): ``Ce-Specversion: 1.0``, ``Ce-Id`` the request's ID (KServe
takes the caller's ``Ce-Id`` or makes a UUID; servekit's request ID), ``Ce-Type``
``org.kubeflow.serving.inference.request`` / ``.response``, ``Ce-Source``, ``Ce-Time``, the
extensions ``Ce-Inferenceservicename``, ``Ce-Namespace``, ``Ce-Component``, ``Ce-Endpoint``,
``Ce-Metadata`` (a JSON object of the logged headers, ``{}`` when none are) and
``Ce-Recordedtime``, the payload as the body with its ``Content-Type``; the sink answers
200. Then the two ways a sink dies (a refused connection, one that never answers), which must
not hold any request back.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_builders
import pytest
import tritonclient.grpc as grpcclient
from servers import ServerProcess, running_server
from waits import wait_until

pytestmark = pytest.mark.slow

SECRET = "payload-log-test-token-5f3e"
REQUEST = "org.kubeflow.serving.inference.request"
RESPONSE = "org.kubeflow.serving.inference.response"


class Sink:
    """A CloudEvents receiver as KServe's logger tests run one: records each POST's headers and
    body and answers 200 ``ok``."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes, str]] = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append((dict(self.headers.items()), body, self.path))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/events"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sink() -> Iterator[Sink]:
    made = Sink()
    yield made
    made.close()


def write_config(root: Path, url: str) -> Path:
    model = root / "models" / "add_sub" / "1" / "model.onnx"
    model.parent.mkdir(parents=True)
    onnx.save(onnx_builders.add_sub(), str(model))
    config = root / "serve.yaml"
    config.write_text(
        "server:\n"
        f"  payloadLog: {{sink: http, url: '{url}'}}\n"
        "models:\n"
        "  - {name: add_sub, modelFormat: {name: onnx}, storageUri: models/add_sub,"
        " payloadLog: true}\n"
        "  - {name: quiet, modelFormat: {name: onnx}, storageUri: models/add_sub}\n"
    )
    return config


def v2_body(a: list[float], b: list[float]) -> dict[str, Any]:
    return {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": a},
            {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": b},
        ]
    }


def rfc3339(text: str) -> datetime:
    assert text.endswith("Z"), text
    return datetime.fromisoformat(text[:-1] + "+00:00")


def check_kserve_headers(headers: dict[str, str], kind: str, request_id: str, port: int) -> None:
    """The headers KServe's worker.go makes its CloudEvents SDK send, with servekit's values."""
    lower = {name.lower(): value for name, value in headers.items()}
    assert lower["ce-specversion"] == "1.0"
    assert lower["ce-type"] == kind
    assert lower["ce-id"] == request_id
    assert lower["ce-source"] == f"http://localhost:{port}/"
    assert lower["ce-inferenceservicename"] == "add_sub"
    assert lower["ce-namespace"] == "default"
    assert lower["ce-component"] == "predictor"
    assert lower["ce-endpoint"] == "default"
    assert json.loads(lower["ce-metadata"]) == {}
    assert lower["content-type"] == "application/json"
    sent, recorded = rfc3339(lower["ce-time"]), rfc3339(lower["ce-recordedtime"])
    assert sent <= recorded
    assert abs(time.time() - recorded.timestamp()) < 120
    assert "authorization" not in lower


def test_kserve_logger_format_over_http_and_grpc(tmp_path: Path, sink: Sink) -> None:
    config = write_config(tmp_path, sink.url)
    a, b = [float(i) for i in range(16)], [1.0] * 16
    auth = {"Authorization": f"Bearer {SECRET}"}
    with running_server(config, extra=("--token", SECRET)) as server:
        port = int(server.http_url.rsplit(":", 1)[1])
        with server.http_client(timeout=30) as client:
            answer = client.post(
                "/v2/models/add_sub/infer",
                json=v2_body(a, b),
                headers={**auth, "X-Request-ID": "req-http-1"},
            )
            assert answer.status_code == 200, answer.text
            quiet = client.post("/v2/models/quiet/infer", json=v2_body(a, b), headers=auth)
            assert quiet.status_code == 200  # not marked: never logged
        assert server.grpc_target is not None
        triton = grpcclient.InferenceServerClient(server.grpc_target)
        inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(np.array([a], dtype=np.float32))
        inputs[1].set_data_from_numpy(np.array([b], dtype=np.float32))
        metadata = {"authorization": f"Bearer {SECRET}", "x-request-id": "req-grpc-1"}
        result = triton.infer("add_sub", inputs, headers=metadata)
        assert result.as_numpy("OUTPUT0").tolist() == [[x + 1 for x in a]]
        triton.close()
        wait_until(lambda: len(sink.received) >= 4, what="four events at the sink")
        metrics = fetch_metrics(server)
    assert len(sink.received) == 4
    by_id: dict[str, dict[str, tuple[dict[str, str], Any]]] = {}
    for headers, body, path in sink.received:
        assert path == "/events"
        assert SECRET.encode() not in body
        assert all(SECRET not in value for value in headers.values())
        lower = {k.lower(): v for k, v in headers.items()}
        by_id.setdefault(lower["ce-id"], {})[lower["ce-type"]] = (headers, json.loads(body))
    assert sorted(by_id) == ["req-grpc-1", "req-http-1"]
    for request_id, pair in by_id.items():
        assert sorted(pair) == [REQUEST, RESPONSE]
        for kind, (headers, _) in pair.items():
            check_kserve_headers(headers, kind, request_id, port)
        asked, answered = pair[REQUEST][1], pair[RESPONSE][1]
        assert [t["name"] for t in asked["inputs"]] == ["INPUT0", "INPUT1"]
        assert asked["inputs"][0]["data"] == a and asked["inputs"][1]["shape"] == [1, 16]
        assert answered["model_name"] == "add_sub" and answered["model_version"] == "1"
        outputs = {t["name"]: t["data"] for t in answered["outputs"]}
        assert outputs == {"OUTPUT0": [x + 1 for x in a], "OUTPUT1": [x - 1 for x in a]}
    assert "servekit_payload_log_logged_total 4.0" in metrics


def fetch_metrics(server: ServerProcess) -> str:
    with server.http_client(timeout=30) as client:
        answer = client.get("/metrics", headers={"Authorization": f"Bearer {SECRET}"})
        assert answer.status_code == 200
        return answer.text


def refused_url() -> tuple[str, socket.socket | None]:
    """An address where nothing listens: its connections are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/", None


def silent_url() -> tuple[str, socket.socket | None]:
    """A socket that listens and never accepts: connections complete (the kernel's backlog)
    and requests are sent, but no answer ever comes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    return f"http://127.0.0.1:{listener.getsockname()[1]}/", listener


@pytest.mark.parametrize("dead", [refused_url, silent_url], ids=["refused", "never-answers"])
def test_a_dead_sink_never_holds_a_request(tmp_path: Path, dead: Any) -> None:
    url, held = dead()
    config = write_config(tmp_path, url)
    a, b = [1.0] * 16, [2.0] * 16
    longest = 0.0
    try:
        with running_server(config, extra=("--token", SECRET)) as server:
            with server.http_client(timeout=30, headers={"Authorization": f"Bearer {SECRET}"}) as c:
                began = time.monotonic()
                for _ in range(600):  # past the queue's 256 and over several sink timeouts
                    start = time.monotonic()
                    answer = c.post("/v2/models/add_sub/infer", json=v2_body(a, b))
                    longest = max(longest, time.monotonic() - start)
                    assert answer.status_code == 200, answer.text
                spent = time.monotonic() - began
                wait_until(
                    lambda: dropped(fetch_metrics(server)) == 1200,
                    what="every event counted dropped",
                )
                metrics = fetch_metrics(server)
            log = server.log()
    finally:
        if held is not None:
            held.close()
    assert "servekit_payload_log_logged_total 0.0" in metrics
    # The sink's timeout is 2 s: a request that waited on it would take that long.
    assert longest < 2.0, (longest, spent)
    assert "payload log: http http://127.0.0.1" in log  # warned, once a minute at most
    assert log.count("payload log:") == 1


def dropped(metrics: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("servekit_payload_log_dropped_total{")
    )


def test_a_notebook_reads_the_counts(tmp_path: Path) -> None:
    import servekit

    config = write_config(tmp_path, "http://127.0.0.1:9/")  # port 9 (discard): refused
    config.write_text(
        config.read_text().replace(
            "{sink: http, url: 'http://127.0.0.1:9/'}", "{sink: file, path: log/p.jsonl}"
        )
    )
    x = np.ones((1, 16), np.float32)
    with servekit.serve(str(config), http_port=0, grpc_port=None) as server:
        server.infer("add_sub", {"INPUT0": x, "INPUT1": x})
        wait_until(lambda: (server.payload_log or {}).get("logged") == 2, what="two logged")
        assert server.payload_log == {
            "sink": "file p.jsonl",
            "logged": 2,
            "dropped": 0,
            "queue_full": 0,
            "sink_failed": 0,
        }
    lines = (tmp_path / "log" / "p.jsonl").read_text().splitlines()
    assert [json.loads(line)["type"] for line in lines] == [REQUEST, RESPONSE]
