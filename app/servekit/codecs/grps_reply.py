"""grps replies as protobuf: status, outputs back into a ``GrpsMessage``, a whole message as a
model's request, and the metadata YAML texts grps answers with.

The decoding half is :mod:`servekit.codecs.grps`; what runs a request (select the model, decode,
infer) is :mod:`servekit.services.grps`. Outputs answer in the kind of the request where they fit;
bytes that are not UTF-8 cannot be a grps string and UINT64 values past 2**63 cannot be a
DT_INT64, so those fail with a clear message instead of being mangled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import yaml
from numpy.typing import NDArray

from servekit.codecs.grps import CARRIER, KINDS, decode_request, request_kind
from servekit.datatypes import as_bytes_array
from servekit.errors import Internal, InvalidArgument, Unimplemented
from servekit.protos import grps_pb2 as pb
from servekit.results import IndexRow, ServerMetadata
from servekit.types import (
    GRPS_MESSAGE,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ModelSignature,
    Tensor,
)

GrpsMessage = pb.GrpsMessage
"""The message type the grps surfaces take and answer (for annotations outside the codecs)."""

GMAP_OF: dict[pb.DataType, str] = {
    pb.DT_UINT8: "s_i32",
    pb.DT_INT8: "s_i32",
    pb.DT_INT16: "s_i32",
    pb.DT_INT32: "s_i32",
    pb.DT_INT64: "s_i64",
    pb.DT_FLOAT16: "s_f",
    pb.DT_FLOAT32: "s_f",
    pb.DT_FLOAT64: "s_d",
}
"""grps dtype -> the gmap field a one-element output of that dtype goes in."""
_INT64_MAX = int(np.iinfo(np.int64).max)


def status(code: int = 200, msg: str = "OK") -> pb.Status:
    """A grps status; codes of 400 and above are FAILURE."""
    flag = pb.Status.FAILURE if code >= 400 else pb.Status.SUCCESS
    return pb.Status(code=code, msg=msg, status=flag)


def ok(**fields: Any) -> pb.GrpsMessage:
    return pb.GrpsMessage(status=status(), **fields)


def readiness(why: str | None) -> pb.GrpsMessage:
    """SUCCESS when ready (``why`` None); FAILURE with code 503 and the reason otherwise."""
    if why is None:
        return ok()
    return pb.GrpsMessage(status=status(503, f"not ready: {why}"))


def decode_call(
    message: pb.GrpsMessage,
    name: str,
    version: str | None,
    signature: ModelSignature,
    ndarray: object = None,
) -> tuple[str, InferRequest]:
    """The request a grps message makes of model ``name`` and the kind of its data (the reply
    answers in that kind): the whole message for a model that takes messages, else its
    tensors decoded against the model's inputs."""
    if signature.grps_message:
        return WHOLE, whole_message(message, name, version, ndarray)
    kind = request_kind(message, ndarray)
    return kind, decode_request(message, name, version, signature.inputs, ndarray)


WHOLE = "message"
"""The kind of a request to a model that takes whole messages (the reply is the model's)."""


def whole_message(
    message: pb.GrpsMessage, name: str, version: str | None, ndarray: object
) -> InferRequest:
    """The request to a model that takes whole GrpsMessages: the message, serialized, as its
    one BYTES element (an HTTP ``ndarray`` becomes a FP32 gtensor of the message first)."""
    if ndarray is not None:
        try:
            array = np.asarray(ndarray, dtype=np.float32)
        except (TypeError, ValueError):
            raise InvalidArgument("ndarray must be a rectangular array of numbers") from None
        tensor = Tensor("ndarray", "FP32", tuple(array.shape), array)
        message.gtensors.tensors.append(gtensor(tensor))
    message.ClearField("model")
    data = np.array([message.SerializeToString()], dtype=object)
    tensor = Tensor(GRPS_MESSAGE, "BYTES", (1,), data)
    return InferRequest(model_name=name, model_version=version, inputs=[tensor])


def _reply_of(response: InferResponse) -> pb.GrpsMessage:
    """The GrpsMessage a whole-message model answered, with an OK status unless it set one."""
    raw: bytes = as_bytes_array(response.outputs[0].data).reshape(-1)[0]
    reply = pb.GrpsMessage()
    reply.ParseFromString(raw)
    if not reply.HasField("status"):
        reply.status.CopyFrom(status())
    if not reply.model:
        reply.model = f"{response.model_name}-{response.model_version}"
    return reply


