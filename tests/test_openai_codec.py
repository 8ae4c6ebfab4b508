"""The OpenAI codec and serve.yaml's ``openai:``: pure translation and checks, in process."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from pydantic import ValidationError

from servekit.codecs import openai as codec
from servekit.config.schema import ModelConfig
from servekit.types import InferResponse, Tensor, TensorSpec

HELLO = [{"role": "user", "content": "hello there"}]


def _param(call: object, body: object) -> str | None:
    with pytest.raises(codec.OpenAIInvalid) as caught:
        call(body)  # type: ignore[operator]
    return caught.value.param


def test_chat_requests_are_checked() -> None:
    decoded = codec.decode_chat({"model": "m", "messages": HELLO, "temperature": 0.5})
    assert decoded.texts == ['[{"role":"user","content":"hello there"}]']
    assert decoded.parameters == {"temperature": 0.5} and decoded.prompt_words == [2]
    bad = [{"role": "wizard", "content": "x"}]
    assert _param(codec.decode_chat, {"model": "m", "messages": bad}) == "messages.[0].role"
    assert _param(codec.decode_chat, {"model": "m", "messages": []}) == "messages"
    assert _param(codec.decode_chat, {"messages": HELLO}) == "model"
    assert _param(codec.decode_chat, {"model": "m", "messages": HELLO, "n": 1000}) == "n"
    assert _param(codec.decode_chat, {"model": "m", "messages": HELLO, "n": True}) == "n"
    options = {"model": "m", "messages": HELLO, "stream_options": {"include_usage": True}}
    assert _param(codec.decode_chat, options) == "stream_options"
    streamed = codec.decode_chat({**options, "stream": True})
    assert streamed.stream and streamed.include_usage
    no_content = [{"role": "user", "content": None}]
    assert _param(codec.decode_chat, {"model": "m", "messages": no_content}) == (
        "messages.[0].content"
    )
    parts = [{"role": "user", "content": [{"type": "text", "text": "a b c"}]}]
    assert codec.decode_chat({"model": "m", "messages": parts}).prompt_words == [3]


def test_fields_a_model_cannot_take_are_refused() -> None:
    decoded = codec.decode_chat({"model": "m", "messages": HELLO, "tools": [{"type": "x"}]})
    codec.refuse_unused(decoded, takes_parameters=True)  # passed through in parameters
    with pytest.raises(codec.OpenAIInvalid) as caught:
        codec.refuse_unused(decoded, takes_parameters=False)
    assert caught.value.param == "tools"
    fine = codec.decode_chat({"model": "m", "messages": HELLO, "n": 1, "user": "u", "seed": None})
    codec.refuse_unused(fine, takes_parameters=False)
    body = {"model": "m", "messages": HELLO, "logprobs": True}
    assert _param(codec.decode_chat, body) == "logprobs"


def test_completion_prompts() -> None:
    decoded = codec.decode_completion({"model": "m", "prompt": ["a b", "c"]})
    assert decoded.texts == ["a b", "c"] and decoded.prompt_words == [2, 1]
    assert _param(codec.decode_completion, {"model": "m", "prompt": [1, 2]}) == "prompt"
    assert _param(codec.decode_completion, {"model": "m"}) == "prompt"


def test_text_request_tensors_fit_the_declared_shape() -> None:
    decoded = codec.decode_completion({"model": "m", "prompt": "hi", "max_tokens": 3})
    specs = (TensorSpec("text_input", "BYTES", (-1, 1)), TensorSpec("parameters", "BYTES", (1,)))
    request = codec.text_request(decoded, "hi", specs, takes_parameters=True)
    prompt, parameters = request.inputs
    assert prompt.shape == (1, 1) and prompt.data.reshape(-1)[0] == b"hi"
    assert parameters.data.reshape(-1)[0] == b'{"max_tokens":3}'


def test_choices_and_answers() -> None:
    response = InferResponse("m", "1", [Tensor("text_output", "BYTES", (2,),
                                               np.array([b"x", b"y"], dtype=object))])  # fmt: skip
    assert codec.choices_of(response, 2) == ["x", "y"]
    assert codec.choices_of(response, 1) == ["xy"]
    reply = codec.Reply("chat", "m")
    answer = codec.answer(reply, ["one two"], 4)
    assert answer["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    assert answer["id"].startswith("chatcmpl-") and answer["object"] == "chat.completion"
    first = codec.chunk(reply, 0, "", first=True)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_embeddings_float_base64_and_dimensions() -> None:
    decoded = codec.decode_embeddings({"model": "m", "input": "x", "encoding_format": "base64"})
    assert decoded.encoding_format == "base64" and decoded.texts == ["x"]
    assert _param(codec.decode_embeddings, {"model": "m", "input": ""}) == "input"
    assert _param(codec.decode_embeddings, {"model": "m", "input": "x", "dimensions": 0}) == (
        "dimensions"
    )
    assert _param(codec.decode_embeddings, {"model": "m", "input": "x", "foo": 1}) == "foo"
    rows = np.arange(8, dtype=np.float32).reshape(2, 4) + 1
    response = InferResponse("m", "1", [Tensor("embedding", "FP32", (2, 4), rows)])
    assert codec.embeddings_of(response, 2, None, ()).shape == (2, 4)
    cut = codec.embeddings_of(response, 2, 2, (2,))
    np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1.0, rtol=1e-6)
    with pytest.raises(codec.OpenAIInvalid):
        codec.embeddings_of(response, 2, 3, (2,))
    answer = codec.embeddings_answer("m", rows, "base64", 2)
    decoded_row = np.frombuffer(base64.b64decode(answer["data"][1]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded_row, rows[1])
    assert codec.embeddings_answer("m", rows, "float", 2)["data"][0]["embedding"] == [1, 2, 3, 4]


def test_error_body() -> None:
    assert codec.error_body(404, "gone", "model", "model_not_found") == {
        "error": {"message": "gone", "type": "invalid_request_error", "param": "model",
                  "code": "model_not_found"}
    }  # fmt: skip
    assert codec.error_body(503, "busy")["error"]["type"] == "server_error"


def _python_model(openai: object, inputs: list[dict[str, object]], output: str) -> ModelConfig:
    return ModelConfig.model_validate(
        {
            "name": "m",
            "modelFormat": {"name": "python"},
            "entrypoint": "mod:fn",
            "openai": openai,
            "inputs": inputs,
            "outputs": [{"name": output, "datatype": "BYTES", "shape": [-1]}],
        }
    )


def test_serve_yaml_openai_field() -> None:
    chat = [
        {"name": "messages", "datatype": "BYTES", "shape": [1]},
        {"name": "parameters", "datatype": "BYTES", "shape": [1], "optional": True},
    ]
    made = _python_model("chat", chat, "text_output")
    assert made.openai is not None and made.openai.kind == "chat"
    assert made.openai.max_input_bytes == 1024 * 1024
    with pytest.raises(ValidationError, match="needs an input 'text_input'"):
        _python_model({"kind": "completion"}, chat, "text_output")
    with pytest.raises(ValidationError, match="'parameters' must be optional"):
        _python_model("chat", [{**chat[0]}, {**chat[1], "optional": False}], "text_output")
    with pytest.raises(ValidationError, match="needs an output 'text_output'"):
        _python_model("chat", chat, "answer")
    with pytest.raises(ValidationError, match="dimensions applies to kind: embedding"):
        _python_model({"kind": "chat", "dimensions": [8]}, chat, "text_output")
    with pytest.raises(ValidationError):
        _python_model({"kind": "speech"}, chat, "text_output")
    # an ONNX model's lists are overrides: checked once it has loaded, not here
    onnx = ModelConfig.model_validate(
        {
            "name": "e",
            "modelFormat": {"name": "onnx"},
            "storageUri": "e.onnx",
            "openai": "embedding",
        }
    )
    assert onnx.openai is not None and onnx.openai.kind == "embedding"


def test_loaded_signature_is_checked() -> None:
    inputs = (TensorSpec("text_input", "BYTES", (-1,)),)
    codec.check_model("embedding", "e", inputs, (TensorSpec("embedding", "FP32", (-1, 4)),))
    with pytest.raises(codec.OpenAIInvalid, match="needs an output 'embedding'"):
        codec.check_model("embedding", "e", inputs, (TensorSpec("out", "FP32", (-1, 4)),))


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", 2.1), ("temperature", -0.1), ("top_p", 1.1), ("frequency_penalty", 3),
     ("presence_penalty", -2.1), ("max_tokens", 0), ("max_tokens", 1.5), ("seed", "x"),
     ("stop", ["a", "b", "c", "d", "e"]), ("stop", 3), ("temperature", True)],
)  # fmt: skip
def test_sampling_fields_are_bounded(field: str, value: object) -> None:
    body = {"model": "m", "prompt": "p", field: value}
    assert _param(codec.decode_completion, body) == field
    chat = {"model": "m", "messages": HELLO, field: value}
    assert _param(codec.decode_chat, chat) == field


def test_finish_reason_counts_chunks_or_words() -> None:
    """A choice finishes with "length" once it reaches the request's limit, counted in the
    model's chunks (a generator's yields) or its words, whichever is more; no limit: "stop"."""
    decoded = codec.decode_chat(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 9,
         "max_completion_tokens": 4}
    )  # fmt: skip
    assert decoded.max_tokens == 4  # the smaller of the two
    assert codec.decode_completion({"model": "m", "prompt": "x"}).max_tokens is None
    assert codec.finish_reason("abcd", 4, 4) == "length"  # four yields of one letter
    assert codec.finish_reason("abc", 3, 4) == "stop"
    assert codec.finish_reason("one two three four", 1, 4) == "length"  # answered once
    assert codec.finish_reason("one two three", 1, 4) == "stop"
    assert codec.finish_reason("a b c d e f", 6, None) == "stop"
    reply = codec.Reply("completion", "m")
    made = codec.answer(reply, ["ab", "c"], 1, None, ["length", "stop"])
    assert [c["finish_reason"] for c in made["choices"]] == ["length", "stop"]


def test_routing_errors_under_the_prefix() -> None:
    assert codec.under_prefix("/openai/v1") and codec.under_prefix("/openai/v1/files")
    assert not codec.under_prefix("/openai/v10/files") and not codec.under_prefix("/v2/x")
    missing = codec.routing_error(404, "GET", "/openai/v1/files", None)["error"]
    assert missing == {"message": "Invalid URL (GET /openai/v1/files)",
                       "type": "invalid_request_error", "param": None, "code": None}  # fmt: skip
    long = codec.routing_error(404, "GET", "/openai/v1/" + "x" * 5000, None)["error"]
    assert len(long["message"]) < 300
    wrong = codec.routing_error(405, "GET", "/openai/v1/embeddings", "OPTIONS, POST")["error"]
    assert wrong["message"].endswith("it takes OPTIONS, POST")
