"""The OpenAI-compatible routes against a real ``servekit serve``, driven by the official
``openai`` client, sync and async, as application code drives them.

The server serves the shipped example (examples/openai: a character-level generator as chat
and completion models, the ONNX bag-of-words embedder built by its script) plus two models of
this test: ``plain`` (no ``openai:``) and ``bare-chat`` (a chat model that answers once and
has no ``parameters`` input). Every request carries the server's token (``--token``). Bad
requests get OpenAI's error shape with a 4xx, and the server stays healthy after them.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
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
from waits import wait_until

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "openai"
TOKEN = "openai-test-token"
EXTRA_MODULE = """
import json
import time
from pathlib import Path

import numpy as np

CLOSED = Path(__file__).with_name("closed.log")


def endless_chat(messages: np.ndarray, parameters: np.ndarray | None = None):
    try:
        while True:
            time.sleep(0.01)
            yield {"text_output": ["x"]}
    finally:
        with CLOSED.open("a") as log:
            log.write("closed\\n")


def echo(x: np.ndarray) -> np.ndarray:
    return x


def slow_echo(text_input: np.ndarray) -> dict[str, list[bytes]]:
    time.sleep(0.05)
    return {"text_output": [text_input.reshape(-1)[0]]}


def bare_chat(messages: np.ndarray) -> dict[str, list[str]]:
    history = json.loads(messages.reshape(-1)[0])
    return {"text_output": [history[-1]["content"].upper()]}
"""
EXTRA_MODELS = """
  - name: plain
    modelFormat: {name: python}
    entrypoint: "extra_models:echo"
    inputs: [{name: x, datatype: FP32, shape: [-1]}]
    outputs: [{name: x, datatype: FP32, shape: [-1]}]
  - name: endless-chat
    modelFormat: {name: python}
    entrypoint: "extra_models:endless_chat"
    openai: chat
    inputs:
      - {name: messages, datatype: BYTES, shape: [1]}
      - {name: parameters, datatype: BYTES, shape: [1], optional: true}
    outputs: [{name: text_output, datatype: BYTES, shape: [-1]}]
  - name: slow-echo
    modelFormat: {name: python}
    entrypoint: "extra_models:slow_echo"
    openai: completion
    maxQueueSize: 1
    inputs: [{name: text_input, datatype: BYTES, shape: [1]}]
    outputs: [{name: text_output, datatype: BYTES, shape: [-1]}]
  - name: bare-chat
    modelFormat: {name: python}
    entrypoint: "extra_models:bare_chat"
    openai: chat
    inputs: [{name: messages, datatype: BYTES, shape: [1]}]
    outputs: [{name: text_output, datatype: BYTES, shape: [-1]}]
