"""The parent/child wire of isolated models, their settings and the repository's follow-up of a
runtime's health: in process, no child started (the end-to-end side is tests/test_isolation.py).

Messages go over a real socket pair: every V2 datatype round-trips bit for bit, a tensor larger
than the socket buffers streams, and a peer that sends nonsense (unknown datatype, sizes that do
not match the shape, a huge header, not JSON) is refused before anything is allocated from it.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis.extra import numpy as hnp
from pydantic import ValidationError

from servekit.config.compiler import compile_plan
from servekit.config.loader import ConfigError
from servekit.config.schema import ModelConfig, ServeConfig
from servekit.datatypes import DATATYPES
from servekit.models.repository import ModelRepository, State, VersionEntry
from servekit.runtimes.isolation_wire import (
    ChannelClosed,
    ProtocolError,
    recv_message,
    send_message,
)
from servekit.types import ModelSignature


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def round_trip(pair: tuple[socket.socket, socket.socket], arrays: dict[str, np.ndarray]) -> Any:
    a, b = pair
    sender = threading.Thread(target=send_message, args=(a, {"op": "infer", "n": 1}, arrays))
    sender.start()
    try:
        return recv_message(b, time.monotonic() + 20)
    finally:
        sender.join()


NUMERIC = [d for d in DATATYPES.values() if not d.is_bytes]


@pytest.mark.parametrize("kind", NUMERIC, ids=lambda d: d.name)
def test_every_numeric_datatype_round_trips(
    pair: tuple[socket.socket, socket.socket], kind: Any
) -> None:
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 2 * 3 * kind.itemsize, dtype=np.uint8).view(kind.dtype)
    arrays = {"x": data.reshape(2, 3), "empty": np.zeros((0, 4), kind.dtype)}
    header, out = round_trip(pair, arrays)
    assert header == {"op": "infer", "n": 1}
    for name, array in arrays.items():
        assert out[name].dtype == kind.dtype and out[name].shape == array.shape
        assert out[name].tobytes() == array.tobytes()  # bit for bit, NaN payloads included


@settings(max_examples=30, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0)))
def test_shapes_round_trip(array: np.ndarray) -> None:
    a, b = socket.socketpair()
    with a, b:
        _, out = round_trip((a, b), {"t": array})
    assert out["t"].shape == array.shape and out["t"].tobytes() == array.tobytes()


def test_bytes_round_trip(pair: tuple[socket.socket, socket.socket]) -> None:
    texts = np.array([[b"", b"a\x00b"], ["zo\u00e9", b"x" * 70_000]], dtype=object)
    _, out = round_trip(pair, {"s": texts, "none": np.empty((0,), dtype=object)})
    assert out["s"].shape == (2, 2) and out["s"].dtype == object
    assert out["s"].tolist() == [[b"", b"a\x00b"], ["zo\u00e9".encode(), b"x" * 70_000]]
    assert out["none"].shape == (0,)


def test_non_contiguous_and_big_endian_arrays_are_sent_as_their_values(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    base = np.arange(12, dtype=np.float64).reshape(3, 4)
    _, out = round_trip(pair, {"t": base.T, "be": base.astype(">i4")})
    np.testing.assert_array_equal(out["t"], base.T)
    np.testing.assert_array_equal(out["be"], base.astype(np.int32))
    assert out["be"].dtype == np.dtype("<i4")


def test_a_tensor_larger_than_the_socket_buffers_streams(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    big = np.arange(4 * 1024 * 1024, dtype=np.float32)  # 16 MiB
    _, out = round_trip(pair, {"big": big})
    assert np.array_equal(out["big"], big)


def raw_message(header: Any, body: bytes = b"") -> bytes:
    encoded = orjson.dumps(header)
    return struct.pack("<I", len(encoded)) + encoded + body


@pytest.mark.parametrize(
    ("message", "complaint"),
    [
        (raw_message([1, 2]), "not a JSON object"),
        (struct.pack("<I", 5) + b"{nope", "not JSON"),
        (struct.pack("<I", 1 << 30), "header of"),
        (raw_message({"tensors": {}}), "'tensors' is not a list"),
        (raw_message({"tensors": [{"name": "x", "datatype": "OBJECT", "shape": [1], "nbytes": 8}]}),
         "datatype 'OBJECT'"),
        (raw_message({"tensors": [{"name": "x", "datatype": "FP32", "shape": [-1], "nbytes": 4}]}),
         "shape"),
        (raw_message({"tensors": [{"name": "x", "datatype": "FP32", "shape": [1e9], "nbytes": 4}]}),
         "shape"),
        (raw_message({"tensors": [{"name": "x", "datatype": "FP32", "shape": [2], "nbytes": 4}]}),
         r"4 bytes for shape \[2\]"),
        (raw_message({"tensors": [{"name": "x", "datatype": "FP32", "shape": [1 << 40],
                                   "nbytes": 1 << 42}]}), "bytes"),
        (raw_message({"tensors": [{"name": "s", "datatype": "BYTES", "shape": [3], "nbytes": 4}]},
                     b"\0" * 4), "BYTES elements"),
        (raw_message({"tensors": [{"name": "s", "datatype": "BYTES", "shape": [1], "nbytes": 8}]},
                     struct.pack("<I", 100) + b"abcd"), "longer than its tensor"),
        (raw_message({"tensors": [{"name": "s", "datatype": "BYTES", "shape": [1], "nbytes": 8}]},
                     struct.pack("<I", 1) + b"abcd"), "longer than its elements"),
        (raw_message({"tensors": [{"name": "x", "datatype": "UINT8", "shape": [1],
                                   "nbytes": 1}] * 2}, b"ab"), "sent twice"),
        (raw_message({"op": "infer"}) + b"extra", "5 bytes beyond the message"),
    ],
)  # fmt: skip
def test_a_peer_sending_nonsense_is_refused(
    pair: tuple[socket.socket, socket.socket], message: bytes, complaint: str
) -> None:
    a, b = pair
    a.sendall(message)
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(ProtocolError, match=complaint):
        recv_message(b, time.monotonic() + 5)


def test_end_of_file_and_deadline(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        recv_message(b, time.monotonic() + 0.05)
    assert time.monotonic() - started < 5
    a.sendall(raw_message({"tensors": [{"name": "x", "datatype": "FP32", "shape": [4],
                                        "nbytes": 16}]}) + b"\0" * 8)  # fmt: skip
    a.close()
    with pytest.raises(ChannelClosed):
        recv_message(b, time.monotonic() + 5)  # the peer died half-way through a tensor
    with pytest.raises(ChannelClosed):
        send_message(b, {"op": "infer"}, {"x": np.ones(1 << 20, np.float32)})


# -- settings -------------------------------------------------------------------------------
def python_model(**extra: Any) -> dict[str, Any]:
    return {"name": "m", "modelFormat": {"name": "python"}, "entrypoint": "mod:f", **extra}


def test_isolation_settings() -> None:
    model = ModelConfig.model_validate(
        python_model(isolation="process", timeoutSeconds=2.5, memoryLimitBytes=1 << 30)
    )
    assert (model.isolation, model.timeout_seconds, model.memory_limit_bytes) == (
        "process",
        2.5,
        1 << 30,
    )
    assert ModelConfig.model_validate(python_model()).isolation == "none"
    with pytest.raises(ValidationError, match="apply to isolation: process only"):
        ModelConfig.model_validate(python_model(timeoutSeconds=1))
    with pytest.raises(ValidationError, match="apply to isolation: process only"):
        ModelConfig.model_validate(python_model(memoryLimitBytes=1 << 30))
    with pytest.raises(ValidationError):
        ModelConfig.model_validate(python_model(isolation="thread"))
    with pytest.raises(ValidationError):
        ModelConfig.model_validate(python_model(isolation="process", memoryLimitBytes=1024))


def test_isolation_is_for_python_models_only(tmp_path: Path) -> None:
    config = ServeConfig.model_validate(
        {
            "models": [
                {"name": "m", "modelFormat": {"name": "onnx"}, "storageUri": "m.onnx",
                 "isolation": "process"},
            ]
        }
    )  # fmt: skip
    with pytest.raises(ConfigError, match="isolation: process runs Python models only"):
        compile_plan(config, tmp_path)


# -- the repository follows a runtime's health ------------------------------------------------
class Restarting:
    """A runtime whose health changes after loading, as an isolated model's does."""

    platform = "python"
    may_run_inline = False
    signature = ModelSignature((), ())

    def __init__(self) -> None:
        self.report: Callable[[str | None], None] | None = None

    def predict(self, inputs: Any, outputs: list[str]) -> Any:
        return {}

    def close(self) -> None:
        pass

    def watch(self, report: Callable[[str | None], None]) -> None:
        self.report = report


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


@pytest.mark.anyio
async def test_repository_shows_a_runtime_going_down_and_coming_back(tmp_path: Path) -> None:
    repository = ModelRepository(tmp_path)
    runtime = Restarting()
    version = VersionEntry(1, State.READY, runtime=runtime)
    repository._watch("m", version)
    assert runtime.report is not None
    report = runtime.report
    # from another thread, as the runtime's restart threads do
    threading.Thread(target=report, args=("its process was killed by SIGSEGV",)).start()
    deadline = time.monotonic() + 5
    while version.state is State.READY and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert (version.state, version.reason) == (
        State.UNAVAILABLE,
        "its process was killed by SIGSEGV",
    )
    assert "SIGSEGV" in repository.recent_errors[-1].message
    report(None)
    await settle()
    assert (version.state, version.reason) == (State.READY, "")
    version.state = State.UNLOADING  # retired: later reports change nothing
    report("late")
    await settle()
    assert version.state is State.UNLOADING
    version.state, version.runtime = State.UNAVAILABLE, None
    report(None)
    await settle()
    assert version.state is State.UNAVAILABLE
