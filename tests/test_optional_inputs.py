"""Optional inputs (serve.yaml ``optional: true``, Triton's ModelInput.optional), in process.

A request may leave an optional input out; a required one still may not. The model receives
only what was sent, and the metadata and both forms of the model configuration say which
inputs are optional.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from inprocess import Serve

from servekit.errors import InvalidArgument
from servekit.grpc.triton_proto import model_config_message
from servekit.rest.triton_json import model_config_json
from servekit.types import InferRequest, Tensor

pytestmark = pytest.mark.anyio

MODULE = """
import numpy as np


def received(text_input, stream=None, temperature=None):
    sent = [name for name, value in (("stream", stream), ("temperature", temperature))
            if value is not None]
    return {"sent": np.array([",".join(["text_input", *sent]).encode()], dtype=object)}
"""

CONFIG = """
models:
  - name: picky
    modelFormat: {name: python}
    entrypoint: "optional_models:received"
    inputs:
      - {name: text_input, datatype: BYTES, shape: [1]}
      - {name: stream, datatype: BOOL, shape: [1], optional: true}
      - {name: temperature, datatype: FP32, shape: [1], optional: true}
    outputs:
      - {name: sent, datatype: BYTES, shape: [1]}
"""


async def start(serve: Serve, tmp_path: Path) -> Serve:
    (tmp_path / "optional_models.py").write_text(MODULE)
    return await serve(CONFIG)  # type: ignore[no-any-return]


def text(value: str) -> Tensor:
    return Tensor("text_input", "BYTES", (1,), np.array([value.encode()], dtype=object))


async def sent(services: object, inputs: list[Tensor]) -> str:
    response = await services.dataplane.infer(InferRequest("picky", inputs))  # type: ignore[attr-defined]
    (output,) = response.outputs
    return str(output.data[0].decode())


async def test_a_request_may_leave_optional_inputs_out(serve: Serve, tmp_path: Path) -> None:
    services = await start(serve, tmp_path)
    assert await sent(services, [text("hi")]) == "text_input"
    stream = Tensor("stream", "BOOL", (1,), np.array([True]))
    assert await sent(services, [text("hi"), stream]) == "text_input,stream"
    temperature = Tensor("temperature", "FP32", (1,), np.array([0.5], dtype=np.float32))
    assert await sent(services, [temperature, text("x")]) == "text_input,temperature"


async def test_a_required_input_is_still_required(serve: Serve, tmp_path: Path) -> None:
    services = await start(serve, tmp_path)
    stream = Tensor("stream", "BOOL", (1,), np.array([True]))
    with pytest.raises(InvalidArgument, match=r"needs input\(s\) text_input$"):
        await services.dataplane.infer(InferRequest("picky", [stream]))


async def test_metadata_and_config_show_optional_inputs(serve: Serve, tmp_path: Path) -> None:
    services = await start(serve, tmp_path)
    metadata = services.dataplane.model_metadata("picky").as_dict()
    assert [i.get("optional", False) for i in metadata["inputs"]] == [False, True, True]
    assert "optional" not in metadata["outputs"][0]
    config = services.dataplane.model_config("picky")
    as_json = model_config_json(config)
    assert [i.get("optional", False) for i in as_json["input"]] == [False, True, True]
    message = model_config_message(config)
    assert [i.optional for i in message.input] == [False, True, True]


def test_optional_belongs_to_inputs() -> None:
    from servekit.config.loader import ConfigError, parse_config

    with pytest.raises(ConfigError, match=r"serve.yaml:2: .*optional belongs to inputs"):
        parse_config(
            "models:\n  - name: m\n    modelFormat: {name: python}\n    entrypoint: 'a:b'\n"
            "    outputs: [{name: y, optional: true}]\n"
        )
