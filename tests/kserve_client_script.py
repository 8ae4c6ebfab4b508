"""Drive a server with KServe's own Python clients; run ONLY inside the kserve virtualenv.

KServe's package and tritonclient.grpc cannot share a process (both register the protobuf
names of ``inference.GRPCInferenceService``), and kserve pins its own fastapi/protobuf/grpcio,
so ``tests/test_kserve_clients.py`` runs this file with the interpreter of a separate venv:

    python kserve_client_script.py HTTP_URL GRPC_TARGET CASES_JSON

``CASES_JSON`` lists inference cases (model, input tensors as JSON lists). Every case is sent
the four ways KServe's clients can send it: REST with JSON data, REST with binary tensor data
(binary outputs asked for too), gRPC with raw contents, gRPC with typed contents. The answers,
with health checks and metadata, are printed as one JSON object for the test to compare with
what tritonclient gets from the same server.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import grpc
import numpy as np
from kserve import (
    InferenceGRPCClient,
    InferenceRESTClient,
    InferInput,
    InferRequest,
    RESTConfig,
)
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.infer_type import RequestedOutput

MODES = ("rest_json", "rest_binary", "grpc_raw", "grpc_typed")
NO_JSON = {"FP16"}  # KServe's clients refuse FP16 as JSON / typed contents


def _array(tensor: dict[str, Any]) -> np.ndarray:
    if tensor["datatype"] == "BYTES":
        flat = [s.encode("utf-8") for s in tensor["data"]]
        return np.array(flat, dtype=np.object_).reshape(tensor["shape"])
    dtype = {"BOOL": "bool", "FP16": "float16", "FP32": "float32", "FP64": "float64"}.get(
        tensor["datatype"], tensor["datatype"].lower()
    )
    return np.array(tensor["data"], dtype=dtype).reshape(tensor["shape"])


def _request(case: dict[str, Any], mode: str) -> InferRequest:
    inputs = []
    for tensor in case["inputs"]:
        infer_input = InferInput(tensor["name"], tensor["shape"], tensor["datatype"])
        array = _array(tensor)
        if mode == "grpc_typed":
            infer_input.data = _array(tensor).reshape(-1).tolist()
        else:
            infer_input.set_data_from_numpy(array, binary_data=mode != "rest_json")
        inputs.append(infer_input)
    outputs = [RequestedOutput(name) for name in case["outputs"]]
    parameters = {"binary_data_output": True} if mode == "rest_binary" else None
    return InferRequest(
        model_name=case["model"],
        infer_inputs=inputs,
        request_outputs=outputs,
        parameters=parameters,
        request_id=f"{case['id']}-{mode}",
    )


def _response(response: Any) -> dict[str, Any]:
    outputs = {}
    for output in response.outputs:
        array = output.as_numpy()
        data = None  # BYTES: str from JSON data, bytes from binary data
        if array.dtype == object:
            data = [x.decode("utf-8") if isinstance(x, bytes) else x for x in array.reshape(-1)]
        outputs[output.name] = {
            "datatype": output.datatype,
            "shape": list(output.shape),
            "data": data if data is not None else array.reshape(-1).tolist(),
        }
    return {"model_name": response.model_name, "id": response.id, "outputs": outputs}


async def _rest(http_url: str, cases: list[dict[str, Any]]) -> dict[str, Any]:
    client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=30))
    try:
        result: dict[str, Any] = {
            "server_ready": await client.is_server_ready(http_url),
            "server_live": await client.is_server_live(http_url),
            "model_ready": await client.is_model_ready(http_url, "mlp"),
            "unknown_model_ready": await client.is_model_ready(http_url, "no_such_model"),
        }
        for case in cases:
            for mode in ("rest_json", "rest_binary"):
                if mode == "rest_json" and NO_JSON & {t["datatype"] for t in case["inputs"]}:
                    continue
                headers: dict[str, str] = {}
                request = _request(case, mode)
                response = await client.infer(http_url, request, case["model"], None, headers)
                answer = _response(response)
                answer["binary_outputs"] = "inference-header-content-length" in headers
                result[f"{case['id']}/{mode}"] = answer
        try:
            await client.infer(http_url, _request(cases[0], "rest_json"), "no_such_model")
            result["unknown_model_infer"] = "no error"
        except Exception as exc:  # httpx.HTTPStatusError carries our {"error": ...} text
            result["unknown_model_infer"] = f"{type(exc).__name__}: {exc}"
        return result
    finally:
        await client.close()


async def _grpc(grpc_target: str, cases: list[dict[str, Any]]) -> dict[str, Any]:
    client = InferenceGRPCClient(grpc_target, timeout=30)
    try:
        result: dict[str, Any] = {
            "server_ready": await client.is_server_ready(),
            "server_live": await client.is_server_live(),
            "model_ready": await client.is_model_ready("mlp"),
        }
        # The client has no metadata call; KServe's generated stub (its proto) has.
        metadata = await client._client_stub.ModelMetadata(pb.ModelMetadataRequest(name="mlp"))
        result["model_metadata"] = {
            "name": metadata.name,
            "versions": list(metadata.versions),
            "platform": metadata.platform,
            "inputs": [[t.name, t.datatype, list(t.shape)] for t in metadata.inputs],
            "outputs": [[t.name, t.datatype, list(t.shape)] for t in metadata.outputs],
        }
        for case in cases:
            for mode in ("grpc_raw", "grpc_typed"):
                if mode == "grpc_typed" and NO_JSON & {t["datatype"] for t in case["inputs"]}:
                    continue
                response = await client.infer(_request(case, mode))
                result[f"{case['id']}/{mode}"] = _response(response)
        try:
            result["unknown_model_ready"] = await client.is_model_ready("no_such_model")
        except grpc.RpcError as exc:
            result["unknown_model_ready"] = f"{exc.code().name}: {exc.details()}"
        return result
    finally:
        await client.close()


async def main(http_url: str, grpc_target: str, cases_path: str) -> None:
    with open(cases_path) as f:
        cases = json.load(f)
    rest = await _rest(http_url, cases)
    grpc_result = await _grpc(grpc_target, cases)
    json.dump({"rest": rest, "grpc": grpc_result}, sys.stdout)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
