"""Triton's OpenAI frontend client cases, run against servekit.

The cases of triton-inference-server/server ``python/openai/tests/test_openai_client.py`` and
``test_embeddings.py`` (read at 2.73.0, 26.09), written again here: the same requests and the
same assertions, against a real ``servekit serve``. What had to change besides starting the
server:

- Triton serves one LLM (vLLM or TensorRT-LLM) for both chat and completions; a servekit model
  has one ``openai.kind``, so the ``model`` fixture is two: ``chat_model`` and
  ``completion_model``, both the example's character-level generator (examples/openai), which
  honours ``seed``, ``temperature`` (0: greedy), ``max_tokens`` / ``max_completion_tokens`` and
  ``stop`` as an LLM does. ``test_openai_client_models`` counts servekit's models, not an
  LLM backend's.
- Triton's embeddings model is vLLM's all-MiniLM-L6-v2 (weights from a hub, outputs compared
  with numbers measured on a GPU); here it is the example's ONNX embedder, compared with
  onnxruntime run on the same file.
- Triton answers a body that fails its pydantic schema with FastAPI's 422 and ``detail``;
  servekit answers 400 with OpenAI's error object, as OpenAI's API does, so those cases
  assert 400 and the error's ``param``. An unknown model is 404 ``model_not_found`` (OpenAI's
  answer; Triton says 400).

Cases that cannot apply, and why:

- ``test_chat_completion_logprobs``, ``test_completion_logprobs``: only their non-vLLM branch
  applies (servekit returns no log probabilities): a 400, with servekit's message.
- ``test_top_logprobs_requires_logprobs``: Triton skips it for every backend but vLLM.
- ``test_chat_top_logprobs_exceeds_max``, ``test_completion_logprobs_exceeds_max``: they check
  FastAPI's 422 for ``top_logprobs`` > 20 / ``logprobs`` > 5; servekit refuses any log
  probabilities with 400 (checked below with those values).
- ``test_openai_client_function_calling``: marked "Not Implemented Yet" in Triton.
- ``test_embeddings_defaults`` with token IDs as input: servekit hands the model text and
  refuses token IDs with 400 (there is no tokenizer on the server).

From ``test_completions.py`` (Triton runs it in process with FastAPI's TestClient; here over
HTTP): ``test_completions_temperature_vllm`` and ``_tensorrtllm`` compare an LLM's outputs at
two temperatures through its backend and cannot apply; the ``min_tokens`` and ``ignore_eos``
cases of ``test_completions_invalid_sampling_parameters`` check extensions of Triton's schema,
which servekit hands to the model unchecked; ``test_completions_empty_prompt`` expects 400 for
``prompt: ""``, which OpenAI's API and servekit accept; ``test_completions_multiple_choices``
expects 400 for ``n: 2`` (Triton answers one choice), servekit answers two (its ``best_of``
cases are refused as in Triton); ``test_completions_logprobs*``: see above; ``test_lora`` and
``test_multi_lora`` are skipped in Triton ("Not Implemented Yet"). ``test_chat_completions.py``
is not ported: its cases need an LLM with a tokenizer's chat template (Llama 3.1 from a hub)
and check Triton's own FastAPI schema answers (422) and tool-call parsers.
"""

from __future__ import annotations

import base64
import importlib.util
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import openai
import pytest
from loops import run_in_own_loop
from servers import ServerProcess, start_server

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "openai"
PROMPT = "What is machine learning?"
MESSAGES = [{"role": "user", "content": PROMPT}]
EMBEDDING_INPUT = "The food was delicious and the waiter..."


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("triton_cases")
    shutil.copy(EXAMPLE / "chargen.py", root / "chargen.py")
    shutil.copy(EXAMPLE / "serve.yaml", root / "serve.yaml")
    spec = importlib.util.spec_from_file_location("build_embedder", EXAMPLE / "build_embedder.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(root / "models")
    return root


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[ServerProcess]:
    process = start_server(folder / "serve.yaml", grpc=False)
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{server.http_url}/openai/v1", api_key="EMPTY", max_retries=0, timeout=30
    ) as made:
        yield made


def run_async(server: ServerProcess, body: Any) -> Any:
    """``body(client)`` with an ``openai.AsyncOpenAI`` on the server, on a loop of its own."""

    async def main() -> Any:
        async with openai.AsyncOpenAI(
            base_url=f"{server.http_url}/openai/v1", api_key="EMPTY", max_retries=0, timeout=30
        ) as aclient:
            return await body(aclient)

    return run_in_own_loop(main)


