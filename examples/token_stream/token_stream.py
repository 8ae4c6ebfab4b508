"""A decoupled model: each word of the prompt comes back as its own response (a token stream).

``predict`` is a generator, so servekit serves it as Triton serves a decoupled model: every
``yield`` is one response on gRPC ModelStreamInfer, one Server-Sent Event on HTTP
``/v2/models/token_stream/generate_stream``, one message on grps streaming. A real LLM yields
its tokens the same way. Each step runs in a worker thread; when the client goes away the
generator is closed (its ``finally`` runs) and the instance serves the next request.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TypedDict

import numpy as np
from numpy.typing import NDArray


class Token(TypedDict):
    """What one response carries: the next piece of text."""

    text_output: str


class TokenStream:
    def load(self, delay_seconds: float = 0.05) -> None:
        """``parameters`` in serve.yaml arrive here; the delay stands in for compute."""
        self.delay = delay_seconds

    def predict(self, text_input: list[str], max_tokens: NDArray[np.int32]) -> Iterator[Token]:
        prompt = text_input[0]
        words = (prompt.decode() if isinstance(prompt, bytes) else str(prompt)).split()
        for word in words[: int(max_tokens.reshape(-1)[0])]:
            time.sleep(self.delay)
            yield {"text_output": word + " "}