"""
OPENAI_MODELS = ["bare-chat", "chargen", "chargen-chat", "embedder", "endless-chat", "slow-echo"]


def _builder() -> Any:
    spec = importlib.util.spec_from_file_location("build_embedder", EXAMPLE / "build_embedder.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("openai")
    shutil.copy(EXAMPLE / "chargen.py", root / "chargen.py")
    (root / "extra_models.py").write_text(EXTRA_MODULE)
    _builder().main(root / "models")
    config = (
        (EXAMPLE / "serve.yaml")
        .read_text()
        .replace("server:\n", "server:\n  logging: {accessLog: on}\n", 1)
    )
    (root / "serve.yaml").write_text(config + EXTRA_MODELS)
    return root


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[ServerProcess]:
    process = start_server(folder / "serve.yaml", grpc=False, extra=["--token", TOKEN])
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{server.http_url}/openai/v1", api_key=TOKEN, max_retries=0, timeout=30
    ) as made:
        yield made


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    headers = {"authorization": f"Bearer {TOKEN}"}
    with server.http_client(timeout=30, headers=headers) as made:
        yield made


def _healthy(server: ServerProcess) -> None:
    assert server.alive(), server.log()
    with server.http_client(timeout=10) as plain:
        assert plain.get("/v2/health/ready").json() == {"ready": True}


HELLO = [{"role": "user", "content": "tell me about the cat"}]


# -- models -------------------------------------------------------------------------------------
def test_models_list_and_retrieve(client: openai.OpenAI) -> None:
    listed = client.models.list()
    assert sorted(m.id for m in listed.data) == OPENAI_MODELS  # not "plain"
    assert all(m.owned_by == "servekit" and m.object == "model" for m in listed.data)
    assert client.models.retrieve("embedder").id == "embedder"
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("plain")
    assert caught.value.body["code"] == "model_not_found"  # type: ignore[index]


# -- completions and chat -----------------------------------------------------------------------
def test_completion(client: openai.OpenAI) -> None:
    made = client.completions.create(model="chargen", prompt="the quick", seed=3, max_tokens=24)
    again = client.completions.create(model="chargen", prompt="the quick", seed=3, max_tokens=24)
    assert made.object == "text_completion" and made.model == "chargen"
    text = made.choices[0].text
    assert len(text) == 24 and text == again.choices[0].text
    assert made.choices[0].finish_reason == "length"  # all 24 of max_tokens used
    assert made.usage is not None and made.usage.completion_tokens == len(text.split())
    assert made.usage.prompt_tokens == 2
    two = client.completions.create(model="chargen", prompt=["a cat", "the sun"], n=2, seed=1)
    assert [c.index for c in two.choices] == [0, 1, 2, 3]
    assert all(c.text for c in two.choices)


def test_chat_completion(client: openai.OpenAI) -> None:
    made = client.chat.completions.create(
        model="chargen-chat", messages=HELLO, seed=5, max_tokens=30, temperature=0.5
    )
    assert made.object == "chat.completion"
    message = made.choices[0].message
    assert message.role == "assistant" and message.content
    assert made.usage is not None and made.usage.prompt_tokens == 5
    bare = client.chat.completions.create(model="bare-chat", messages=HELLO)
    assert bare.choices[0].message.content == "TELL ME ABOUT THE CAT"


@pytest.mark.parametrize("usage", [False, True])
def test_chat_stream(client: openai.OpenAI, usage: bool) -> None:
    whole = client.chat.completions.create(
        model="chargen-chat", messages=HELLO, seed=9, max_tokens=40
    )
    options: Any = {"include_usage": True} if usage else openai.omit
    chunks = list(
        client.chat.completions.create(
            model="chargen-chat",
            messages=HELLO,
            seed=9,
            max_tokens=40,
            stream=True,
            stream_options=options,
        )
    )
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len([p for p in pieces if p]) > 3  # streamed piece by piece
    assert "".join(pieces) == whole.choices[0].message.content
    finished = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finished] == ["length"]  # 40 letters made
    assert len("".join(pieces)) == 40
    if usage:
        last = chunks[-1]
        assert last.choices == [] and last.usage is not None
        assert last.usage.completion_tokens == len("".join(pieces).split())
        assert all(c.usage is None for c in chunks[:-1])
    else:
        assert all(c.usage is None for c in chunks)


@pytest.mark.parametrize("usage", [False, True])
def test_completion_stream(client: openai.OpenAI, usage: bool) -> None:
    options: Any = {"include_usage": True} if usage else openai.omit
    chunks = list(
        client.completions.create(
            model="chargen", prompt="the river", seed=2, stream=True, stream_options=options
        )
    )
    whole = client.completions.create(model="chargen", prompt="the river", seed=2)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text and len(chunks) > 3
    assert (chunks[-1].usage is not None) == usage
    echoed = client.completions.create(model="chargen", prompt="the river", seed=2, echo=True)
    assert echoed.choices[0].text == "the river" + text
    assert echoed.usage is not None and echoed.usage.completion_tokens == len(text.split())
    streamed = client.completions.create(
        model="chargen", prompt="the river", seed=2, echo=True, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == "the river" + text


def test_finish_reason_length(client: openai.OpenAI) -> None:
    """An answer cut by max_tokens says "length", streamed or not, chat and completions (the
    generator yields one character per step: max_tokens counts them); one that ends on its
    own, here on a stop sequence, says "stop"."""
    made = client.completions.create(model="chargen", prompt="the cat", seed=1, max_tokens=6)
    assert len(made.choices[0].text) == 6 and made.choices[0].finish_reason == "length"
    chat = client.chat.completions.create(
        model="chargen-chat", messages=HELLO, seed=1, max_completion_tokens=7
    )
    assert chat.choices[0].finish_reason == "length"
    assert len(chat.choices[0].message.content or "") == 7
    two = client.completions.create(model="chargen", prompt=["a", "b"], n=2, seed=1, max_tokens=4)
    assert [c.finish_reason for c in two.choices] == ["length"] * 4
    stopped = client.completions.create(
        model="chargen", prompt="the cat", seed=1, max_tokens=200, stop=" "
    )
    assert stopped.choices[0].finish_reason == "stop"
    streamed = list(
        client.chat.completions.create(
            model="chargen-chat", messages=HELLO, seed=1, max_tokens=5, stream=True
        )
    )
    assert [c.choices[0].finish_reason for c in streamed if c.choices[0].finish_reason] == [
        "length"
    ]
    assert "".join(c.choices[0].delta.content or "" for c in streamed) != ""
    pieces = list(
        client.completions.create(
            model="chargen", prompt="the sun", seed=1, max_tokens=200, stop=" ", stream=True
        )
    )
    assert [c.choices[0].finish_reason for c in pieces if c.choices[0].finish_reason] == ["stop"]
    cut = list(
        client.completions.create(model="chargen", prompt="the sun", max_tokens=3, stream=True)
    )
    assert [c.choices[0].finish_reason for c in cut if c.choices[0].finish_reason] == ["length"]


def test_stream_ends_with_done(http: httpx.Client) -> None:
    body = {"model": "chargen-chat", "messages": HELLO, "stream": True, "max_tokens": 5}
    with http.stream("POST", "/openai/v1/chat/completions", json=body) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        events = [line for line in answer.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: {") for e in events[:-1])


def test_a_client_that_leaves_stops_the_model(server: ServerProcess, folder: Path) -> None:
    """Its only instance serves the next stream once the first client has gone."""
    log = folder / "closed.log"

    def closed() -> int:
        return log.read_text().count("closed") if log.exists() else 0

    body = {"model": "endless-chat", "messages": HELLO, "stream": True}
    headers = {"authorization": f"Bearer {TOKEN}"}
    for round_ in (1, 2):
        with (
            server.http_client(timeout=10, headers=headers) as c,
            c.stream("POST", "/openai/v1/chat/completions", json=body) as answer,
        ):
            assert answer.status_code == 200
            lines = answer.iter_lines()
            pieces = [next(lines) for _ in range(6)]
            assert any('"content":"x"' in p for p in pieces)
        wait_until(lambda n=round_: closed() == n, what=f"the model's generator closed ({round_})")


def test_a_full_queue_is_a_429(http: httpx.Client, client: openai.OpenAI) -> None:
    """Eight prompts at once to a model that queues one request: the executor refuses the
    others, and the answer is OpenAI's rate-limit error with Retry-After, not a 500."""
    answer = http.post(
        "/openai/v1/completions", json={"model": "slow-echo", "prompt": [f"p{i}" for i in range(8)]}
    )
    assert answer.status_code == 429, answer.text
    assert answer.json()["error"]["type"] == "rate_limit_error"
    assert int(answer.headers["retry-after"]) >= 1
    # once what was accepted has run (one instance, in order: a probe answered is behind it),
    # two prompts fit: one runs, one waits
    probe = {"model": "slow-echo", "prompt": "probe"}
    wait_until(lambda: http.post("/openai/v1/completions", json=probe).status_code == 200)
    two = client.completions.create(model="slow-echo", prompt=["a", "b"])
    assert [c.text for c in two.choices] == ["a", "b"]