CHAT_MODEL = "chargen-chat"
COMPLETION_MODEL = "chargen"


def _usage_ok(usage: Any) -> None:
    assert usage is not None
    assert isinstance(usage.prompt_tokens, int)
    assert isinstance(usage.completion_tokens, int)
    assert isinstance(usage.total_tokens, int)
    assert usage.prompt_tokens > 0
    assert usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


# -- TestOpenAIClient ---------------------------------------------------------------------------
def test_openai_client_models(client: openai.OpenAI) -> None:
    models = list(client.models.list())
    assert len(models) == 3  # chargen, chargen-chat, embedder


def test_openai_client_completion(client: openai.OpenAI) -> None:
    completion = client.completions.create(prompt=PROMPT, model=COMPLETION_MODEL)
    assert completion.choices[0].text
    assert completion.choices[0].finish_reason == "stop"
    _usage_ok(completion.usage)


def test_openai_client_chat_completion(client: openai.OpenAI) -> None:
    chat_completion = client.chat.completions.create(messages=MESSAGES, model=CHAT_MODEL)
    assert chat_completion.choices[0].message.content
    assert chat_completion.choices[0].finish_reason == "stop"
    _usage_ok(chat_completion.usage)


@pytest.mark.parametrize("echo", [False, True])
def test_openai_client_completion_echo(client: openai.OpenAI, echo: bool) -> None:
    completion = client.completions.create(prompt=PROMPT, model=COMPLETION_MODEL, echo=echo)
    response = completion.choices[0].text
    if echo:
        assert response.startswith(PROMPT)
    else:
        assert PROMPT not in response


# -- TestAsyncOpenAIClient ----------------------------------------------------------------------
def test_async_openai_client_models(server: ServerProcess) -> None:
    async def body(aclient: openai.AsyncOpenAI) -> list[Any]:
        return [model async for model in await aclient.models.list()]

    assert len(run_async(server, body)) == 3


def test_async_openai_client_completion(server: ServerProcess) -> None:
    async def body(aclient: openai.AsyncOpenAI) -> Any:
        return await aclient.completions.create(prompt=PROMPT, model=COMPLETION_MODEL)

    completion = run_async(server, body)
    assert completion.choices[0].text
    assert completion.choices[0].finish_reason == "stop"
    _usage_ok(completion.usage)


def test_async_openai_client_chat_completion(server: ServerProcess) -> None:
    async def body(aclient: openai.AsyncOpenAI) -> Any:
        return await aclient.chat.completions.create(messages=MESSAGES, model=CHAT_MODEL)

    chat_completion = run_async(server, body)
    assert chat_completion.choices[0].message.content
    assert chat_completion.choices[0].finish_reason == "stop"
    _usage_ok(chat_completion.usage)


def test_completion_streaming(server: ServerProcess) -> None:
    async def body(aclient: openai.AsyncOpenAI) -> None:
        settings: dict[str, Any] = {"max_tokens": 10, "temperature": 0.0, "seed": 0}
        single = await aclient.completions.create(
            model=COMPLETION_MODEL, prompt=PROMPT, stream=False, **settings
        )
        output = single.choices[0].text
        stop_reason = single.choices[0].finish_reason
        stream = await aclient.completions.create(
            model=COMPLETION_MODEL, prompt=PROMPT, stream=True, **settings
        )
        chunks = []
        finish_reason_count = 0
        async for chunk in stream:
            delta = chunk.choices[0]
            if delta.text:
                chunks.append(delta.text)
            if delta.finish_reason is not None:
                finish_reason_count += 1
        assert finish_reason_count == 1  # finish reason only in the last chunk
        assert chunk.choices[0].finish_reason == stop_reason
        assert "".join(chunks) == output

    run_async(server, body)


