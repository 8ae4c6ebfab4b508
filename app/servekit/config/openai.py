"""serve.yaml's per-model ``openai:``: the model answers the OpenAI-compatible routes.

``openai: {kind: chat|completion|embedding}`` (or just ``openai: chat``) puts the model under
``/openai/v1/`` (app/servekit/rest/openai.py). Each kind hands the model fixed tensors
(CONTRACT, "Wave 4 additions"), so a model that declares other ones cannot serve that kind:
:func:`misfits` says why, for serve.yaml's declared tensors (a config error) and for a loaded
model's signature (a request error), from one table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from servekit.config.schema_base import Section
from servekit.datatypes import from_config_name
from servekit.errors import InvalidArgument

Kind = Literal["chat", "completion", "embedding"]
KINDS: tuple[Kind, ...] = ("chat", "completion", "embedding")

MESSAGES = "messages"
TEXT_INPUT = "text_input"
PARAMETERS = "parameters"
TEXT_OUTPUT = "text_output"
EMBEDDING = "embedding"

DEFAULT_MAX_INPUT_BYTES = 1024 * 1024
"""1 MiB of text per request (messages as JSON, the prompt, or every embedding input)."""


class OpenAISettings(Section):
    """The model answers OpenAI's API under `/openai/v1/` as this kind: `chat`
    (`/chat/completions`: input `messages`, the messages as JSON text, and optional
    `parameters`, the other request fields as JSON; output `text_output`), `completion`
    (`/completions`: input `text_input`, the prompt, optional `parameters`; output
    `text_output`) or `embedding` (`/embeddings`: input `text_input`, one string per item;
    output `embedding`, FP32 [-1, D]). A model whose `predict` yields streams its chunks."""

    kind: Kind
    """chat, completion or embedding."""
    max_input_bytes: int = Field(DEFAULT_MAX_INPUT_BYTES, ge=1, le=64 * 1024 * 1024)
    """Longest text one request may hand the model, in UTF-8 bytes (the messages as JSON, the
    prompt, or all embedding inputs together); longer is refused with 400
    `context_length_exceeded`. Default 1 MiB."""
    dimensions: list[Annotated[int, Field(ge=1, le=1 << 20)]] = []
    """Embedding models trained to be cut short (Matryoshka): the sizes a request's
    `dimensions` may ask for; the embedding is cut to that size and scaled back to unit
    length. Without it, only the model's own size is accepted."""

    @model_validator(mode="before")
    @classmethod
    def _kind_alone(cls, data: Any) -> Any:
        """``openai: chat`` is ``openai: {kind: chat}`` (the notebook's ``openai="chat"``)."""
        return {"kind": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _dimensions_for_embeddings(self) -> OpenAISettings:
        if self.dimensions and self.kind != "embedding":
            raise ValueError("openai.dimensions applies to kind: embedding only")
        return self


@dataclass(frozen=True, slots=True)
class _Needs:
    """What one kind hands the model and reads back."""

    inputs: tuple[str, ...]
    """Inputs the model must have (BYTES)."""
    optional: tuple[str, ...]
    """Inputs it may have (BYTES, given when the request has something for them)."""
    output: str
    output_types: tuple[str, ...]


NEEDS: dict[str, _Needs] = {
    "chat": _Needs((MESSAGES,), (PARAMETERS,), TEXT_OUTPUT, ("BYTES",)),
    "completion": _Needs((TEXT_INPUT,), (PARAMETERS,), TEXT_OUTPUT, ("BYTES",)),
    "embedding": _Needs((TEXT_INPUT,), (), EMBEDDING, ("FP32", "FP16", "FP64")),
}


@dataclass(frozen=True, slots=True)
class Declared:
    """One tensor as a model declares it: a name, a datatype (None: not said) and whether
    a request may leave it out."""

    name: str
    datatype: str | None
    optional: bool = False


def misfits(
    kind: str, inputs: Iterable[Declared] | None, outputs: Iterable[Declared] | None
) -> list[str]:
    """Why tensors do not fit ``kind`` (empty: they fit). ``None`` for inputs or outputs
    means the model does not say (an ONNX model before it loads): nothing to check."""
    needs = NEEDS[kind]
    problems: list[str] = []
    if inputs is not None:
        by_name = {t.name: t for t in inputs}
        for name in needs.inputs + needs.optional:
            tensor = by_name.get(name)
            if tensor is None:
                if name in needs.inputs:
                    problems.append(f"needs an input {name!r} (BYTES)")
                continue
            if tensor.datatype is not None and _v2(tensor.datatype) != "BYTES":
                problems.append(f"input {name!r} must be BYTES, not {tensor.datatype}")
            if name in needs.optional and not tensor.optional:
                problems.append(f"input {name!r} must be optional: true")
        for tensor in by_name.values():
            if tensor.name not in needs.inputs + needs.optional and not tensor.optional:
                allowed = ", ".join(needs.inputs + needs.optional)
                problems.append(
                    f"input {tensor.name!r} is not handed to the model by a {kind} request "
                    f"({allowed}); make it optional: true or remove it"
                )
    if outputs is not None:
        found = {t.name: t for t in outputs}.get(needs.output)
        wanted = " or ".join(needs.output_types)
        if found is None:
            problems.append(f"needs an output {needs.output!r} ({wanted})")
        elif found.datatype is not None and _v2(found.datatype) not in needs.output_types:
            problems.append(f"output {needs.output!r} must be {wanted}, not {found.datatype}")
    return problems


def check_fits(
    kind: str, inputs: Iterable[Declared] | None, outputs: Iterable[Declared] | None
) -> None:
    """Raise ValueError (a config error) when declared tensors do not fit ``kind``."""
    problems = misfits(kind, inputs, outputs)
    if problems:
        raise ValueError(f"openai kind {kind!r}: " + "; ".join(problems))


def _v2(datatype: str) -> str:
    try:
        return from_config_name(datatype).name
    except InvalidArgument:
        return datatype