# -- embeddings ---------------------------------------------------------------------------------
TEXTS = ["The cat sat on the mat", "a quick brown fox", "completely unknown zebra words"]


def _reference(folder: Path, texts: list[str]) -> np.ndarray:
    """The embedder run by onnxruntime directly, outside the server."""
    session = ort.InferenceSession(str(folder / "models" / "embedder" / "1" / "model.onnx"))
    out = session.run(None, {"text_input": np.array(texts, dtype=object)})[0]
    return np.asarray(out, dtype=np.float32)


def test_embeddings_float_and_base64(
    client: openai.OpenAI, http: httpx.Client, folder: Path
) -> None:
    expected = _reference(folder, TEXTS)
    floats = client.embeddings.create(model="embedder", input=TEXTS, encoding_format="float")
    default = client.embeddings.create(model="embedder", input=TEXTS)  # base64 with numpy
    for answer in (floats, default):
        got = np.array([d.embedding for d in answer.data], dtype=np.float32)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        assert [d.index for d in answer.data] == [0, 1, 2]
    assert floats.usage.prompt_tokens == 14  # words: 6 + 4 + 4
    raw = http.post(
        "/openai/v1/embeddings",
        json={"model": "embedder", "input": "a cat", "encoding_format": "base64"},
    ).json()
    vector = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vector, _reference(folder, ["a cat"])[0], rtol=1e-5, atol=1e-6)
    one = client.embeddings.create(model="embedder", input="a cat", encoding_format="float")
    assert len(one.data) == 1 and len(one.data[0].embedding) == 64


