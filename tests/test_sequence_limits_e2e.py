"""What one client may ask of a sequence model, over REST and gRPC against a real server: a
string correlation ID is at most 256 bytes (400 / INVALID_ARGUMENT, the bound named), and one
client address holds at most its share of the model's sequence slots (clientSlotShare, half
by default), so a client from another address (its source bound to 127.0.0.2) still gets one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from sequence_models import EXAMPLES_CONFIG, write_project
from servers import ServerProcess, running_server
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow  # a real server process

MODEL = "simple_sequence"  # maxBatchSize 8, direct: 8 slots, 4 per client address


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    config = write_project(tmp_path_factory.mktemp("sequence-limits"), EXAMPLES_CONFIG)
    with running_server(config) as process:
        yield process


def body(sequence: object, **flags: bool) -> dict[str, object]:
    return {
        "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [5]}],
        "parameters": {"sequence_id": sequence, **flags},
    }


def grpc_input() -> grpcclient.InferInput:
    data = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    data.set_data_from_numpy(np.full((1, 1), 5, np.int32))
    return data


def test_a_10_kb_correlation_id_is_refused(server: ServerProcess) -> None:
    long_id = "s" * 10_240
    with httpx.Client(base_url=server.http_url, timeout=10) as http:
        reply = http.post(f"/v2/models/{MODEL}/infer", json=body(long_id, sequence_start=True))
    assert reply.status_code == 400, reply.text
    assert "at most 256 bytes" in reply.json()["error"]
    client = grpcclient.InferenceServerClient(server.grpc_target or "")
    with pytest.raises(InferenceServerException) as caught:
        client.infer(MODEL, [grpc_input()], sequence_id=long_id, sequence_start=True)
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "at most 256 bytes" in (caught.value.message() or "")


def test_one_address_cannot_take_every_slot(server: ServerProcess) -> None:
    url = f"/v2/models/{MODEL}/infer"
    with httpx.Client(base_url=server.http_url, timeout=10) as greedy:
        statuses = [
            greedy.post(url, json=body(f"greedy-{n}", sequence_start=True)).status_code
            for n in range(8)  # every slot of the model, if it could
        ]
        assert statuses == [200] * 4 + [429] * 4, statuses
        refused = greedy.post(url, json=body("greedy-9", sequence_start=True))
        assert "clientSlotShare" in refused.json()["error"]
        # The same address over gRPC has the same share, already used.
        client = grpcclient.InferenceServerClient(server.grpc_target or "")
        with pytest.raises(InferenceServerException) as caught:
            client.infer(MODEL, [grpc_input()], sequence_id=101, sequence_start=True)
        assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        other = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(base_url=server.http_url, timeout=10, transport=other) as polite:
            started = time.monotonic()
            reply = polite.post(url, json=body("polite-1", sequence_start=True, sequence_end=True))
            assert reply.status_code == 200, reply.text
            assert time.monotonic() - started < 0.5  # a free slot, not one freed by an idle end
        # A sequence of the greedy client ends (its slot frees before the END is answered):
        # it may start another.
        assert greedy.post(url, json=body("greedy-0", sequence_end=True)).status_code == 200
        answer = greedy.post(url, json=body("greedy-10", sequence_start=True))
        assert answer.status_code == 200, answer.text
