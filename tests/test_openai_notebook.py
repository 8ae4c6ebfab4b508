"""The notebook's OpenAI path: ``add_model(..., openai=...)`` and ``server.openai_client()``."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import openai
import pytest

import servekit

pytestmark = pytest.mark.slow


def reverse_chat(messages: np.ndarray) -> Iterator[dict[str, list[str]]]:
    """Yields the last message's words reversed, one word per chunk."""
    history = json.loads(messages.reshape(-1)[0])
    for word in reversed(history[-1]["content"].split()):
        yield {"text_output": [word + " "]}


def lengths(text_input: np.ndarray) -> dict[str, np.ndarray]:
    """A two-dimensional embedding: the length and word count of each text."""
    texts = [t.decode() for t in text_input.reshape(-1)]
    return {"embedding": np.array([[len(t), len(t.split())] for t in texts], np.float32)}


@pytest.mark.parametrize("token", [None, "nb-token"])
def test_add_model_openai_and_client(token: str | None) -> None:
    with servekit.serve(None, grpc_port=None, name="openai-notebook", token=token) as server:
        server.add_model(
            "reverse",
            reverse_chat,
            inputs=[("messages", "BYTES", [1])],
            outputs=[("text_output", "BYTES", [-1])],
            openai="chat",
        )
        server.add_model(
            "lengths",
            lengths,
            inputs=[("text_input", "BYTES", [-1])],
            outputs=[("embedding", "FP32", [-1, 2])],
            openai={"kind": "embedding"},
        )
        server.add_model(
            "other", lengths, inputs=[("text_input", "BYTES", [-1])],
            outputs=[("embedding", "FP32", [-1, 2])],
        )  # fmt: skip
        with server.openai_client(max_retries=0, timeout=30) as client:
            assert isinstance(client, openai.OpenAI)
            assert sorted(m.id for m in client.models.list().data) == ["lengths", "reverse"]
            messages = [{"role": "user", "content": "one two three"}]
            answer = client.chat.completions.create(model="reverse", messages=messages)
            assert answer.choices[0].message.content == "three two one "
            pieces = [
                c.choices[0].delta.content
                for c in client.chat.completions.create(
                    model="reverse", messages=messages, stream=True
                )
                if c.choices and c.choices[0].delta.content
            ]
            assert pieces == ["three ", "two ", "one "]
            vectors = client.embeddings.create(model="lengths", input=["ab c", "hello"])
            assert [d.embedding for d in vectors.data] == [[4.0, 2.0], [5.0, 1.0]]
            with pytest.raises(openai.NotFoundError):
                client.embeddings.create(model="other", input="x")
