"""One small client interface over ``tritonclient.http`` and ``tritonclient.grpc``.

The two Triton clients are near-identical; this adapter smooths the few differences (gRPC
metadata comes back as protobuf JSON with int64 as strings, error statuses are spelled
differently, JSON BYTES outputs arrive as ``str``) so each conformance test is written once.
Every request still goes over the wire through the real client library.

Each client also has an *encoding*, the two ways its transport carries tensors:
HTTP ``binary`` (binary tensor data extension) or ``json``; gRPC ``raw`` (``raw_input_contents``,
what tritonclient.grpc sends) or ``typed`` (``InferTensorContents``, what other gRPC clients
send; built with tritonclient's own protobuf classes and stub).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

STATUS: dict[str, dict[str, str]] = {
    "http": {"INVALID_ARGUMENT": "400", "NOT_FOUND": "404", "UNAVAILABLE": "503"},
    "grpc": {
        code: f"StatusCode.{code}" for code in ("INVALID_ARGUMENT", "NOT_FOUND", "UNAVAILABLE")
    },
}
"""What ``InferenceServerException.status()`` says for each core error code, per transport."""

ENCODINGS: dict[str, tuple[str, str]] = {"http": ("binary", "json"), "grpc": ("raw", "typed")}

# InferTensorContents field per datatype (FP16 has none: it always travels raw).
TYPED_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}  # fmt: skip


@dataclass
class Result:
    """An inference answer: outputs in the order the server sent them, plus its header."""

    outputs: dict[str, np.ndarray]
    model_name: str
    model_version: str
    id: str


class Client:
    """A Triton client of one transport and encoding, with normalised answers."""

    def __init__(self, transport: str, address: str, encoding: str | None = None) -> None:
        self.transport = transport
        self.encoding = encoding or ENCODINGS[transport][0]
        self.address = address
        self.raw: Any = (
            httpclient.InferenceServerClient(address)
            if transport == "http"
            else grpcclient.InferenceServerClient(address)
        )
        self._channel: grpc.Channel | None = None

    def __repr__(self) -> str:
        return f"Client({self.transport}/{self.encoding})"

    def close(self) -> None:
        self.raw.close()
        if self._channel is not None:
            self._channel.close()

    def expect_error(self, code: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
        """Call ``call``; it must fail with the core error ``code``. Returns the message."""
        with pytest.raises(InferenceServerException) as info:
            call(*args, **kwargs)
        assert info.value.status() == self.status(code), info.value.message()
        message = info.value.message()
        assert message, "an error needs a message a user can act on"
        return str(message)

    def status(self, code: str) -> str:
        """The ``status()`` this transport reports for a core error code."""
        return STATUS[self.transport][code]

    # -- health and metadata ----------------------------------------------------------------
    def live(self) -> bool:
        return bool(self.raw.is_server_live())

    def ready(self) -> bool:
        return bool(self.raw.is_server_ready())

    def model_ready(self, name: str, version: str = "") -> bool:
        return bool(self.raw.is_model_ready(name, version))

    def server_metadata(self) -> dict[str, Any]:
        if self.transport == "http":
            return dict(self.raw.get_server_metadata())
        return dict(self.raw.get_server_metadata(as_json=True))

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        """Model metadata with shapes as ints (gRPC JSON spells int64 as strings)."""
        if self.transport == "http":
            meta = dict(self.raw.get_model_metadata(name, version))
        else:
            meta = dict(self.raw.get_model_metadata(name, version, as_json=True))
        for key in ("inputs", "outputs"):
            meta[key] = [
                {**t, "shape": [int(d) for d in t.get("shape", [])]} for t in meta.get(key, [])
            ]
        return meta

    # -- inference ---------------------------------------------------------------------------
    def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str = "",
        outputs: Sequence[str] | None = None,
        request_id: str = "",
        datatypes: Mapping[str, str] | None = None,
    ) -> Result:
        """Run one request; ``datatypes`` overrides the declared datatype of named inputs."""
        declared = {
            n: (datatypes or {}).get(n, np_to_triton_dtype(a.dtype)) for n, a in inputs.items()
        }
        if self.transport == "http":
            return self._infer_http(model, inputs, declared, version, outputs, request_id)
        if self.encoding == "typed":
            return self._infer_typed(model, inputs, declared, version, outputs, request_id)
        tensors = []
        for name, array in inputs.items():
            tensor = grpcclient.InferInput(name, list(array.shape), declared[name])
            tensors.append(tensor.set_data_from_numpy(array))
        wanted = [grpcclient.InferRequestedOutput(n) for n in outputs] if outputs else None
        answer = self.raw.infer(model, tensors, version, wanted, request_id)
        return _grpc_result(answer)

    def _infer_http(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        declared: Mapping[str, str],
        version: str,
        outputs: Sequence[str] | None,
        request_id: str,
    ) -> Result:
        binary = self.encoding == "binary"
        tensors = []
        for name, array in inputs.items():
            tensor = httpclient.InferInput(name, list(array.shape), declared[name])
            tensors.append(tensor.set_data_from_numpy(array, binary_data=binary))
        if outputs is None and not binary:  # tritonclient asks for binary outputs unless named
            outputs = [o["name"] for o in self.model_metadata(model, version)["outputs"]]
        wanted = (
            [httpclient.InferRequestedOutput(n, binary_data=binary) for n in outputs]
            if outputs
            else None
        )
        answer = self.raw.infer(model, tensors, version, wanted, request_id)
        header = answer.get_response()
        arrays = {}
        for output in header["outputs"]:
            array = answer.as_numpy(output["name"])
            if output["datatype"] == "BYTES" and array.size and isinstance(array.flat[0], str):
                array = np.vectorize(lambda s: s.encode("utf-8"), otypes=[object])(array)
            arrays[output["name"]] = array
        return Result(
            arrays, header["model_name"], header.get("model_version", ""), header.get("id", "")
        )

    def _infer_typed(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        declared: Mapping[str, str],
        version: str,
        outputs: Sequence[str] | None,
        request_id: str,
    ) -> Result:
        request = service_pb2.ModelInferRequest(
            model_name=model, model_version=version, id=request_id
        )
        raw = any(dt not in TYPED_FIELD for dt in declared.values())
        for name, array in inputs.items():
            tensor = request.inputs.add(name=name, datatype=declared[name], shape=array.shape)
            if raw:  # FP16 has no typed field, and raw contents are all-or-nothing
                encoder = grpcclient.InferInput(name, list(array.shape), declared[name])
                request.raw_input_contents.append(encoder.set_data_from_numpy(array)._get_content())
            else:
                field = getattr(tensor.contents, TYPED_FIELD[declared[name]])
                field.extend(array.reshape(-1).tolist())
        for name in outputs or ():
            request.outputs.add(name=name)
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.address)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        try:
            response = stub.ModelInfer(request, timeout=30)
        except grpc.RpcError as exc:
            raise InferenceServerException(
                msg=exc.details(), status=str(exc.code()), debug_details=exc.debug_error_string()
            ) from None
        return _grpc_result(grpcclient.InferResult(response))


def _grpc_result(answer: Any) -> Result:
    response = answer.get_response()
    arrays = {o.name: answer.as_numpy(o.name) for o in response.outputs}
    return Result(arrays, response.model_name, response.model_version, response.id)
