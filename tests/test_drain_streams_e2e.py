"""SIGTERM lets open streams finish within ``server.drainSeconds`` (issue 22, finding 10).

A decoupled model streams a few tokens a quarter of a second apart. Three streams are open when
the signal comes (HTTP generate_stream as Server-Sent Events, grps streaming over HTTP, gRPC
ModelStreamInfer through tritonclient), with two unary gRPC calls to a slow model in flight.
The server stops taking new requests (readiness false, a new inference answered 503), every
stream runs to its last token without an error, both unary calls are answered OK (none
CANCELLED), and the server exits cleanly well within the drain.
"""

from __future__ import annotations

import json
import queue
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from servers import running_server
from waits import wait_until

pytestmark = pytest.mark.slow  # a real server process, signals and clients (tests/tiers.py)

TICKS = 8
MODULE = f"""\
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

STARTED = Path(__file__).with_name("started.log")


class Token(TypedDict):
    text_output: str


def ticks(text_input: list[str]) -> Iterator[Token]:
    value = text_input[0]
    label = value.decode() if isinstance(value, bytes) else str(value)
    for i in range({TICKS}):
        time.sleep(0.25)
        yield {{"text_output": f"{{label}}-{{i}}"}}


def slow(x):
    with STARTED.open("a") as log:
        log.write("call\\n")
    time.sleep(1.5)
    return x
"""
CONFIG = (
    "server: {drainSeconds: 8, drainDelaySeconds: 0}\nmodels:\n"
    "  - {name: ticks, modelFormat: {name: python}, entrypoint: 'drain_streams:ticks',"
    " instances: 4}\n"
    "  - name: slow\n    modelFormat: {name: python}\n"
    "    entrypoint: drain_streams:slow\n    instances: 2\n"
    "    inputs: [{name: x, datatype: FP32, shape: [-1]}]\n"
    "    outputs: [{name: x, datatype: FP32, shape: [-1]}]\n"
)
WAIT = 30.0


def _expected(label: str) -> list[str]:
    return [f"{label}-{i}" for i in range(TICKS)]


def test_sigterm_lets_open_streams_and_unary_calls_finish(tmp_path: Path) -> None:
    (tmp_path / "drain_streams.py").write_text(MODULE)
    config = tmp_path / "serve.yaml"
    config.write_text(CONFIG)
    outcomes: dict[str, Any] = {}
    first: dict[str, threading.Event] = {k: threading.Event() for k in ("sse", "grps", "grpc")}

    with running_server(config) as server:
        assert server.grpc_target is not None
        target, base = server.grpc_target, server.http_url

        def unary(key: str) -> None:
            client = grpcclient.InferenceServerClient(target)
            x = grpcclient.InferInput("x", [1], "FP32")
            x.set_data_from_numpy(np.ones(1, np.float32))
            try:
                client.infer("slow", [x], client_timeout=WAIT)
                outcomes[key] = "OK"
            except Exception as exc:  # reported by the assertions below
                outcomes[key] = repr(exc)
            finally:
                client.close()

        def sse() -> None:
            events: list[Any] = []
            try:
                with (
                    httpx.Client(base_url=base, timeout=WAIT) as client,
                    client.stream(
                        "POST", "/v2/models/ticks/generate_stream", json={"text_input": "sse"}
                    ) as response,
                ):
                    for line in response.iter_lines():
                        if line.startswith("data: "):
                            events.append(json.loads(line[6:]))
                            first["sse"].set()
            except Exception as exc:
                events.append(repr(exc))
            outcomes["sse"] = events

        def grps() -> None:
            messages: list[Any] = []
            try:
                with (
                    httpx.Client(base_url=base, timeout=WAIT) as client,
                    client.stream(
                        "POST",
                        "/grps/v1/infer/predict",
                        params={"model": "ticks", "streaming": "true"},
                        json={"str_data": "grps"},
                    ) as response,
                ):
                    for line in response.iter_lines():
                        if line:
                            messages.append(json.loads(line))
                            first["grps"].set()
            except Exception as exc:
                messages.append(repr(exc))
            outcomes["grps"] = messages

        def grpc_stream() -> None:
            answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
            client = grpcclient.InferenceServerClient(target)
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            text = grpcclient.InferInput("text_input", [1], "BYTES")
            text.set_data_from_numpy(np.array([b"grpc"], dtype=object))
            client.async_stream_infer("ticks", [text], enable_empty_final_response=True)
            got: list[Any] = []
            try:
                while True:
                    result, error = answers.get(timeout=WAIT)
                    if error is not None:
                        got.append(repr(error))
                        break
                    response = result.get_response()
                    if response.parameters["triton_final_response"].bool_param:
                        break
                    got.append(result.as_numpy("text_output").reshape(-1)[0].decode())
                    first["grpc"].set()
            finally:
                client.stop_stream()
                client.close()
            outcomes["grpc"] = got

        started = tmp_path / "started.log"
        threads = [
            threading.Thread(target=unary, args=("unary-1",)),
            threading.Thread(target=unary, args=("unary-2",)),
            threading.Thread(target=sse),
            threading.Thread(target=grps),
            threading.Thread(target=grpc_stream),
        ]
        for thread in threads:
            thread.start()
        wait_until(
            lambda: started.exists() and len(started.read_text().split()) == 2,
            what="both unary calls to reach the model",
        )
        for key, event in first.items():
            assert event.wait(WAIT), f"the {key} stream sent nothing"
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        with httpx.Client(base_url=base, timeout=5) as client:
            wait_until(
                lambda: client.get("/v2/health/ready").status_code == 503,
                what="readiness to turn false",
            )
            refused = client.post(
                "/v2/models/slow/infer",
                json={"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]},
            )
        assert refused.status_code == 503, refused.text
        assert "stopping" in refused.json()["error"]
        for thread in threads:
            thread.join(WAIT)
        assert not any(t.is_alive() for t in threads)
        code = server.process.wait(WAIT)
        stopped = time.monotonic() - signalled

    assert outcomes["unary-1"] == "OK" and outcomes["unary-2"] == "OK", outcomes
    assert [e.get("text_output") for e in outcomes["sse"]] == _expected("sse"), outcomes["sse"]
    assert [m.get("str_data") for m in outcomes["grps"]] == _expected("grps"), outcomes["grps"]
    assert outcomes["grpc"] == _expected("grpc"), outcomes["grpc"]
    assert code == 0, code
    assert stopped < 8, f"the server took {stopped:.1f} s to stop after its streams ended"