def test_embedding_dimensions(client: openai.OpenAI, folder: Path) -> None:
    cut = client.embeddings.create(model="embedder", input=TEXTS, dimensions=16)
    full = _reference(folder, TEXTS)[:, :16]
    expected = full / np.linalg.norm(full, axis=1, keepdims=True)
    got = np.array([d.embedding for d in cut.data], dtype=np.float32)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert (
        len(client.embeddings.create(model="embedder", input="x", dimensions=64).data[0].embedding)
        == 64
    )
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="embedder", input="x", dimensions=10)
    assert caught.value.body["param"] == "dimensions"  # type: ignore[index]
    assert "16, 32, 64" in caught.value.body["message"]  # type: ignore[index]


def test_concurrent_embeddings_are_batched(server: ServerProcess, http: httpx.Client) -> None:
    """32 clients at once: the executor joins their requests into batches of several rows."""

    async def burst() -> list[int]:
        async with openai.AsyncOpenAI(
            base_url=f"{server.http_url}/openai/v1", api_key=TOKEN, max_retries=0, timeout=30
        ) as aclient:

            async def one(i: int) -> int:
                answer = await aclient.embeddings.create(
                    model="embedder", input=[f"the cat number {i} sat"] * 4
                )
                return len(answer.data)

            return await asyncio.gather(*(one(i) for i in range(32)))

    def batches() -> dict[int, int]:
        stats = http.get("/v2/models/embedder/stats").json()["model_stats"][0]
        return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}

    before = batches()
    for _ in range(5):  # bounded: batches form when requests queue behind a busy instance
        assert run_in_own_loop(burst) == [4] * 32
        after = batches()
        if any(size > 4 and after[size] > before.get(size, 0) for size in after):
            break
    else:
        raise AssertionError(f"no batch of more than one request: {after}")


