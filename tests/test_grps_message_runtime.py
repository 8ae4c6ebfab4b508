"""app/servekit/runtimes/python.py's models that take whole GrpsMessages, on their own (no
server)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from servekit.codecs.grps_message import CODEC
from servekit.errors import Internal, InvalidArgument
from servekit.protos.grps_pb2 import GrpsMessage
from servekit.runtimes.python import MESSAGE_SIGNATURE, GrpsMessageModel, takes_grps_message
from servekit.types import GRPS_MESSAGE


def hinted(message: GrpsMessage) -> GrpsMessage:
    return message


def as_text(message: "GrpsMessage") -> str:  # noqa: UP037 (a string annotation on purpose)
    return message.str_data.upper()


def plain(x: Any) -> Any:
    return x


def two(message: GrpsMessage, other: GrpsMessage) -> None:
    return None


def test_the_hint_asks_for_whole_messages() -> None:
    assert takes_grps_message(hinted) and takes_grps_message(as_text)
    assert not takes_grps_message(plain) and not takes_grps_message(two)


def _call(model: object, message: GrpsMessage) -> GrpsMessage:
    runtime = GrpsMessageModel([model], MESSAGE_SIGNATURE, CODEC)
    inputs = {GRPS_MESSAGE: np.array([message.SerializeToString()], dtype=object)}
    out = runtime.predict(inputs, [GRPS_MESSAGE])
    return GrpsMessage.FromString(out[GRPS_MESSAGE].reshape(-1)[0])


def test_replies_of_every_allowed_type() -> None:
    assert _call(hinted, GrpsMessage(bin_data=b"\x00")).bin_data == b"\x00"
    assert _call(as_text, GrpsMessage(str_data="hi")).str_data == "HI"
    assert _call(lambda m: b"raw", GrpsMessage()).bin_data == b"raw"
    with pytest.raises(Internal, match="returns a GrpsMessage"):
        _call(lambda m: 42, GrpsMessage())


def test_an_input_that_is_no_message_is_refused() -> None:
    runtime = GrpsMessageModel([hinted], MESSAGE_SIGNATURE, CODEC)
    with pytest.raises(InvalidArgument, match="not a serialized GrpsMessage"):
        runtime.predict({GRPS_MESSAGE: np.array([b"\xff\xff\xff"], dtype=object)}, [GRPS_MESSAGE])
