"""Our generated protos vs. the descriptors tritonclient ships, plus the drift check.

The KServe V2 / Triton ``inference`` protos in proto/ are our own text; these
tests hold them field-for-field to tritonclient's compiled descriptors
(``tritonclient/grpc/service_pb2.py`` and ``model_config_pb2.py``), which is
what real Triton clients put on the wire.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, json_format
from google.protobuf.descriptor import (
    Descriptor,
    EnumDescriptor,
    FileDescriptor,
    ServiceDescriptor,
)
from tritonclient.grpc import model_config_pb2 as triton_model_config_pb2
from tritonclient.grpc import service_pb2 as triton_service_pb2
from tritonclient.grpc import service_pb2_grpc as triton_service_pb2_grpc

from servekit.protos import (
    POOL,
    grpc_service_pb2,
    grpc_service_pb2_grpc,
    grps_pb2,
    grps_pb2_grpc,
    model_config_pb2,
)

ROOT = Path(__file__).resolve().parents[1]

FILE_PAIRS = [
    pytest.param(triton_service_pb2.DESCRIPTOR, grpc_service_pb2.DESCRIPTOR, id="grpc_service"),
    pytest.param(
        triton_model_config_pb2.DESCRIPTOR, model_config_pb2.DESCRIPTOR, id="model_config"
    ),
]


def _all_messages(fd: FileDescriptor) -> Iterator[Descriptor]:
    """Every message of a file, nested ones (including map entries) too."""

    def walk(d: Descriptor) -> Iterator[Descriptor]:
        yield d
        for nested in d.nested_types:
            yield from walk(nested)

    for top in fd.message_types_by_name.values():
        yield from walk(top)


def _all_enums(fd: FileDescriptor) -> Iterator[EnumDescriptor]:
    yield from fd.enum_types_by_name.values()
    for msg in _all_messages(fd):
        yield from msg.enum_types


def _proto(d: Descriptor) -> descriptor_pb2.DescriptorProto:
    p = descriptor_pb2.DescriptorProto()
    d.CopyToProto(p)
    return p


def _field_signature(d: Descriptor) -> dict[str, tuple[object, ...]]:
    """name -> (number, type, label, type_name, oneof name, proto3_optional, options)."""
    p = _proto(d)
    sig: dict[str, tuple[object, ...]] = {}
    for f in p.field:
        oneof = p.oneof_decl[f.oneof_index].name if f.HasField("oneof_index") else None
        sig[f.name] = (
            f.number,
            descriptor_pb2.FieldDescriptorProto.Type.Name(f.type),
            descriptor_pb2.FieldDescriptorProto.Label.Name(f.label),
            f.type_name,
            oneof,
            f.proto3_optional,
            f.options.SerializeToString(),
        )
    return sig


# --------------------------------------------------------------------------- files


@pytest.mark.parametrize(("theirs", "ours"), FILE_PAIRS)
def test_file_level(theirs: FileDescriptor, ours: FileDescriptor) -> None:
    assert ours.package == theirs.package == "inference"
    their_proto, our_proto = (
        descriptor_pb2.FileDescriptorProto(),
        descriptor_pb2.FileDescriptorProto(),
    )
    theirs.CopyToProto(their_proto)
    ours.CopyToProto(our_proto)
    assert our_proto.syntax == their_proto.syntax == "proto3"
    assert ours.pool is POOL, "our descriptors must live in the private pool"
    assert theirs.pool is not POOL


@pytest.mark.parametrize(("theirs", "ours"), FILE_PAIRS)
def test_same_message_set(theirs: FileDescriptor, ours: FileDescriptor) -> None:
    their_names = {m.full_name for m in _all_messages(theirs)}
    our_names = {m.full_name for m in _all_messages(ours)}
    assert their_names, "tritonclient descriptor unexpectedly empty"
    assert our_names - their_names == set(), "messages we define that tritonclient lacks"
    assert their_names - our_names == set(), "tritonclient messages we are missing"


@pytest.mark.parametrize(("theirs", "ours"), FILE_PAIRS)
def test_every_message_field_for_field(theirs: FileDescriptor, ours: FileDescriptor) -> None:
    checked = 0
    for their_msg in _all_messages(theirs):
        our_msg = POOL.FindMessageTypeByName(their_msg.full_name)
        assert our_msg.file is ours, their_msg.full_name
        their_sig, our_sig = _field_signature(their_msg), _field_signature(our_msg)
        assert our_sig == their_sig, f"fields of {their_msg.full_name} differ"
        # Field declaration order does not matter on the wire, but oneof
        # membership and map-entry-ness do.
        assert [o.name for o in our_msg.oneofs] == [o.name for o in their_msg.oneofs], (
            their_msg.full_name
        )
        for o in their_msg.oneofs:
            assert [f.name for f in our_msg.oneofs_by_name[o.name].fields] == [
                f.name for f in o.fields
            ], f"{their_msg.full_name}.{o.name}"
        assert _proto(our_msg).options == _proto(their_msg).options, their_msg.full_name
        checked += 1
    assert checked > 10


@pytest.mark.parametrize(("theirs", "ours"), FILE_PAIRS)
def test_every_enum_value(theirs: FileDescriptor, ours: FileDescriptor) -> None:
    their_enums = {e.full_name: e for e in _all_enums(theirs)}
    our_enums = {e.full_name: e for e in _all_enums(ours)}
    assert set(our_enums) == set(their_enums)
    for name, e in their_enums.items():
        assert [(v.name, v.number) for v in our_enums[name].values] == [
            (v.name, v.number) for v in e.values
        ], name


def _methods(s: ServiceDescriptor) -> dict[str, tuple[str, str, bool, bool]]:
    p = descriptor_pb2.ServiceDescriptorProto()
    s.CopyToProto(p)
    return {
        m.name: (m.input_type, m.output_type, m.client_streaming, m.server_streaming)
        for m in p.method
    }


def test_inference_service_methods() -> None:
    theirs = triton_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    ours = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert ours.full_name == theirs.full_name == "inference.GRPCInferenceService"
    assert _methods(ours) == _methods(theirs)
    assert _methods(ours)["ModelStreamInfer"][2:] == (True, True)
    required = {
        "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
        "ModelInfer", "ModelStreamInfer", "ModelConfig", "ModelStatistics", "RepositoryIndex",
        "RepositoryModelLoad", "RepositoryModelUnload", "SystemSharedMemoryStatus",
        "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister", "CudaSharedMemoryStatus",
        "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister", "TraceSetting", "LogSettings",
    }  # fmt: skip
    assert required <= set(_methods(ours))


def test_grpc_stub_and_servicer_cover_every_method() -> None:
    methods = set(_methods(grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]))
    servicer = grpc_service_pb2_grpc.GRPCInferenceServiceServicer
    assert methods <= {n for n in dir(servicer) if not n.startswith("_")}
    assert callable(grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server)
    # Same wire method paths as tritonclient's stub.
    for source in (grpc_service_pb2_grpc, triton_service_pb2_grpc):
        assert source.__file__ is not None
        text = Path(source.__file__).read_text(encoding="utf-8")
        for m in methods:
            assert f"'/inference.GRPCInferenceService/{m}'" in text, (source.__name__, m)


# --------------------------------------------------------------------------- wire


def test_wire_roundtrip_infer_request_both_ways() -> None:
    ours = grpc_service_pb2.ModelInferRequest(
        model_name="m",
        model_version="1",
        id="req-1",
        parameters={"sequence_id": grpc_service_pb2.InferParameter(int64_param=7)},
        inputs=[
            grpc_service_pb2.ModelInferRequest.InferInputTensor(
                name="x",
                datatype="FP32",
                shape=[1, 2],
                contents=grpc_service_pb2.InferTensorContents(fp32_contents=[1.0, 2.5]),
            )
        ],
        outputs=[grpc_service_pb2.ModelInferRequest.InferRequestedOutputTensor(name="y")],
        raw_input_contents=[b"\x00\x01"],
    )
    theirs = triton_service_pb2.ModelInferRequest.FromString(ours.SerializeToString())
    assert json_format.MessageToDict(theirs) == json_format.MessageToDict(ours)
    back = grpc_service_pb2.ModelInferRequest.FromString(theirs.SerializeToString())
    assert back == ours


def test_model_config_decodes_as_tritonclient_get_model_config_does() -> None:
    cfg = model_config_pb2.ModelConfig(
        name="iris",
        platform="onnxruntime_onnx",
        backend="onnxruntime",
        version_policy=model_config_pb2.ModelVersionPolicy(
            latest=model_config_pb2.ModelVersionPolicy.Latest(num_versions=1)
        ),
        max_batch_size=8,
        input=[
            model_config_pb2.ModelInput(
                name="x", data_type=model_config_pb2.TYPE_FP32, dims=[-1, 4]
            )
        ],
        output=[
            model_config_pb2.ModelOutput(name="y", data_type=model_config_pb2.TYPE_INT64, dims=[-1])
        ],
        dynamic_batching=model_config_pb2.ModelDynamicBatching(
            preferred_batch_size=[4, 8], max_queue_delay_microseconds=100
        ),
        instance_group=[
            model_config_pb2.ModelInstanceGroup(
                count=2, kind=model_config_pb2.ModelInstanceGroup.KIND_CPU
            )
        ],
        parameters={"k": model_config_pb2.ModelParameter(string_value="v")},
        model_transaction_policy=model_config_pb2.ModelTransactionPolicy(decoupled=False),
    )
    wire = grpc_service_pb2.ModelConfigResponse(config=cfg).SerializeToString()
    theirs = triton_service_pb2.ModelConfigResponse.FromString(wire)
    # What InferenceServerClient.get_model_config(as_json=True) does with the response.
    as_json = json_format.MessageToDict(theirs, preserving_proto_field_name=True)
    config = as_json["config"]
    assert config["name"] == "iris"
    assert config["max_batch_size"] == 8
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["output"][0]["dims"] == ["-1"]
    assert config["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert config["parameters"] == {"k": {"string_value": "v"}}
    assert theirs.config.WhichOneof("scheduling_choice") == "dynamic_batching"


# --------------------------------------------------------------------------- coexistence

_IMPORT_TRITON = "import tritonclient.grpc, tritonclient.grpc.service_pb2 as t"
_IMPORT_OURS = "from servekit.protos import grpc_service_pb2 as o, grpc_service_pb2_grpc, grps_pb2"
_CHECK = (
    "from google.protobuf.internal import api_implementation\n"
    # Pure-python backend only: protobuf's builder registers generated classes in the default
    # symbol database, which copies their descriptors into the default pool, so the module
    # imported first supplies the (identical) descriptors for both. See scripts/gen_protos.py.
    "if api_implementation.Type() == 'upb':\n"
    "    assert o.ModelInferRequest is not t.ModelInferRequest\n"
    "    assert o.DESCRIPTOR.pool is not t.DESCRIPTOR.pool\n"
    "assert o.ModelInferRequest.DESCRIPTOR.full_name == t.ModelInferRequest.DESCRIPTOR.full_name\n"
    "m = o.ModelInferRequest(model_name='a')\n"
    "assert t.ModelInferRequest.FromString(m.SerializeToString()).model_name == 'a'\n"
    "print('ok', api_implementation.Type())\n"
)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["upb", "python"])
@pytest.mark.parametrize("triton_first", [True, False], ids=["triton-first", "ours-first"])
def test_importable_alongside_tritonclient(triton_first: bool, impl: str) -> None:
    """A fresh interpreter per case: import order matters for the default pool."""
    first, second = (
        (_IMPORT_TRITON, _IMPORT_OURS) if triton_first else (_IMPORT_OURS, _IMPORT_TRITON)
    )
    env = dict(os.environ, PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=impl)
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", f"{first}\n{second}\n{_CHECK}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"ok {impl}"


# --------------------------------------------------------------------------- drift


@pytest.mark.slow
def test_generated_code_is_up_to_date() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --------------------------------------------------------------------------- grps


def test_grps_service_methods() -> None:
    fd = grps_pb2.DESCRIPTOR
    assert fd.package == "grps.protos.v1"
    assert fd.pool is POOL
    svc = fd.services_by_name["GrpsService"]
    assert svc.full_name == "grps.protos.v1.GrpsService"
    msg = ".grps.protos.v1.GrpsMessage"
    assert _methods(svc) == {
        "Predict": (msg, msg, False, False),
        "PredictStreaming": (msg, msg, False, True),
        "Online": (msg, msg, False, False),
        "Offline": (msg, msg, False, False),
        "CheckLiveness": (msg, msg, False, False),
        "CheckReadiness": (msg, msg, False, False),
        "ServerMetadata": (msg, msg, False, False),
        "ModelMetadata": (msg, msg, False, False),
    }
    servicer = grps_pb2_grpc.GrpsServiceServicer
    assert set(_methods(svc)) <= set(dir(servicer))
    assert callable(grps_pb2_grpc.add_GrpsServiceServicer_to_server)
    assert grps_pb2_grpc.__file__ is not None
    text = Path(grps_pb2_grpc.__file__).read_text(encoding="utf-8")
    assert "'/grps.protos.v1.GrpsService/PredictStreaming'" in text


def test_grps_messages() -> None:
    sig = _field_signature(grps_pb2.GrpsMessage.DESCRIPTOR)
    assert {k: (v[0], v[4]) for k, v in sig.items()} == {
        "status": (1, None),
        "model": (2, None),
        "bin_data": (3, "data_oneof"),
        "str_data": (4, "data_oneof"),
        "gtensors": (5, "data_oneof"),
        "ndarray": (6, "data_oneof"),
        "gmap": (7, "data_oneof"),
    }
    tensor = _field_signature(grps_pb2.GenericTensor.DESCRIPTOR)
    assert {k: v[0] for k, v in tensor.items()} == {
        "name": 1, "dtype": 2, "shape": 3, "flat_uint8": 4, "flat_int8": 5, "flat_int16": 6,
        "flat_int32": 7, "flat_int64": 8, "flat_float16": 9, "flat_float32": 10,
        "flat_float64": 11, "flat_string": 12,
    }  # fmt: skip
    gmap = _field_signature(grps_pb2.GenericMapData.DESCRIPTOR)
    assert {k: v[0] for k, v in gmap.items()} == {
        "s_s": 1, "s_b": 2, "s_i32": 3, "s_i64": 4, "s_f": 5, "s_d": 6,
    }  # fmt: skip
    assert [(v.name, v.number) for v in grps_pb2.DataType.DESCRIPTOR.values] == [
        ("DT_INVALID", 0), ("DT_UINT8", 1), ("DT_INT8", 2), ("DT_INT16", 3), ("DT_INT32", 4),
        ("DT_INT64", 5), ("DT_FLOAT16", 6), ("DT_FLOAT32", 7), ("DT_FLOAT64", 8), ("DT_STRING", 9),
    ]  # fmt: skip
    status = _field_signature(grps_pb2.Status.DESCRIPTOR)
    assert {k: v[0] for k, v in status.items()} == {"code": 1, "msg": 2, "status": 3}
    assert [v.name for v in grps_pb2.Status.StatusFlag.DESCRIPTOR.values] == [
        "UNKNOWN", "SUCCESS", "FAILURE",
    ]  # fmt: skip
    # JSON form used by the HTTP interface.
    reply = grps_pb2.GrpsMessage(
        status=grps_pb2.Status(code=200, msg="OK", status=grps_pb2.Status.SUCCESS),
        str_data="hello grps",
    )
    assert json_format.MessageToDict(reply, preserving_proto_field_name=True) == {
        "status": {"code": 200, "msg": "OK", "status": "SUCCESS"},
        "str_data": "hello grps",
    }
    parsed = json_format.ParseDict(
        {"gtensors": {"tensors": [{"name": "in1", "dtype": "DT_INT32", "shape": [3, 2],
                                   "flat_int32": [1, 2, 3, 4, 5, 6]}]}},
        grps_pb2.GrpsMessage(),
    )  # fmt: skip
    assert parsed.WhichOneof("data_oneof") == "gtensors"
    assert list(parsed.gtensors.tensors[0].shape) == [3, 2]