# -- the async client ---------------------------------------------------------------------------
def test_async_client(server: ServerProcess) -> None:
    async def run() -> None:
        async with openai.AsyncOpenAI(
            base_url=f"{server.http_url}/openai/v1", api_key=TOKEN, max_retries=0, timeout=30
        ) as aclient:
            listed = await aclient.models.list()
            assert sorted(m.id for m in listed.data) == OPENAI_MODELS
            made = await aclient.completions.create(model="chargen", prompt="a dog", seed=4)
            assert made.choices[0].text
            chat = await aclient.chat.completions.create(
                model="chargen-chat", messages=HELLO, seed=4, max_tokens=20
            )
            stream = await aclient.chat.completions.create(
                model="chargen-chat",
                messages=HELLO,
                seed=4,
                max_tokens=20,
                stream=True,
                stream_options={"include_usage": True},
            )
            pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
            assert "".join(pieces) == chat.choices[0].message.content
            plain = await aclient.completions.create(
                model="chargen", prompt="a dog", seed=4, stream=True
            )
            texts = [c.choices[0].text async for c in plain]
            assert "".join(texts) == made.choices[0].text
            vectors = await aclient.embeddings.create(model="embedder", input=["a", "b c"])
            assert len(vectors.data) == 2 and len(vectors.data[1].embedding) == 64

    run_in_own_loop(run)


# -- errors -------------------------------------------------------------------------------------
def _refused(
    http: httpx.Client, path: str, body: Any, status: int, param: str | None
) -> dict[str, Any]:
    answer = http.post(f"/openai/v1/{path}", json=body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["message"]
    return error


def test_bad_requests_get_openai_errors(server: ServerProcess, http: httpx.Client) -> None:
    chat = "chat/completions"
    error = _refused(
        http, chat, {"model": "chargen-chat", "messages": [{"role": "wizard", "content": "x"}]},
        400, "messages.[0].role",
    )  # fmt: skip
    assert error["type"] == "invalid_request_error"
    _refused(http, chat, {"model": "chargen-chat", "messages": []}, 400, "messages")
    big = [{"role": "user", "content": "a" * (10 * 1024 * 1024)}]
    error = _refused(http, chat, {"model": "chargen-chat", "messages": big}, 400, "messages")
    assert error["code"] == "context_length_exceeded"
    _refused(http, chat, {"model": "chargen-chat", "messages": HELLO, "n": 1000}, 400, "n")
    error = _refused(http, chat, {"model": "plain", "messages": HELLO}, 404, "model")
    assert error["code"] == "model_not_found"
    _refused(http, chat, {"model": "nope", "messages": HELLO}, 404, "model")
    _refused(http, chat, {"model": "embedder", "messages": HELLO}, 400, "model")
    _refused(http, chat, {"model": "chargen-chat", "messages": HELLO, "logprobs": True}, 400,
             "logprobs")  # fmt: skip
    # bare-chat has no parameters input: it cannot honour a temperature or n > 1
    _refused(http, chat, {"model": "bare-chat", "messages": HELLO, "temperature": 0.2}, 400,
             "temperature")  # fmt: skip
    _refused(http, chat, {"model": "bare-chat", "messages": HELLO, "n": 2}, 400, "n")
    _refused(http, "completions", {"model": "chargen", "prompt": [1, 2, 3]}, 400, "prompt")
    _refused(http, "completions", {"model": "chargen", "prompt": "x", "stream_options": {}}, 400,
             "stream_options")  # fmt: skip
    _refused(http, "embeddings", {"model": "embedder", "input": []}, 400, "input")
    _refused(http, "embeddings", {"model": "embedder", "input": "x", "encoding_format": "hex"},
             400, "encoding_format")  # fmt: skip
    broken = http.post(
        "/openai/v1/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert broken.status_code == 400 and "message" in broken.json()["error"]
    _healthy(server)


def test_unknown_paths_and_methods_get_openai_errors(
    client: openai.OpenAI, http: httpx.Client, server: ServerProcess
) -> None:
    """A route servekit does not offer under /openai/v1/ (the client's files API), or a wrong
    method on one it does, is OpenAI's error object with 404 / 405, as the client reads it."""
    with pytest.raises(openai.NotFoundError) as caught:
        client.files.list()
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "invalid_request_error"
    assert body["message"] == "Invalid URL (GET /openai/v1/files)"
    assert set(body) == {"message", "type", "param", "code"}
    wrong = http.get("/openai/v1/chat/completions")
    assert wrong.status_code == 405 and "POST" in wrong.headers["allow"]
    error = wrong.json()["error"]
    assert error["type"] == "invalid_request_error" and "POST" in error["message"]
    assert set(error) == {"message", "type", "param", "code"}
    deleted = http.delete("/openai/v1/models")
    assert deleted.status_code == 405 and deleted.json()["error"]["message"]
    nested = http.post("/openai/v1/models/chargen/extra", json={})
    assert nested.status_code == 404 and nested.json()["error"]["param"] is None
    # elsewhere the app's own shape stays
    assert http.get("/v2/nope").json() == {"error": "Not Found"}
    _healthy(server)


def test_official_client_errors(client: openai.OpenAI, server: ServerProcess) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="chargen-chat", messages=[])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="chargen-chat", messages=HELLO, n=1000)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="plain", messages=HELLO)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="chargen-chat", messages=[{"role": "user", "content": "b" * 10_000_000}]
        )
    _healthy(server)


