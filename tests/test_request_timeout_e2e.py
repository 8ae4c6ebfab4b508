"""A request's ``timeout`` parameter (microseconds, as Triton's clients send it) is its
deadline on every lane, as a gRPC deadline is: a real server, a Python model that sleeps 30 s
(until its cancel flag is raised) and a pipeline whose step is that model. REST JSON, REST
binary (tritonclient) and gRPC answer 504 / DEADLINE_EXCEEDED at the timeout, as
``server.requestTimeoutSeconds`` does, not after the model's 30 s.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from servers import ServerProcess, running_server
from tritonclient.utils import InferenceServerException
from waits import wait_until

pytestmark = pytest.mark.slow  # a real server process

MODELS = """\
import time
from pathlib import Path

from servekit.runtimes.cancel import cancel_event


def sleeper(x, log=None):
    started = time.monotonic()
    cancel_event().wait(30)  # 30 s, unless the request is over
    if log is not None:
        with open(log, "a") as out:
            out.write(f"{time.monotonic() - started:.2f}\\n")
    return x


def capped(x):
    return sleeper(x, "capped.txt")
"""

IO = (
    "inputs: [{name: x, datatype: FP32, shape: [-1]}], "
    "outputs: [{name: x, datatype: FP32, shape: [-1]}]"
)
TIMEOUT_US = 2_000_000  # 2 s
BOUND_S = 2.5  # the answer comes within this, not after the model's 30 s


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("timeouts")
    (root / "slow_models.py").write_text(MODELS)
    (root / "serve.yaml").write_text(
        "server: {startupModels: all}\n"
        "models:\n"
        "  - {name: sleeper, modelFormat: {name: python}, entrypoint: 'slow_models:sleeper',\n"
        f"     instances: 4, {IO}}}\n"
        "  - {name: slow_pipeline, inputs: [{name: X, datatype: FP32, shape: [-1]}],\n"
        "     outputs: [{name: Y, datatype: FP32, shape: [-1]}],\n"
        "     pipeline: [{model: sleeper, inputs: {x: X}, outputs: {x: Y}}]}\n"
        "  - {name: capped, modelFormat: {name: python}, entrypoint: 'slow_models:capped',\n"
        f"     {IO}}}\n"
    )
    with running_server(root / "serve.yaml") as process:
        yield process


def name_of(model: str) -> str:
    """The model's input (the pipeline's is upper case)."""
    return "X" if model == "slow_pipeline" else "x"


def body(model: str, timeout: int | None) -> dict[str, object]:
    request: dict[str, object] = {
        "inputs": [{"name": name_of(model), "datatype": "FP32", "shape": [1], "data": [1.0]}]
    }
    if timeout is not None:
        request["parameters"] = {"timeout": timeout}
    return request


@pytest.mark.parametrize("model", ["sleeper", "slow_pipeline"])
def test_rest_json_timeout_ends_the_request(server: ServerProcess, model: str) -> None:
    with httpx.Client(base_url=server.http_url, timeout=10) as http:
        started = time.monotonic()
        reply = http.post(f"/v2/models/{model}/infer", json=body(model, TIMEOUT_US))
        took = time.monotonic() - started
    assert reply.status_code == 504, reply.text
    assert "deadline passed" in reply.json()["error"]
    assert 1.9 < took < BOUND_S, took


@pytest.mark.parametrize("model", ["sleeper", "slow_pipeline"])
def test_rest_binary_timeout_ends_the_request(server: ServerProcess, model: str) -> None:
    client = httpclient.InferenceServerClient(server.http_host_port, network_timeout=10)
    data = httpclient.InferInput(name_of(model), [1], "FP32")
    data.set_data_from_numpy(np.ones(1, np.float32), binary_data=True)
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as caught:
        client.infer(model, [data], timeout=TIMEOUT_US)
    took = time.monotonic() - started
    assert caught.value.status() == "504", caught.value
    assert 1.9 < took < BOUND_S, took


@pytest.mark.parametrize("model", ["sleeper", "slow_pipeline"])
def test_grpc_timeout_parameter_ends_the_request(server: ServerProcess, model: str) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_target or "")
    data = grpcclient.InferInput(name_of(model), [1], "FP32")
    data.set_data_from_numpy(np.ones(1, np.float32))
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as caught:
        client.infer(model, [data], timeout=TIMEOUT_US, client_timeout=10)
    took = time.monotonic() - started
    assert caught.value.status() == "StatusCode.DEADLINE_EXCEEDED", caught.value
    assert 1.9 < took < BOUND_S, took


def test_the_answer_is_the_one_a_grpc_deadline_gives(server: ServerProcess) -> None:
    """The same model ended by a gRPC deadline and by the timeout parameter: the same status
    and the same words; the model saw its cancel flag each time."""
    client = grpcclient.InferenceServerClient(server.grpc_target or "")
    data = grpcclient.InferInput("x", [1], "FP32")
    data.set_data_from_numpy(np.ones(1, np.float32))
    messages = []
    for kwargs in ({"client_timeout": 2.0}, {"timeout": TIMEOUT_US, "client_timeout": 10}):
        with pytest.raises(InferenceServerException) as caught:
            client.infer("capped", [data], **kwargs)  # type: ignore[arg-type]
        assert caught.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        messages.append(caught.value.message())
    # the client's own deadline may beat the server's answer; the server's words, when seen:
    assert "deadline passed while the model was computing it" in messages[1]
    ended = server.log_path.parent / "capped.txt"
    wait_until(lambda: ended.exists() and len(ended.read_text().split()) >= 2, what="both calls")
    assert all(float(t) < BOUND_S for t in ended.read_text().split())  # cancelled at about 2 s


def test_the_rest_answer_is_the_one_request_timeout_seconds_gives(
    server: ServerProcess, tmp_path: Path
) -> None:
    """``server.requestTimeoutSeconds: 2`` and a 2 s ``timeout`` parameter end the same
    request with the same REST answer: 504 and the same words."""
    with httpx.Client(base_url=server.http_url, timeout=10) as http:
        by_parameter = http.post("/v2/models/capped/infer", json=body("capped", TIMEOUT_US))
    (tmp_path / "slow_models.py").write_text(MODELS)
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server: {requestTimeoutSeconds: 2}\nmodels:\n"
        "  - {name: capped, modelFormat: {name: python}, entrypoint: 'slow_models:capped',\n"
        f"     {IO}}}\n"
    )
    with (
        running_server(config) as capped,
        httpx.Client(base_url=capped.http_url, timeout=10) as http,
    ):
        started = time.monotonic()
        by_server = http.post("/v2/models/capped/infer", json=body("capped", None))
        assert time.monotonic() - started < BOUND_S
    assert by_parameter.status_code == by_server.status_code == 504
    assert by_parameter.json() == by_server.json(), (by_parameter.text, by_server.text)