@pytest.mark.parametrize(
    "sampling_parameter_dict",
    [{}, {"stop": "is"}, {"stop": ["is"]}, {"stop": ["is", ".", ","]}],
)
def test_chat_streaming(server: ServerProcess, sampling_parameter_dict: dict[str, Any]) -> None:
    async def body(aclient: openai.AsyncOpenAI) -> None:
        settings: dict[str, Any] = {
            "max_completion_tokens": 64,
            "temperature": 0.0,
            "seed": 0,
            **sampling_parameter_dict,
        }
        single = await aclient.chat.completions.create(
            model=CHAT_MODEL, messages=MESSAGES, stream=False, **settings
        )
        output = single.choices[0].message.content
        stop_reason = single.choices[0].finish_reason
        stream = await aclient.chat.completions.create(
            model=CHAT_MODEL, messages=MESSAGES, stream=True, **settings
        )
        chunks = []
        finish_reason_count = 0
        async for chunk in stream:
            delta = chunk.choices[0].delta
            if delta.role:
                assert delta.role == "assistant"
            if delta.content:
                chunks.append(delta.content)
            if chunk.choices[0].finish_reason is not None:
                finish_reason_count += 1
            assert chunk.usage is None
        assert finish_reason_count == 1
        assert chunk.choices[0].finish_reason == stop_reason
        assert len(chunks) > 1  # streamed, and equal to the answer in one piece
        assert "".join(chunks) == output

    run_async(server, body)


def _streaming_usage_option(server: ServerProcess, chat: bool) -> None:
    def text(chunk: Any) -> str:
        if not chunk.choices:
            return ""
        return (chunk.choices[0].delta.content if chat else chunk.choices[0].text) or ""

    async def body(aclient: openai.AsyncOpenAI) -> None:
        settings: dict[str, Any] = {"max_tokens": 16, "temperature": 0.0, "seed": 0}
        if chat:
            create: Any = aclient.chat.completions.create
            settings |= {"model": CHAT_MODEL, "messages": MESSAGES}
        else:
            create = aclient.completions.create
            settings |= {"model": COMPLETION_MODEL, "prompt": PROMPT}
        stream_false = await create(stream=False, **settings)
        usage_stream_false = stream_false.usage
        if chat:
            stream_false_output = stream_false.choices[0].message.content
        else:
            stream_false_output = stream_false.choices[0].text
        assert usage_stream_false is not None and stream_false_output is not None

        options_false = await create(
            stream=True, stream_options={"include_usage": False}, **settings
        )
        chunks_false = [chunk async for chunk in options_false]
        assert all(chunk.usage is None for chunk in chunks_false)
        output_false = "".join(text(c) for c in chunks_false)

        options_true = await create(stream=True, stream_options={"include_usage": True}, **settings)
        chunks_true = [chunk async for chunk in options_true]
        content_chunks = [c for c in chunks_true if c.usage is None]
        assert len(chunks_true) == len(chunks_false) + 1  # exactly one extra chunk
        output_true = "".join(text(c) for c in content_chunks)
        assert output_true == stream_false_output == output_false
        final_chunk = chunks_true[-1]
        assert final_chunk.usage is not None and len(final_chunk.choices) == 0
        _usage_ok(final_chunk.usage)
        assert all(chunk.usage is None for chunk in chunks_true[:-1])
        assert usage_stream_false.model_dump() == final_chunk.usage.model_dump()

    run_async(server, body)


def test_chat_streaming_usage_option(server: ServerProcess) -> None:
    _streaming_usage_option(server, chat=True)


def test_completion_streaming_usage_option(server: ServerProcess) -> None:
    _streaming_usage_option(server, chat=False)


def test_stream_options_without_streaming(server: ServerProcess) -> None:
    async def body(aclient: openai.AsyncOpenAI) -> None:
        with pytest.raises(openai.BadRequestError) as e:
            await aclient.completions.create(
                model=COMPLETION_MODEL,
                prompt=PROMPT,
                stream=False,
                stream_options={"include_usage": True},
            )
        assert "`stream_options` can only be used when `stream` is True" in str(e.value)
        with pytest.raises(openai.BadRequestError) as e:
            await aclient.chat.completions.create(
                model=CHAT_MODEL,
                messages=MESSAGES,
                stream=False,
                stream_options={"include_usage": True},
            )
        assert "`stream_options` can only be used when `stream` is True" in str(e.value)

    run_async(server, body)


@pytest.mark.parametrize("top_logprobs", [2, 25])  # 25: Triton's "exceeds max" case
def test_chat_completion_logprobs(server: ServerProcess, top_logprobs: int) -> None:
    async def body(aclient: openai.AsyncOpenAI) -> None:
        with pytest.raises(openai.BadRequestError) as exc_info:
            await aclient.chat.completions.create(
                model=CHAT_MODEL,
                messages=MESSAGES,
                logprobs=True,
                top_logprobs=top_logprobs,
                max_tokens=10,
            )
        assert "log probabilities" in str(exc_info.value)

    run_async(server, body)