def test_token_needed(server: ServerProcess) -> None:
    with (
        openai.OpenAI(
            base_url=f"{server.http_url}/openai/v1", api_key="wrong", max_retries=0, timeout=10
        ) as wrong,
        pytest.raises(openai.AuthenticationError) as caught,
    ):
        wrong.models.list()
    assert caught.value.status_code == 401
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "authentication_error"
    with server.http_client(timeout=10) as anonymous:
        answer = anonymous.post("/openai/v1/embeddings", json={"model": "embedder", "input": "x"})
    assert answer.status_code == 401 and "message" in answer.json()["error"]
    assert answer.headers["www-authenticate"].startswith("Bearer")


def test_requests_are_counted(http: httpx.Client, client: openai.OpenAI) -> None:
    """The routes go through the DataPlane: the model's statistics count them."""

    def count() -> int:
        stats = http.get("/v2/models/bare-chat/stats").json()["model_stats"][0]
        return int(stats["inference_stats"]["success"]["count"])

    before = count()
    client.chat.completions.create(model="bare-chat", messages=HELLO)
    assert count() == before + 1
    assert json.loads(http.get("/v2/models/bare-chat/config").content)["name"] == "bare-chat"


def test_access_log_names_the_model(server: ServerProcess, client: openai.OpenAI) -> None:
    client.embeddings.create(model="embedder", input="a line for the access log")
    wait_until(
        lambda: any(
            "POST /openai/v1/embeddings 200" in line and "model=embedder" in line
            for line in server.log().splitlines()
        ),
        what="the access line of the embeddings request",
    )


# -- LangChain ----------------------------------------------------------------------------------
def test_langchain_chat_and_embeddings(server: ServerProcess, folder: Path) -> None:
    """LangChain's OpenAI classes, as RAG code uses them (no tokenizer download: embeddings
    skip tiktoken's context-length check)."""
    from langchain_openai import ChatOpenAI, OpenAIEmbeddings

    base = f"{server.http_url}/openai/v1"
    chat = ChatOpenAI(model="chargen-chat", base_url=base, api_key=TOKEN, max_retries=0, seed=3)
    answer = chat.invoke("tell me about the cat")
    assert isinstance(answer.content, str) and answer.content
    streamed = "".join(str(chunk.content) for chunk in chat.stream("tell me about the cat"))
    assert streamed == answer.content  # the same seed, streamed
    embeddings = OpenAIEmbeddings(
        model="embedder", base_url=base, api_key=TOKEN, check_embedding_ctx_length=False
    )
    vectors = embeddings.embed_documents(TEXTS)
    np.testing.assert_allclose(np.array(vectors), _reference(folder, TEXTS), rtol=1e-5, atol=1e-6)
    assert len(embeddings.embed_query("a cat")) == 64
