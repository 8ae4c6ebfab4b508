"""SIGTERM under load loses no accepted request: 16 real gRPC clients keep a slow Python model
busy; after SIGTERM every call the server had accepted (in flight or queued) is answered OK,
later ones are refused with UNAVAILABLE (retryable), no accepted call is CANCELLED, and the
server exits cleanly. A model call that never returns does not keep it from exiting once the
drain is over."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from servers import running_server
from tritonclient.utils import InferenceServerException
from waits import wait_until

pytestmark = pytest.mark.slow  # end to end: a real server process and Triton gRPC clients

MODEL = """\
import time


def slow(x):
    time.sleep(0.3)
    return x
"""
CLIENTS = 16
WAIT = 60.0


def test_sigterm_under_load_loses_no_accepted_request(tmp_path: Path) -> None:
    (tmp_path / "drain_models.py").write_text(MODEL)
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server: {drainSeconds: 20, drainDelaySeconds: 0}\nmodels:\n"
        "  - name: slow\n    modelFormat: {name: python}\n"
        "    entrypoint: drain_models:slow\n    instances: 4\n"
        "    inputs: [{name: x, datatype: FP32, shape: [-1]}]\n"
        "    outputs: [{name: x, datatype: FP32, shape: [-1]}]\n"
    )
    calls: list[tuple[float, str]] = []  # (start time, "OK" or the gRPC status)
    drained: list[float] = []  # when calls answered OK ended
    lock = threading.Lock()
    warmed = threading.Barrier(CLIENTS + 1)

    with running_server(config) as server:
        assert server.grpc_target is not None
        target = server.grpc_target

        def client() -> None:
            grpc = grpcclient.InferenceServerClient(target)
            x = grpcclient.InferInput("x", [1], "FP32")
            x.set_data_from_numpy(np.ones(1, np.float32))
            first = True
            while True:
                began = time.monotonic()
                try:
                    grpc.infer("slow", [x], client_timeout=WAIT)
                    status = "OK"
                except InferenceServerException as exc:
                    status = str(exc.status()) + " " + str(exc.message())[:80]
                with lock:
                    calls.append((began, status))
                    if status == "OK":
                        drained.append(time.monotonic())
                if first:
                    first = False
                    warmed.wait(WAIT)
                if status != "OK":
                    return

        threads = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
        for thread in threads:
            thread.start()
        warmed.wait(WAIT)  # every client has had one answer and is calling again
        time.sleep(0.15)  # the calls in flight are accepted (the model takes 0.3 s)
        signalled = time.monotonic()
        code = server.stop(signal.SIGTERM, timeout=WAIT)  # refused at once: no delay
        for thread in threads:
            thread.join(WAIT)
        assert not any(t.is_alive() for t in threads)

    # Refused calls are retryable: UNAVAILABLE while draining. A call made after every accepted
    # call was answered may meet the gRPC listener as it closes: grpc core cancels it before
    # servekit sees it, or, once the listener is gone, the client cannot connect at all. Both
    # are calls never accepted; a call that was accepted is never among them.
    last_ok = max(began for began, status in calls if status == "OK")
    never_reached = ("StatusCode.CANCELLED", "StatusCode.UNAVAILABLE failed to connect")
    odd = [
        (round(began - signalled, 3), status)
        for began, status in calls
        if status != "OK"
        and "stopping" not in status
        and not (status.startswith(never_reached) and began > last_ok)
    ]
    assert not odd, odd
    # (a call the server had not yet accepted when the signal came, on this busy machine, was
    # refused above with "stopping": not lost). Accepted ones were answered while draining:
    assert sum(1 for ended in drained if ended > signalled) >= 4, calls
    assert sum(1 for began, _ in calls if began < signalled - 0.1) >= CLIENTS * 2
    assert code == 0, code


NEVER = """\
import time
from pathlib import Path


class Never:
    def load(self, marker):
        self.marker = Path(marker)

    def predict(self, x):
        self.marker.touch()  # the test's cue: the call has started
        time.sleep(3600)
        return x
"""


def test_a_model_call_that_never_returns_does_not_keep_the_server_up(tmp_path: Path) -> None:
    (tmp_path / "never_models.py").write_text(NEVER)
    marker = tmp_path / "started"
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server: {drainSeconds: 1, drainDelaySeconds: 0}\nmodels:\n"
        "  - name: never\n    modelFormat: {name: python}\n    entrypoint: never_models:Never\n"
        f"    parameters: {{marker: {str(marker)!r}}}\n"
        "    inputs: [{name: x, datatype: FP32, shape: [-1]}]\n"
        "    outputs: [{name: x, datatype: FP32, shape: [-1]}]\n"
    )
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
    with running_server(config, grpc=False) as server:
        client = server.http_client(timeout=30)

        def call() -> None:
            # cut when the server stops: what matters here is that it stops
            with contextlib.suppress(httpx.HTTPError):
                client.post("/v2/models/never/infer", json=body)

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        wait_until(marker.exists, 30, "the model call to start")
        signalled = time.monotonic()
        code = server.stop(signal.SIGINT, timeout=20)  # SIGKILL, code -9, if it hangs
        took = time.monotonic() - signalled
        caller.join(30)
    assert code == 0, server.log()
    assert took < 15, took  # the drain (1 s) and the listeners' close, not the model's hour
    assert "closing with 1 request(s) still running" in server.log()
