"""The classification extension and input formats, in process: Triton's ranking and text
("value:index:label"), labels from serve.yaml or labels.txt beside the model, per-row ranking
for batching models, and ``format`` / ``label_filename`` in the model configuration."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from inprocess import Serve
from onnx_builders import identity
from pydantic import ValidationError
from shm_models import LABELS, SERVE_YAML

from servekit.config.schema import ModelConfig
from servekit.errors import InvalidArgument
from servekit.grpc.triton_proto import model_config_message
from servekit.rest.triton_json import model_config_json
from servekit.services.classification import classify
from servekit.types import InferRequest, RequestedOutput, Tensor

pytestmark = pytest.mark.anyio


def _tensor(values: list[float] | np.ndarray, datatype: str = "FP32") -> Tensor:
    array = np.asarray(values, dtype=np.float32 if datatype == "FP32" else None)
    return Tensor("out", datatype, array.shape, array)


def test_ranking_text_and_labels() -> None:
    top = classify(_tensor([0.1, 0.7, 0.05, 0.7]), 3, ["a", "b", "", "d"], batched=False)
    # highest first, ties by lower index; an empty or missing label adds nothing
    assert top.datatype == "BYTES" and top.shape == (3,)
    assert list(top.data) == [b"0.700000:1:b", b"0.700000:3:d", b"0.100000:0:a"]
    assert list(classify(_tensor([2.5, 9.0]), 5, [], batched=False).data) == [
        b"9.000000:1",
        b"2.500000:0",
    ]


def test_integers_and_unsigned_rank_by_value() -> None:
    ints = Tensor("out", "UINT8", (3,), np.array([0, 255, 7], dtype=np.uint8))
    assert list(classify(ints, 2, [], batched=False).data) == [b"255:1", b"7:2"]
    signed = Tensor("out", "INT64", (3,), np.array([-5, 3, -1], dtype=np.int64))
    assert list(classify(signed, 3, [], batched=False).data) == [b"3:1", b"-1:2", b"-5:0"]


def test_batching_models_rank_each_row() -> None:
    rows = _tensor([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1]])
    top = classify(rows, 2, ["x", "y", "z"], batched=True)
    assert top.shape == (2, 2)
    assert top.data.tolist() == [
        [b"0.900000:1:y", b"0.100000:0:x"],
        [b"0.800000:0:x", b"0.100000:1:y"],
    ]
    whole = classify(rows, 2, [], batched=False)  # not batching: one ranking of all 6
    assert whole.shape == (2,) and list(whole.data) == [b"0.900000:1", b"0.800000:3"]


def test_unrankable_outputs_are_refused() -> None:
    text = Tensor("out", "BYTES", (1,), np.array([b"x"], dtype=np.object_))
    with pytest.raises(InvalidArgument, match="unsupported type 'BYTES'"):
        classify(text, 1, [], batched=False)
    flags = Tensor("out", "BOOL", (2,), np.array([True, False]))
    with pytest.raises(InvalidArgument, match="unsupported type 'BOOL'"):
        classify(flags, 1, [], batched=False)


def test_format_belongs_to_inputs_and_labels_to_outputs() -> None:
    base = {"name": "m", "modelFormat": {"name": "python"}, "entrypoint": "x:y"}
    with pytest.raises(ValidationError, match="format belongs to inputs"):
        ModelConfig.model_validate({**base, "outputs": [{"name": "o", "format": "FORMAT_NCHW"}]})
    with pytest.raises(ValidationError, match="labels belong to outputs"):
        ModelConfig.model_validate({**base, "inputs": [{"name": "i", "labels": ["a"]}]})
    with pytest.raises(ValidationError):
        ModelConfig.model_validate({**base, "inputs": [{"name": "i", "format": "FORMAT_XYZ"}]})


async def test_labels_from_serve_yaml_and_format_in_the_config(serve: Serve) -> None:
    import shm_models

    services = await serve("models: []\n")
    config = ModelConfig.model_validate(
        {
            "name": "scores",
            "modelFormat": {"name": "python"},
            "entrypoint": "fakes:object",
            "maxBatchSize": 8,
            "inputs": [
                {"name": "image", "datatype": "FP32", "shape": [-1, 3, 2, 2],
                 "format": "FORMAT_NCHW"}
            ],
            "outputs": [{"name": "scores", "datatype": "FP32", "shape": [-1, 5],
                         "labels": LABELS}],
        }
    )  # fmt: skip
    await services.control.add(config, shm_models.Scores())
    image = np.zeros((2, 3, 2, 2), np.float32)
    request = InferRequest(
        "scores",
        [Tensor("image", "FP32", image.shape, image)],
        outputs=[RequestedOutput("scores", {"classification": 3})],
    )
    (top,) = (await services.dataplane.infer(request)).outputs
    assert top.shape == (2, 3)
    assert top.data[1].tolist() == [b"0.700000:1:dog", b"0.700000:3:fox", b"0.150000:4:owl"]
    served = services.dataplane.model_config("scores")
    as_json = model_config_json(served)
    assert as_json["input"][0]["format"] == "FORMAT_NCHW"
    assert "label_filename" not in as_json["output"][0]  # labels from serve.yaml: no file
    message = model_config_message(served)
    assert message.input[0].format == message.input[0].FORMAT_NCHW
    assert SERVE_YAML.count("FORMAT_NCHW") == 1  # the end-to-end server declares the same


async def test_labels_txt_beside_the_model(serve: Serve, tmp_path: Path) -> None:
    import onnx

    folder = tmp_path / "ident" / "1"
    folder.mkdir(parents=True)
    onnx.save(identity("FP32"), str(folder / "model.onnx"))
    (tmp_path / "ident" / "labels.txt").write_text("zero\none\ntwo\nthree\n")
    services = await serve(
        "models:\n  - {name: ident, modelFormat: {name: onnx}, storageUri: ident}\n"
    )
    scores = np.array([[0.2, 0.1, 0.9, 0.3]], np.float32)
    request = InferRequest(
        "ident",
        [Tensor("INPUT0", "FP32", scores.shape, scores)],
        outputs=[RequestedOutput("OUTPUT0", {"classification": 2})],
    )
    (top,) = (await services.dataplane.infer(request)).outputs
    assert list(top.data) == [b"0.900000:2:two", b"0.300000:3:three"]
    served = services.dataplane.model_config("ident")
    assert model_config_json(served)["output"][0]["label_filename"] == "labels.txt"
    assert model_config_message(served).output[0].label_filename == "labels.txt"
    assert model_config_json(served)["input"][0]["format"] == "FORMAT_NONE"


async def test_a_labels_file_that_is_not_text_is_the_models_reason(
    serve: Serve, tmp_path: Path
) -> None:
    import onnx

    folder = tmp_path / "ident" / "1"
    folder.mkdir(parents=True)
    onnx.save(identity("FP32"), str(folder / "model.onnx"))
    (tmp_path / "ident" / "labels.txt").write_bytes(b"\xff\xfe\x00bad")
    services = await serve(
        "models:\n  - {name: ident, modelFormat: {name: onnx}, storageUri: ident}\n"
    )
    reason = services.reason("ident")
    assert "labels.txt cannot be read as UTF-8" in reason
    assert str(tmp_path) not in reason  # paths relative to serve.yaml's folder only
