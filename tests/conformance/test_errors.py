"""Every bad request gets its status code and a useful message, and the server stays healthy."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from servers import BROKEN_MODELS, ServerProcess, identity_name

from .adapter import Client
from .tensors import assert_same, sample

pytestmark = pytest.mark.slow

MLP_ROWS = np.zeros((2, 16), dtype=np.float32)


@pytest.fixture(autouse=True)
def still_healthy(client: Client, server: ServerProcess) -> Iterator[None]:
    """After each bad request the server is alive, ready, and still answers correctly."""
    yield
    server.assert_healthy()
    data = sample("FP32", (2, 3))
    assert_same(client.infer(identity_name("FP32"), {"INPUT0": data}).outputs["OUTPUT0"], data)


def test_unknown_model(client: Client) -> None:
    message = client.expect_error("NOT_FOUND", client.infer, "no_such_model", {"input": MLP_ROWS})
    assert "no_such_model" in message


@pytest.mark.parametrize("version", ["9", "0"])
def test_unknown_version(client: Client, version: str) -> None:
    message = client.expect_error(
        "NOT_FOUND", client.infer, "mlp", {"input": MLP_ROWS}, version=version
    )
    assert message.startswith(f"Request for unknown model: 'mlp' version {version} is not found")


def test_version_that_is_not_a_number(client: Client) -> None:
    """As Triton: INVALID_ARGUMENT with the words its clients look for."""
    message = client.expect_error(
        "INVALID_ARGUMENT", client.infer, "mlp", {"input": MLP_ROWS}, version="latest"
    )
    assert "failed to get model version from specified version string 'latest'" in message


@pytest.mark.parametrize("name", sorted(BROKEN_MODELS))
def test_broken_model_is_unavailable_with_a_hint(client: Client, name: str) -> None:
    data = sample("FP32", (1, 2))
    message = client.expect_error("UNAVAILABLE", client.infer, name, {"INPUT0": data})
    assert BROKEN_MODELS[name] in message


def test_wrong_datatype(client: Client) -> None:
    data = sample("INT32", (2, 3))
    message = client.expect_error(
        "INVALID_ARGUMENT", client.infer, identity_name("FP32"), {"INPUT0": data}
    )
    assert "FP32" in message and "INT32" in message


@pytest.mark.parametrize("shape", [(2, 15), (2, 17), (1, 2, 16), (16,)])
def test_wrong_shape(client: Client, shape: tuple[int, ...]) -> None:
    rows = np.zeros(shape, dtype=np.float32)
    message = client.expect_error("INVALID_ARGUMENT", client.infer, "mlp", {"input": rows})
    assert "shape" in message


def _add_sub(**extra: np.ndarray) -> dict[str, np.ndarray]:
    pair = {"INPUT0": np.ones((1, 16), np.float32), "INPUT1": np.ones((1, 16), np.float32)}
    return {**pair, **extra}


def test_unknown_input(client: Client) -> None:
    inputs = _add_sub(INPUT9=np.ones((1, 16), np.float32))
    message = client.expect_error("INVALID_ARGUMENT", client.infer, "add_sub", inputs)
    assert "INPUT9" in message


def test_missing_input(client: Client) -> None:
    inputs = {"INPUT0": np.ones((1, 16), np.float32)}
    message = client.expect_error("INVALID_ARGUMENT", client.infer, "add_sub", inputs)
    assert "INPUT1" in message


def test_unknown_output(client: Client) -> None:
    message = client.expect_error(
        "INVALID_ARGUMENT", client.infer, "add_sub", _add_sub(), outputs=["OUTPUT9"]
    )
    assert "OUTPUT9" in message
