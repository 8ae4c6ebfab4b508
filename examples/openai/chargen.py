"""A tiny character-level text generator, served on servekit's OpenAI-compatible routes.

No weights are downloaded: at load the model counts which character follows each run of up to
``order`` characters in the text below (a Markov chain), and generates by sampling from those
counts, one character per step. ``predict`` yields every character as it is made, so servekit
streams it (``stream: true`` on ``/openai/v1/chat/completions`` and ``/completions``) and joins
the pieces otherwise. ``parameters`` (the request's other fields as JSON) brings
``max_tokens`` (characters here), ``temperature``, ``seed``, ``stop`` and ``n``: with n > 1
each yield carries one piece per choice.

``ChatModel`` applies its own chat template, as a real chat model's tokenizer would: it
continues from the last user message. ``CompletionModel`` continues the prompt.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np

TEXT = """
the model is small and it is honest about it. it learned its letters from a few lines of text
and it writes them back in new orders. a server that streams it sends each letter as soon as it
is made, so the first letter arrives before the last is thought of. the same server batches
the requests of an embedding model, keeps its queues short, counts what it served and says
when it cannot serve. ask it a question and it answers with letters that look like words; ask
it again with the same seed and it answers the same way. it never downloads anything, and it
never pretends to be larger than it is. the cat sat on the mat and the dog ran in the sun.
a quick brown fox jumps over the lazy dog while the river runs to the sea.
"""


class CharChain:
    """Counts of the next character after each context of up to ``order`` characters."""

    def __init__(self, text: str, order: int) -> None:
        self.order = order
        text = " ".join(text.split())
        self.counts: dict[str, Counter[str]] = defaultdict(Counter)
        for size in range(order + 1):
            for i in range(size, len(text)):
                self.counts[text[i - size : i]][text[i]] += 1

    def generate(self, prompt: str, settings: dict[str, Any], choice: int) -> Iterator[str]:
        """Characters that follow ``prompt``, one at a time."""
        seed = settings.get("seed")
        rng = np.random.default_rng(None if seed is None else int(seed) + choice)
        temperature = settings.get("temperature")
        temperature = 1.0 if temperature is None else float(temperature)
        limit = settings.get("max_tokens") or settings.get("max_completion_tokens") or 48
        stops = settings.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        context = " ".join(prompt.lower().split()) + " "
        made = ""
        for _ in range(int(limit)):
            counts = self.next_counts(context)
            letters = list(counts)
            weights = np.array([counts[c] for c in letters], dtype=np.float64)
            if temperature < 0.01:  # greedy: the most frequent next letter
                letter = letters[int(np.argmax(weights))]
            else:
                weights = weights ** (1 / temperature)
                letter = letters[int(rng.choice(len(letters), p=weights / weights.sum()))]
            made += letter
            if any(stop and made.endswith(stop) for stop in stops):
                return
            context += letter
            yield letter

    def next_counts(self, context: str) -> Counter[str]:
        """How often each letter follows the longest known end of ``context``."""
        for size in range(self.order, -1, -1):
            found = self.counts.get(context[len(context) - size :] if size else "")
            if found:
                return found
        raise AssertionError("the empty context always has counts")


def _settings(parameters: np.ndarray | None) -> dict[str, Any]:
    if parameters is None:
        return {}
    loaded = json.loads(parameters.reshape(-1)[0])
    return loaded if isinstance(loaded, dict) else {}


def _steps(chain: CharChain, prompt: str, settings: dict[str, Any]) -> Iterator[list[str]]:
    """One piece per choice at each step (a choice that has ended gives "")."""
    n = int(settings.get("n") or 1)
    streams = [chain.generate(prompt, settings, choice) for choice in range(n)]
    while True:
        pieces = [next(stream, "") for stream in streams]
        if not any(pieces):
            return
        yield pieces


class CompletionModel:
    """``openai: completion``: continues ``text_input``."""

    def load(self, order: int = 4) -> None:
        self.chain = CharChain(TEXT, order)

    def predict(
        self, text_input: np.ndarray, parameters: np.ndarray | None = None
    ) -> Iterator[dict[str, list[str]]]:
        prompt = text_input.reshape(-1)[0].decode()
        for pieces in _steps(self.chain, prompt, _settings(parameters)):
            yield {"text_output": pieces}


class ChatModel:
    """``openai: chat``: answers the last user message (its chat template)."""

    def load(self, order: int = 4) -> None:
        self.chain = CharChain(TEXT, order)

    def predict(
        self, messages: np.ndarray, parameters: np.ndarray | None = None
    ) -> Iterator[dict[str, list[str]]]:
        history = json.loads(messages.reshape(-1)[0])
        users = [m for m in history if m.get("role") == "user"]
        content = users[-1].get("content") if users else ""
        if isinstance(content, list):  # parts: their text
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        for pieces in _steps(self.chain, str(content or ""), _settings(parameters)):
            yield {"text_output": pieces}