@pytest.mark.parametrize("logprobs", [3, 7])  # 7: Triton's "exceeds max" case
def test_completion_logprobs(server: ServerProcess, logprobs: int) -> None:
    async def body(aclient: openai.AsyncOpenAI) -> None:
        with pytest.raises(openai.BadRequestError) as exc_info:
            await aclient.completions.create(
                model=COMPLETION_MODEL, prompt=PROMPT, logprobs=logprobs, max_tokens=10
            )
        assert "log probabilities" in str(exc_info.value)

    run_async(server, body)


# -- TestCompletions (test_completions.py) ------------------------------------------------------
@pytest.fixture
def raw(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.http_client(timeout=30) as made:
        yield made


def _complete(raw: httpx.Client, **fields: Any) -> httpx.Response:
    return raw.post("/openai/v1/completions", json={"model": COMPLETION_MODEL, **fields})


def test_completions_defaults(raw: httpx.Client) -> None:
    answer = _complete(raw, prompt=PROMPT)
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["text"].strip()
    assert answer.json().get("usage") is not None


@pytest.mark.parametrize(
    ("sampling_parameter", "value"),
    [("temperature", 0.7), ("max_tokens", 10), ("top_p", 0.9), ("frequency_penalty", 0.5),
     ("presence_penalty", 0.2), ("n", 1), ("logit_bias", {"0": 0}), ("min_tokens", 16),
     ("ignore_eos", True)],
)  # fmt: skip
def test_completions_sampling_parameters(
    raw: httpx.Client, sampling_parameter: str, value: object
) -> None:
    """Passed to the model in ``parameters`` (Triton refuses logit_bias; servekit hands it on,
    as it does every field, and the model takes what it can)."""
    answer = _complete(raw, prompt=PROMPT, **{sampling_parameter: value})
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["text"].strip()


def test_completions_max_tokens(raw: httpx.Client) -> None:
    texts = [_complete(raw, prompt=PROMPT, max_tokens=m).json() for m in (1, 1, 100)]
    words = [t["choices"][0]["text"].strip().split() for t in texts]
    assert len(words[0]) == len(words[1]) == 1
    assert len(words[2]) > len(words[0])


def test_completions_seed(raw: httpx.Client) -> None:
    texts = [
        _complete(raw, prompt=PROMPT, seed=seed).json()["choices"][0]["text"].strip().split()
        for seed in (1, 1, 2)
    ]
    assert texts[0] == texts[1]
    assert texts[0] != texts[2]


@pytest.mark.parametrize(
    ("sampling_parameter", "value"),
    [("temperature", 2.1), ("temperature", -0.1), ("max_tokens", -1), ("top_p", 1.1),
     ("frequency_penalty", 3), ("frequency_penalty", -3), ("presence_penalty", 2.1),
     ("presence_penalty", -2.1)],
)  # fmt: skip
def test_completions_invalid_sampling_parameters(
    raw: httpx.Client, sampling_parameter: str, value: object
) -> None:
    answer = _complete(raw, prompt=PROMPT, **{sampling_parameter: value})
    assert _refused(answer)["param"] == sampling_parameter


def test_completions_empty_request_no_model_no_prompt(raw: httpx.Client) -> None:
    assert _refused(raw.post("/openai/v1/completions", json={}))["param"] == "model"
    assert _refused(raw.post("/openai/v1/completions", json={"prompt": PROMPT}))["param"] == (
        "model"
    )
    assert _refused(_complete(raw))["param"] == "prompt"


@pytest.mark.parametrize("fields", [{"best_of": 2}, {"n": 2, "best_of": 2}])
def test_completions_best_of(raw: httpx.Client, fields: dict[str, int]) -> None:
    assert _refused(_complete(raw, prompt=PROMPT, **fields))["param"] == "best_of"


def test_completions_multiple_choices(raw: httpx.Client) -> None:
    """Triton answers only one choice (400 for n = 2); a servekit model with a parameters
    input is asked for n texts."""
    answer = _complete(raw, prompt=PROMPT, n=2, seed=5)
    assert answer.status_code == 200
    assert [c["index"] for c in answer.json()["choices"]] == [0, 1]


@pytest.mark.parametrize("echo", [False, True])
def test_echo(raw: httpx.Client, echo: bool) -> None:
    text = _complete(raw, prompt=PROMPT, echo=echo).json()["choices"][0]["text"].strip()
    if echo:
        assert text.startswith(PROMPT)
    else:
        assert PROMPT not in text


def test_usage_response(raw: httpx.Client) -> None:
    answer = _complete(raw, prompt=PROMPT)
    assert answer.status_code == 200
    usage = answer.json()["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


# -- TestEmbeddings -----------------------------------------------------------------------------
EMBEDDER = "embedder"


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.http_client(timeout=30) as made:
        yield made


def _check_embedding_response(
    answer: httpx.Response, folder: Path, encoding_format: str = "float"
) -> None:
    assert answer.status_code == 200, answer.json()
    embedding: Any = answer.json()["data"][0]["embedding"]
    assert embedding is not None
    if encoding_format == "base64":
        embedding = np.frombuffer(base64.b64decode(embedding), dtype=np.float32)
    session = ort.InferenceSession(str(folder / "models" / "embedder" / "1" / "model.onnx"))
    expected = session.run(None, {"text_input": np.array([EMBEDDING_INPUT], dtype=object)})[0][0]
    assert np.allclose(expected, embedding, rtol=0, atol=1e-6)
    assert answer.json()["data"][0]["object"] == "embedding"
    assert answer.json()["data"][0]["index"] == 0
    assert answer.json()["model"] == EMBEDDER
    usage = answer.json().get("usage")
    assert usage is not None
    assert usage["prompt_tokens"] == 7  # words: servekit has no tokenizer
    assert usage["total_tokens"] == 7


def _refused(answer: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    error: dict[str, Any] = answer.json()["error"]
    assert error["message"]
    return error


def test_embeddings_defaults(http: httpx.Client, folder: Path) -> None:
    answer = http.post("/openai/v1/embeddings", json={"model": EMBEDDER, "input": EMBEDDING_INPUT})
    _check_embedding_response(answer, folder)
    tokens = [101, 1996, 2833, 2001, 12090, 1998, 1996, 15610, 1012, 1012, 1012, 102]
    answer = http.post("/openai/v1/embeddings", json={"model": EMBEDDER, "input": tokens})
    assert _refused(answer)["param"] == "input"


@pytest.mark.parametrize("param_value", ["invalid", 0])
def test_embeddings_invalid_parameters(http: httpx.Client, param_value: object) -> None:
    body = {"model": EMBEDDER, "input": EMBEDDING_INPUT, "encoding_format": param_value}
    assert _refused(http.post("/openai/v1/embeddings", json=body))["param"] == "encoding_format"


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_embeddings_parameters(http: httpx.Client, folder: Path, encoding_format: str) -> None:
    body = {"model": EMBEDDER, "input": EMBEDDING_INPUT, "encoding_format": encoding_format}
    _check_embedding_response(
        http.post("/openai/v1/embeddings", json=body), folder, encoding_format
    )


def test_embeddings_empty_request(http: httpx.Client) -> None:
    assert _refused(http.post("/openai/v1/embeddings", json={}))["param"] == "model"


def test_embeddings_no_model(http: httpx.Client) -> None:
    answer = http.post("/openai/v1/embeddings", json={"input": EMBEDDING_INPUT})
    assert _refused(answer)["param"] == "model"


@pytest.mark.parametrize(
    ("model", "error_code"), [("", 400), (123, 400), ("Invalid", 404), (None, 400)]
)
def test_embeddings_invalid_model(http: httpx.Client, model: object, error_code: int) -> None:
    answer = http.post("/openai/v1/embeddings", json={"model": model, "input": EMBEDDING_INPUT})
    error = _refused(answer, error_code)
    assert error["param"] == "model"
    if error_code == 404:
        assert error["code"] == "model_not_found" and "'Invalid'" in error["message"]


def test_embeddings_no_input(http: httpx.Client) -> None:
    assert (
        _refused(http.post("/openai/v1/embeddings", json={"model": EMBEDDER}))["param"] == "input"
    )


@pytest.mark.parametrize("value", ["", [], 123, 1.5, 0, None])
def test_embeddings_empty_or_invalid_input(http: httpx.Client, value: object) -> None:
    answer = http.post("/openai/v1/embeddings", json={"model": EMBEDDER, "input": value})
    assert _refused(answer)["param"] == "input"
