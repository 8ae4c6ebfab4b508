"""A whole GrpsMessage for a Python model that takes one (``predict(message) -> message``).

The runtime (app/servekit/runtimes/python.py) holds the message serialized and asks this codec
to turn it into the ``GrpsMessage`` the model's code receives, and the model's answer back
into bytes: the runtime itself imports no protocol module.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from servekit.errors import Internal, InvalidArgument
from servekit.protos import grps_pb2
from servekit.types import GRPS_MESSAGE


class GrpsMessageCodec:
    """``servekit.runtimes.python.MessageCodec`` for grps."""

    def parse(self, raw: bytes) -> object:
        try:
            return grps_pb2.GrpsMessage.FromString(raw)
        except DecodeError:
            raise InvalidArgument(f"{GRPS_MESSAGE} is not a serialized GrpsMessage") from None

    def reply(self, result: object) -> bytes:
        message: bytes = as_message(result).SerializeToString()
        return message


def as_message(result: object) -> grps_pb2.GrpsMessage:
    """A model's answer as a GrpsMessage: a GrpsMessage (ours or grps' own class), a str
    (``str_data``) or bytes (``bin_data``)."""
    if isinstance(result, str):
        return grps_pb2.GrpsMessage(str_data=result)
    if isinstance(result, bytes):
        return grps_pb2.GrpsMessage(bin_data=result)
    serialize = getattr(result, "SerializeToString", None)  # also grps' own GrpsMessage class
    if type(result).__name__ == "GrpsMessage" and callable(serialize):
        if isinstance(result, grps_pb2.GrpsMessage):
            return result
        converted = grps_pb2.GrpsMessage()
        converted.ParseFromString(serialize())
        return converted
    raise Internal(
        f"the model returned {type(result).__name__}; a model that takes GrpsMessages returns "
        "a GrpsMessage, a str (str_data) or bytes (bin_data)"
    )


CODEC = GrpsMessageCodec()
