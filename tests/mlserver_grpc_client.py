"""MLServer's own gRPC client code, run as a process of its own by tests/mlserver_server.py.

Reads ``{"target", "model", "requests"}`` (requests as MLServer's InferenceRequest JSON) on
standard input, sends each with MLServer 1.7.1's protobuf stubs (``mlserver.grpc``), converted
by its own converters, and prints ``{"infer": [...], "metadata": ...}``: each answer read back
into MLServer's types (``{"answer": InferenceResponse JSON}``) or its gRPC status
(``{"code", "details"}``). MLServer's package cannot be imported beside servekit's protos
(same protobuf names), hence the process of its own; it imports nothing of servekit.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import grpc
from mlserver.grpc import converters
from mlserver.grpc import dataplane_pb2 as pb
from mlserver.grpc.dataplane_pb2_grpc import GRPCInferenceServiceStub
from mlserver.types import InferenceRequest


def main() -> int:
    job = json.load(sys.stdin)
    model = job["model"]
    with grpc.insecure_channel(job["target"]) as channel:
        stub = GRPCInferenceServiceStub(channel)
        infer: list[dict[str, Any]] = []
        for raw in job["requests"]:
            request = InferenceRequest.model_validate(_as_bytes(raw))
            message = converters.ModelInferRequestConverter.from_types(request, model)
            try:
                reply = stub.ModelInfer(message, timeout=60)
            except grpc.RpcError as exc:
                infer.append({"code": exc.code().name, "details": exc.details()})
                continue
            answer = converters.ModelInferResponseConverter.to_types(reply)
            infer.append({"answer": json.loads(answer.model_dump_json())})
        found = stub.ModelMetadata(pb.ModelMetadataRequest(name=model), timeout=60)
        metadata = converters.ModelMetadataResponseConverter.to_types(found)
    json.dump({"infer": infer, "metadata": json.loads(metadata.model_dump_json())}, sys.stdout)
    return 0


def _as_bytes(raw: dict[str, Any]) -> dict[str, Any]:
    """BYTES data as bytes, as MLServer's codecs encode it for gRPC (``use_bytes=True``, their
    default): its converter refuses text there."""
    inputs = []
    for item in raw["inputs"]:
        if item["datatype"] == "BYTES":
            data = item["data"] if isinstance(item["data"], list) else [item["data"]]
            item = {**item, "data": [v.encode() if isinstance(v, str) else v for v in data]}
        inputs.append(item)
    return {**raw, "inputs": inputs}


if __name__ == "__main__":
    sys.exit(main())
