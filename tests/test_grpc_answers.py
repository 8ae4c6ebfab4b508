"""``server.grpcAnswers``: raw answers by default (tritonclient reads ``raw_output_contents``);
``asSent`` answers typed ``contents`` to a request whose inputs came typed, as KServe's servers
and MLServer do, and is what ``--model-dir`` (KServe's pod) and MLServer folders serve with."""

from __future__ import annotations

from pathlib import Path

import joblib
import numpy as np

from servekit.codecs import v2_proto
from servekit.config.mlserver_project import convert
from servekit.config.model_dir import model_dir_config
from servekit.config.schema import ServerConfig
from servekit.protos import grpc_service_pb2 as pb
from servekit.types import InferResponse, Tensor


def request(typed: bool, **params: bool) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(
        model_name="m", parameters={k: pb.InferParameter(bool_param=v) for k, v in params.items()}
    )
    item = message.inputs.add(name="x", datatype="INT64", shape=[2])
    if typed:
        item.contents.int64_contents.extend([1, 2])
    else:
        message.raw_input_contents.append(np.array([1, 2], dtype=np.int64).tobytes())
    return message


def answer(message: pb.ModelInferRequest, as_sent: bool) -> pb.ModelInferResponse:
    """What the servicer answers: the request decoded (its parameters untouched: a model sees
    what the client sent) and the answer encoded as it came in."""
    decoded = v2_proto.decode_request(message)
    assert "binary_data_output" not in decoded.parameters or message.parameters
    typed_in = as_sent and not message.raw_input_contents
    out = Tensor("y", "INT64", (2,), np.array([3, 4], dtype=np.int64))
    return v2_proto.encode_response(decoded, InferResponse("m", "1", [out], None, {}), typed_in)


def test_raw_by_default_typed_requests_included() -> None:
    got = answer(request(typed=True), as_sent=False)
    assert len(got.raw_output_contents) == 1
    assert not got.outputs[0].HasField("contents")


def test_as_sent_answers_typed_to_typed() -> None:
    got = answer(request(typed=True), as_sent=True)
    assert not got.raw_output_contents
    assert list(got.outputs[0].contents.int64_contents) == [3, 4]


def test_as_sent_answers_raw_to_raw_and_to_who_asks_raw() -> None:
    assert len(answer(request(typed=False), as_sent=True).raw_output_contents) == 1
    asked_raw = request(typed=True, binary_data_output=True)
    assert len(answer(asked_raw, as_sent=True).raw_output_contents) == 1


def test_the_default_and_the_modes_that_stand_in_for_kserve_and_mlserver(tmp_path: Path) -> None:
    assert ServerConfig().grpc_answers == "raw"
    joblib.dump({"a model": 1}, tmp_path / "model.joblib")  # the folder check reads its header
    assert model_dir_config(tmp_path, "iris")["server"]["grpcAnswers"] == "asSent"
    (tmp_path / "model-settings.json").write_text(
        '{"name": "iris", "implementation": "mlserver_sklearn.SKLearnModel"}'
    )
    (tmp_path / "model.joblib").unlink()
    assert convert(tmp_path, environ={}).config["server"]["grpcAnswers"] == "asSent"
