"""Health, server metadata and model metadata, over every transport."""

from __future__ import annotations

import pytest
from servers import BROKEN_MODELS, DATATYPES, identity_name

from .adapter import Client

pytestmark = pytest.mark.slow

PLATFORM = "onnxruntime_onnx"


def test_server_live_and_ready(client: Client) -> None:
    assert client.live() is True
    assert client.ready() is True


def test_models_ready(client: Client) -> None:
    for name in ("mlp", "add_sub", identity_name("FP16"), identity_name("BYTES")):
        assert client.model_ready(name) is True, name
    assert client.model_ready("mlp", "1") is True
    assert client.model_ready("mlp", "2") is True


@pytest.mark.parametrize("name", sorted(BROKEN_MODELS))
def test_broken_model_is_not_ready(client: Client, name: str) -> None:
    assert client.model_ready(name) is False


def test_unknown_model_or_version_is_not_ready(client: Client) -> None:
    assert client.model_ready("no_such_model") is False
    assert client.model_ready("mlp", "9") is False


def test_server_metadata(client: Client) -> None:
    meta = client.server_metadata()
    assert meta["name"] == "servekit"
    assert meta["version"]
    assert "binary_tensor_data" in meta["extensions"]


@pytest.mark.parametrize("datatype", DATATYPES)
def test_identity_metadata(client: Client, datatype: str) -> None:
    name = identity_name(datatype)
    meta = client.model_metadata(name)
    assert meta["name"] == name
    assert meta["versions"] == ["1"]
    assert meta["platform"] == PLATFORM
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": datatype, "shape": [-1, -1]}]
    assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": datatype, "shape": [-1, -1]}]


@pytest.mark.parametrize("version", ["", "1", "2"])
def test_versioned_metadata(client: Client, version: str) -> None:
    meta = client.model_metadata("mlp", version)
    assert meta["name"] == "mlp"
    assert meta["versions"] == ["1", "2"]
    assert meta["platform"] == PLATFORM
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 16]}]
    assert meta["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 4]}]


def test_multi_input_metadata_keeps_model_order(client: Client) -> None:
    meta = client.model_metadata("add_sub")
    assert [t["name"] for t in meta["inputs"]] == ["INPUT0", "INPUT1"]
    assert [t["name"] for t in meta["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    assert all(t["shape"] == [-1, 16] and t["datatype"] == "FP32" for t in meta["inputs"])


def test_metadata_errors(client: Client) -> None:
    assert "no_such_model" in client.expect_error(
        "NOT_FOUND", client.model_metadata, "no_such_model"
    )
    client.expect_error("NOT_FOUND", client.model_metadata, "mlp", "9")
    reason = client.expect_error("UNAVAILABLE", client.model_metadata, "broken_lfs")
    assert "Git LFS" in reason