def encode_response(response: InferResponse, kind: str) -> pb.GrpsMessage:
    """The reply to a request of ``kind``, in that kind where the outputs fit it."""
    if kind == WHOLE:
        return _reply_of(response)
    message = ok(model=f"{response.model_name}-{response.model_version}")
    outputs = response.outputs
    if kind in ("str_data", "bin_data") and len(outputs) == 1 and _is_one_bytes(outputs[0]):
        value: bytes = as_bytes_array(outputs[0].data).reshape(-1)[0]
        if kind == "str_data":
            try:
                message.str_data = value.decode()
                return message
            except UnicodeDecodeError:
                pass  # not text after all: answer the bytes as they are
        message.bin_data = value
    elif kind == "gmap" and outputs and all(t.data.size == 1 for t in outputs):
        for tensor in outputs:
            _to_gmap(message.gmap, tensor)
    else:
        message.gtensors.tensors.extend(gtensor(t) for t in outputs)
    return message


def _is_one_bytes(tensor: Tensor) -> bool:
    return tensor.datatype == "BYTES" and tensor.data.size == 1


def gtensor(tensor: Tensor) -> pb.GenericTensor:
    """One output as a GenericTensor in the grps dtype that carries its datatype."""
    dtype = CARRIER[tensor.datatype]
    kind = KINDS[dtype]
    message = pb.GenericTensor(name=tensor.name, dtype=dtype, shape=tensor.shape)
    flat = tensor.data.reshape(-1)
    values: list[Any]
    if kind.wire is None:
        values = [_text(tensor.name, item) for item in as_bytes_array(flat)]
    else:
        _check_int64(tensor, flat)
        values = flat.astype(kind.wire).tolist()
    getattr(message, kind.field).extend(values)
    return message


def _text(name: str, value: bytes) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise Unimplemented(
            f"output {name!r} holds bytes that are not UTF-8, which a grps DT_STRING cannot "
            "carry; use a model with one BYTES output (answered as bin_data) or the V2 protocol"
        ) from None


def _check_int64(tensor: Tensor, flat: NDArray[Any]) -> None:
    if tensor.datatype == "UINT64" and flat.size and int(flat.max()) > _INT64_MAX:
        raise Unimplemented(
            f"output {tensor.name!r}: UINT64 value {int(flat.max())} does not fit grps' "
            "DT_INT64; use the V2 protocol"
        )


def _to_gmap(gmap: pb.GenericMapData, tensor: Tensor) -> None:
    if tensor.datatype == "BYTES":
        value: bytes = as_bytes_array(tensor.data).reshape(-1)[0]
        try:
            gmap.s_s[tensor.name] = value.decode()
        except UnicodeDecodeError:
            gmap.s_b[tensor.name] = value
        return
    flat = tensor.data.reshape(-1)
    _check_int64(tensor, flat)
    field = GMAP_OF[CARRIER[tensor.datatype]]
    item = flat[0].item()
    getattr(gmap, field)[tensor.name] = item if field in ("s_f", "s_d") else int(item)


def ndarray_output(response: InferResponse) -> NDArray[Any]:
    """The single numeric output, for HTTP ``?return-ndarray=true`` (from a whole-message
    model: its reply's one gtensor)."""
    if response.outputs and response.outputs[0].name == GRPS_MESSAGE:
        tensors = _reply_of(response).gtensors.tensors
        if len(tensors) != 1 or KINDS[tensors[0].dtype].wire is None:
            raise Internal(  # as grps: the model's reply, not the request, is at fault
                "return-ndarray needs a reply with one numeric gtensor; the model answered "
                f"{_reply_of(response).WhichOneof('data_oneof') or 'no data'}"
            )
        flat = getattr(tensors[0], KINDS[tensors[0].dtype].field)
        return np.asarray(flat).reshape(tuple(tensors[0].shape))
    outputs = response.outputs
    if len(outputs) != 1 or outputs[0].datatype == "BYTES":
        names = ", ".join(f"{t.name} ({t.datatype})" for t in outputs)
        raise InvalidArgument(f"return-ndarray needs one numeric output; the model gives {names}")
    return outputs[0].data


# -- metadata (YAML text in str_data, as grps answers it) ---------------------------------------
def server_metadata_text(
    meta: ServerMetadata,
    *,
    live: bool,
    ready: bool,
    online: bool,
    default_model: str | None,
    models: Sequence[IndexRow],
) -> str:
    text: dict[str, Any] = {
        **meta.as_dict(),
        "live": live,
        "ready": ready,
        "online": online,
        "default_model": default_model,
        "models": [row.as_dict() for row in models],
    }
    return str(yaml.safe_dump(text, sort_keys=False))


def model_metadata_text(meta: ModelMetadata) -> str:
    return str(yaml.safe_dump(meta.as_dict(), sort_keys=False))
