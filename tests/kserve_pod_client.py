"""Runs in KServe's venv (see test_kserve_clients.py): KServe's own InferenceRESTClient (V1 and V2)
and InferenceGRPCClient send the calls of KServe's e2e predictor tests (test/e2e/common/utils.py:
``predict_isvc``, ``predict_grpc``) to an emulated pod, and print what came back as JSON.

stdin: a JSON list of calls, each {"kind": "rest_v1"|"rest_v2"|"grpc", "url"|"target", "model",
"file"} (``file``: one of KServe's request files; for grpc, its "inputs" go into a
ModelInferRequest as KServe's test does). stdout: a JSON list, one answer per call: the V1 body,
or {"outputs": [{"name", "datatype", "shape", "data", "decoded"}]}, or {"error": "..."}.
A grpc call's optional "parameters" (str or bool values) go into the request's parameters.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import kserve.protocol.grpc.grpc_predict_v2_pb2 as pb
from kserve import InferenceGRPCClient, InferenceRESTClient, InferRequest, RESTConfig
from kserve.constants.constants import PredictorProtocol


def _outputs(response: Any) -> dict[str, Any]:
    """Each output's ``data``, what KServe's e2e tests compare (``response.outputs[0].data``:
    for gRPC, the typed ``contents`` only), and ``decoded``, the client's own decoding of either
    typed or raw contents (``as_numpy``)."""
    return {
        "outputs": [
            {
                "name": out.name,
                "datatype": out.datatype,
                "shape": list(out.shape),
                "data": list(out.data),
                "decoded": out.as_numpy().reshape(-1).tolist(),
            }
            for out in response.outputs
        ]
    }


def _parameter(value: Any) -> Any:
    if isinstance(value, bool):
        return pb.InferParameter(bool_param=value)
    return pb.InferParameter(string_param=value)


async def _call(call: dict[str, Any], v1: Any, v2: Any) -> Any:
    with open(call["file"]) as fh:
        data = json.load(fh)
    headers = {"Content-Type": "application/json"}
    if call["kind"] == "rest_v1":
        return await v1.infer(call["url"], data, model_name=call["model"], headers=headers)
    if call["kind"] == "rest_v2":
        response = await v2.infer(call["url"], data, model_name=call["model"], headers=headers)
        return _outputs(response)
    client = InferenceGRPCClient(call["target"], timeout=30)
    try:
        parameters = {key: _parameter(value) for key, value in call.get("parameters", {}).items()}
        request = pb.ModelInferRequest(
            model_name=call["model"], inputs=data["inputs"], parameters=parameters
        )
        return _outputs(await client.infer(InferRequest.from_grpc(request)))
    finally:
        await client.close()


async def main() -> None:
    calls = json.load(sys.stdin)
    v1 = InferenceRESTClient(RESTConfig(protocol=PredictorProtocol.REST_V1, timeout=30))
    v2 = InferenceRESTClient(RESTConfig(protocol=PredictorProtocol.REST_V2, timeout=30))
    answers: list[Any] = []
    for call in calls:
        try:
            answers.append(await _call(call, v1, v2))
        except Exception as exc:  # the test reports it with the call
            answers.append({"error": f"{type(exc).__name__}: {exc}"})
    await v1.close()
    await v2.close()
    print(json.dumps(answers))


if __name__ == "__main__":
    asyncio.run(main())
