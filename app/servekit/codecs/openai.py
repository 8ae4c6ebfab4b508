"""OpenAI's API <-> a model's tensors: pure translation, no I/O (app/servekit/rest/openai.py
serves it).

Requests are checked the way OpenAI checks them (a wrong role, an empty ``messages``, ``n``
past 128 are 400s naming the field) and turned into the tensors CONTRACT fixes per kind
(app/servekit/config/openai.py): chat hands ``messages`` (the messages as JSON text), completion
``text_input`` (the prompt), both an optional ``parameters`` (every other request field as
JSON) when the model declares it; embedding hands ``text_input``, one string per item. A model
without a ``parameters`` input takes none of those fields: a request that sets one (to
anything but null, or ``n`` but 1) is refused rather than silently ignored. What the tensors
cannot carry back (log probabilities, echoed prompts) is refused for every model.

Answers are OpenAI's JSON objects: ``chat.completion`` and its ``chat.completion.chunk``
stream, ``text_completion`` (both), and the ``list`` of embeddings, as floats or as base64
of little-endian float32 (what the official client asks for when numpy is installed). With no
tokenizer on the server, usage counts whitespace-separated words of the text in and out.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from servekit.codecs.generate_json import fit_shape
from servekit.config.openai import MESSAGES, PARAMETERS, TEXT_INPUT, TEXT_OUTPUT, Declared
from servekit.config.openai import misfits as kind_misfits
from servekit.errors import Internal, InvalidArgument
from servekit.types import InferRequest, InferResponse, Tensor, TensorSpec

PREFIX = "/openai/v1"
"""Where the OpenAI routes live (KServe's prefix: ``/v1/models`` is KServe V1's)."""
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
MAX_N = 128
"""OpenAI's own bound on ``n``."""
MAX_PROMPTS = 128
"""Prompts one completion request may hold (each is its own model call)."""
MAX_EMBEDDING_INPUTS = 2048
"""OpenAI's bound on the items of one embeddings request."""
ALWAYS_FINE = frozenset({"model", "stream", "stream_options", "user", "n", "echo"})
"""Fields any model takes (``n`` only as 1): how the answer is sent, or who asked; servekit
honours ``echo`` itself (the prompt before the completion)."""
NOT_CARRIED = {"logprobs": "log probabilities", "top_logprobs": "log probabilities"}
"""Fields asking for something the answer tensors cannot carry: refused when set."""


class OpenAIInvalid(InvalidArgument):
    """A 400 naming the request field at fault (OpenAI's ``param``) and, where OpenAI has
    one, its ``code``."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.openai_code = code


@dataclass(slots=True)
class TextRequest:
    """A chat or completion request, checked: the texts the model is handed (chat: one, the
    messages as JSON; completion: one per prompt) and what the answer needs."""

    kind: str
    model: str
    texts: list[str]
    parameters: dict[str, Any]
    stream: bool
    include_usage: bool
    n: int
    prompt_words: list[int]
    """Words of each text's human-readable part (the messages' contents, a prompt)."""
    echo: bool = False
    """Completions: each choice starts with its prompt."""
    max_tokens: int | None = None
    """The request's ``max_tokens`` or ``max_completion_tokens`` (the smaller when both are
    set): a choice that reaches it finishes with ``"length"`` (:func:`finish_reason`)."""


@dataclass(slots=True)
class EmbeddingRequest:
    model: str
    texts: list[str]
    encoding_format: str
    dimensions: int | None
    words: int


@dataclass(slots=True)
class Reply:
    """What a text answer needs besides the texts: id, time, model."""

    kind: str
    model: str
    id: str = field(default="")
    created: int = 0

    def __post_init__(self) -> None:
        prefix = "chatcmpl-" if self.kind == "chat" else "cmpl-"
        self.id = prefix + uuid.uuid4().hex
        self.created = int(time.time())


# -- requests ---------------------------------------------------------------------------------
def _object(obj: object) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise OpenAIInvalid("the request body must be a JSON object")
    return obj


def _model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIInvalid("'model' is required: the name of a served model", "model")
    return model


def _stream(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise OpenAIInvalid("'stream' must be a boolean", "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise OpenAIInvalid(  # Triton's frontend's words
                "`stream_options` can only be used when `stream` is True", "stream_options"
            )
        if not isinstance(options, dict):
            raise OpenAIInvalid("'stream_options' must be an object", "stream_options")
        usage = options.get("include_usage", False)
        if not isinstance(usage, bool):
            raise OpenAIInvalid(
                "'stream_options.include_usage' must be a boolean", "stream_options.include_usage"
            )
        include_usage = usage
    return bool(stream), include_usage


def _n(body: dict[str, Any]) -> int:
    n = body.get("n")
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise OpenAIInvalid(f"'n' must be a whole number from 1 to {MAX_N}", "n")
    return n


RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}
"""OpenAI's bounds on the sampling fields (checked whichever model gets them)."""
MAX_STOPS = 4


def _sampling(body: dict[str, Any]) -> None:
    """OpenAI's own checks of the sampling fields: what a model gets is in its bounds."""
    for name, (low, high) in RANGES.items():
        value = body.get(name)
        if value is None:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not low <= value <= high
        ):
            raise OpenAIInvalid(f"'{name}' must be a number from {low:g} to {high:g}", name)
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise OpenAIInvalid(f"'{name}' must be a whole number of at least 1", name)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise OpenAIInvalid("'seed' must be a whole number", "seed")
    stop = body.get("stop")
    if (
        stop is not None
        and not isinstance(stop, str)
        and (
            not isinstance(stop, list)
            or len(stop) > MAX_STOPS
            or not all(isinstance(s, str) for s in stop)
        )
    ):
        raise OpenAIInvalid(
            f"'stop' must be a string or a list of at most {MAX_STOPS} strings", "stop"
        )


def _limit(body: dict[str, Any]) -> int | None:
    """The token limit the request sets (checked by :func:`_sampling`), if any."""
    limits = [body.get(name) for name in ("max_tokens", "max_completion_tokens")]
    set_ones = [limit for limit in limits if isinstance(limit, int)]
    return min(set_ones) if set_ones else None


def _not_carried(body: dict[str, Any]) -> None:
    for name, what in NOT_CARRIED.items():
        value = body.get(name)
        if value not in (None, False, 0):
            raise OpenAIInvalid(
                f"'{name}': servekit's OpenAI routes do not return {what}", name, "unsupported"
            )
    best_of = body.get("best_of")
    if best_of not in (None, 1):
        raise OpenAIInvalid("'best_of' other than 1 is not supported", "best_of", "unsupported")


def _parameters(body: dict[str, Any], text_field: str) -> dict[str, Any]:
    """Every field but the model and the text the model gets as its own tensor."""
    return {k: v for k, v in body.items() if k not in ("model", text_field)}


def decode_chat(obj: object) -> TextRequest:
    """A ``/chat/completions`` body, checked (messages, roles, stream options, n)."""
    body = _object(obj)
    model = _model(body)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise OpenAIInvalid("'messages' is required: a list of messages", "messages")
    if not messages:
        raise OpenAIInvalid("'messages' must hold at least one message", "messages", "empty_array")
    words = 0
    for index, message in enumerate(messages):
        where = f"messages.[{index}]"
        if not isinstance(message, dict):
            raise OpenAIInvalid(f"{where} must be an object with 'role' and 'content'", where)
        role = message.get("role")
        if role not in ROLES:
            raise OpenAIInvalid(
                f"{where}.role must be one of {', '.join(map(repr, ROLES))}, got {role!r}",
                f"{where}.role",
            )
        words += _content_words(message.get("content"), role, f"{where}.content")
    stream, include_usage = _stream(body)
    n = _n(body)
    _not_carried(body)
    _sampling(body)
    text = orjson.dumps(messages).decode()
    return TextRequest(
        "chat",
        model,
        [text],
        _parameters(body, MESSAGES),
        stream,
        include_usage,
        n,
        [words],
        max_tokens=_limit(body),
    )


def _content_words(content: object, role: object, where: str) -> int:
    if isinstance(content, str):
        return len(content.split())
    if content is None:
        if role in ("user", "system", "developer"):
            raise OpenAIInvalid(f"{where} is required for a {role} message", where)
        return 0  # an assistant message with tool calls
    if isinstance(content, list):
        words = 0
        for part in content:
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise OpenAIInvalid(f"{where}: each part is an object with a 'type'", where)
            text = part.get("text")
            if isinstance(text, str):
                words += len(text.split())
        return words
    raise OpenAIInvalid(f"{where} must be a string or a list of parts", where)


def decode_completion(obj: object) -> TextRequest:
    """A ``/completions`` body, checked: text prompts (one, or a list), stream options, n."""
    body = _object(obj)
    model = _model(body)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, int | list) for p in prompt):
        raise OpenAIInvalid(
            "'prompt' as token IDs is not supported: the model is handed text, send the prompt "
            "as a string",
            "prompt",
            "unsupported",
        )
    else:
        raise OpenAIInvalid("'prompt' is required: a string or a list of strings", "prompt")
    if len(prompts) > MAX_PROMPTS:
        raise OpenAIInvalid(f"'prompt' holds at most {MAX_PROMPTS} prompts", "prompt")
    stream, include_usage = _stream(body)
    n = _n(body)
    _not_carried(body)
    _sampling(body)
    echo = body.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise OpenAIInvalid("'echo' must be a boolean", "echo")
    return TextRequest(
        "completion",
        model,
        prompts,
        _parameters(body, "prompt"),
        stream,
        include_usage,
        n,
        [len(p.split()) for p in prompts],
        bool(echo),
        _limit(body),
    )


def decode_embeddings(obj: object) -> EmbeddingRequest:
    """An ``/embeddings`` body, checked: a string or a list of (non-empty) strings."""
    body = _object(obj)
    model = _model(body)
    raw = body.get("input")
    if isinstance(raw, str):
        texts = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(t, str) for t in raw):
        texts = list(raw)
    elif isinstance(raw, list) and raw and all(isinstance(t, int | list) for t in raw):
        raise OpenAIInvalid(
            "'input' as token IDs is not supported: the model is handed text, send strings",
            "input",
            "unsupported",
        )
    else:
        raise OpenAIInvalid("'input' is required: a string or a non-empty list of strings", "input")
    if len(texts) > MAX_EMBEDDING_INPUTS:
        raise OpenAIInvalid(f"'input' holds at most {MAX_EMBEDDING_INPUTS} items", "input")
    if any(not t for t in texts):
        raise OpenAIInvalid("'input' cannot hold an empty string", "input")
    encoding = body.get("encoding_format", "float")
    if encoding is None:
        encoding = "float"
    if encoding not in ("float", "base64"):
        raise OpenAIInvalid("'encoding_format' must be 'float' or 'base64'", "encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (
        isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
    ):
        raise OpenAIInvalid("'dimensions' must be a positive whole number", "dimensions")
    known = {"model", "input", "encoding_format", "dimensions", "user"}
    for name, value in body.items():
        if name not in known and value is not None:
            raise OpenAIInvalid(f"unrecognized request argument supplied: {name}", name)
    return EmbeddingRequest(model, texts, encoding, dimensions, sum(len(t.split()) for t in texts))


def check_size(texts: Iterable[str], limit: int, param: str) -> None:
    """Refuse text longer than the model takes (serve.yaml ``openai.maxInputBytes``)."""
    size = sum(len(t.encode()) for t in texts)
    if size > limit:
        raise OpenAIInvalid(
            f"the input is {size} bytes; this model takes at most {limit} bytes of text "
            "(serve.yaml openai.maxInputBytes)",
            param,
            "context_length_exceeded",
        )


def check_model(kind: str, name: str, signature_inputs: tuple[TensorSpec, ...],
                signature_outputs: tuple[TensorSpec, ...]) -> None:  # fmt: skip
    """The loaded model's tensors fit its kind (else a 400 saying what the model lacks)."""
    problems = kind_misfits(
        kind,
        [Declared(s.name, s.datatype, s.optional) for s in signature_inputs],
        [Declared(s.name, s.datatype) for s in signature_outputs],
    )
    if problems:
        raise OpenAIInvalid(
            f"model {name!r} is declared openai kind {kind!r} but its tensors do not fit: "
            + "; ".join(problems),
            "model",
        )


def refuse_unused(request: TextRequest, takes_parameters: bool) -> None:
    """A model without a ``parameters`` input takes none of the other fields: refuse one
    that is set rather than answer as if it had been honoured."""
    if takes_parameters:
        return
    for name, value in request.parameters.items():
        if value is None or name in ALWAYS_FINE:
            continue
        raise OpenAIInvalid(
            f"model {request.model!r} takes no '{name}' (it has no 'parameters' input)",
            name,
            "unsupported",
        )
    if request.n != 1:
        raise OpenAIInvalid(
            f"model {request.model!r} answers one choice ('n' must be 1: it has no "
            "'parameters' input to be told more)",
            "n",
            "unsupported",
        )


def text_request(
    request: TextRequest, text: str, inputs: tuple[TensorSpec, ...], takes_parameters: bool
) -> InferRequest:
    """The model's request for one text (the messages, or one prompt)."""
    name = MESSAGES if request.kind == "chat" else TEXT_INPUT
    specs = {s.name: s for s in inputs}
    tensors = [_bytes_tensor(specs[name], [text.encode()])]
    if takes_parameters:
        encoded = orjson.dumps(request.parameters)
        tensors.append(_bytes_tensor(specs[PARAMETERS], [encoded]))
    return InferRequest(request.model, tensors)


def embedding_request(request: EmbeddingRequest, inputs: tuple[TensorSpec, ...]) -> InferRequest:
    spec = next(s for s in inputs if s.name == TEXT_INPUT)
    return InferRequest(request.model, [_bytes_tensor(spec, [t.encode() for t in request.texts])])


def _bytes_tensor(spec: TensorSpec, items: list[bytes]) -> Tensor:
    shape = fit_shape(spec.name, spec.shape, len(items))
    data = np.empty(len(items), dtype=object)
    data[:] = items
    return Tensor(spec.name, "BYTES", shape, data.reshape(shape))


# -- answers ----------------------------------------------------------------------------------
def choices_of(response: InferResponse, n: int) -> list[str]:
    """The texts of one response, one per choice: ``text_output`` with ``n`` elements, or
    (n = 1) any number of pieces joined."""
    output = next((t for t in response.outputs if t.name == TEXT_OUTPUT), None)
    if output is None:
        raise Internal(f"model {response.model_name!r} gave no {TEXT_OUTPUT!r}")
    pieces = [_text(item) for item in np.asarray(output.data, dtype=object).reshape(-1)]
    if len(pieces) == n:
        return pieces
    if n == 1:
        return ["".join(pieces)]
    raise Internal(
        f"model {response.model_name!r} gave {len(pieces)} texts in {TEXT_OUTPUT!r} for n={n} "
        "(give one per choice)"
    )


def _text(item: object) -> str:
    if isinstance(item, bytes):
        return item.decode("utf-8", errors="replace")
    return str(item)


def finish_reason(text: str, chunks: int, limit: int | None) -> str:
    """``"length"`` when the choice reached the request's token limit, else ``"stop"``.

    With no tokenizer on the server, a choice's tokens are counted as the chunks the model
    gave it (a generator model yields one per step, as an LLM yields tokens) or its words
    when there are more of those (a model that answers once): a model that honours
    ``max_tokens`` in either unit is reported cut when it was. A request without a limit
    always finishes with ``"stop"``: a model's own limit is its own to say."""
    if limit is not None and max(chunks, len(text.split())) >= limit:
        return "length"
    return "stop"


def usage(prompt_words: int, completion_words: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_words,
        "completion_tokens": completion_words,
        "total_tokens": prompt_words + completion_words,
    }


def words(texts: Iterable[str]) -> int:
    return sum(len(t.split()) for t in texts)


def answer(
    reply: Reply,
    texts: list[str],
    prompt_words: int,
    echoed: list[str] | None = None,
    finishes: list[str] | None = None,
) -> dict[str, Any]:
    """The whole (non-streamed) answer: one choice per text, in order (each after its
    ``echoed`` prompt, which usage does not count as completion), each with its
    ``finishes`` reason (default ``"stop"``)."""
    reasons = finishes if finishes is not None else ["stop"] * len(texts)
    completion_words = words(texts)
    if echoed is not None:
        texts = [prompt + text for prompt, text in zip(echoed, texts, strict=True)]
    if reply.kind == "chat":
        choices: list[dict[str, Any]] = [
            {
                "index": i,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": reasons[i],
            }
            for i, text in enumerate(texts)
        ]
        kind = "chat.completion"
    else:
        choices = [
            {"index": i, "text": text, "logprobs": None, "finish_reason": reasons[i]}
            for i, text in enumerate(texts)
        ]
        kind = "text_completion"
    return {
        "id": reply.id,
        "object": kind,
        "created": reply.created,
        "model": reply.model,
        "choices": choices,
        "usage": usage(prompt_words, completion_words),
        "system_fingerprint": None,
    }


def chunk(
    reply: Reply,
    index: int,
    text: str | None,
    finish: str | None = None,
    first: bool = False,
    with_usage: bool = False,
) -> dict[str, Any]:
    """One streamed chunk: a piece of choice ``index`` (chat's first carries the role), or
    its end (``finish``)."""
    if reply.kind == "chat":
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {"index": index, "delta": delta}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text or ""}
        kind = "text_completion"
    choice["logprobs"] = None
    choice["finish_reason"] = finish
    out = {
        "id": reply.id,
        "object": kind,
        "created": reply.created,
        "model": reply.model,
        "choices": [choice],
        "system_fingerprint": None,
    }
    if with_usage:
        out["usage"] = None
    return out


def usage_chunk(reply: Reply, prompt_words: int, completion_words: int) -> dict[str, Any]:
    """The last chunk ``stream_options.include_usage`` asks for: no choices, the usage."""
    return {
        "id": reply.id,
        "object": "chat.completion.chunk" if reply.kind == "chat" else "text_completion",
        "created": reply.created,
        "model": reply.model,
        "choices": [],
        "usage": usage(prompt_words, completion_words),
        "system_fingerprint": None,
    }


def embeddings_of(
    response: InferResponse, count: int, dimensions: int | None, allowed: Iterable[int]
) -> np.ndarray:
    """The [count, D] float32 embeddings of a response, cut to ``dimensions`` (and scaled
    back to unit length) when the model allows that size."""
    output = next((t for t in response.outputs if t.name == "embedding"), None)
    if output is None or output.data.size == 0 or output.data.size % count:
        raise Internal(
            f"model {response.model_name!r} gave no [{count}, D] 'embedding' for {count} inputs"
        )
    matrix = np.asarray(output.data, dtype=np.float32).reshape(count, -1)
    size = matrix.shape[1]
    if dimensions is None or dimensions == size:
        return matrix
    sizes = sorted(d for d in allowed if d < size)
    if dimensions not in sizes:
        offered = ", ".join(map(str, [*sizes, size]))
        raise OpenAIInvalid(
            f"model {response.model_name!r} makes embeddings of {size} dimensions; "
            f"'dimensions' may be {offered} (serve.yaml openai.dimensions)",
            "dimensions",
        )
    cut = matrix[:, :dimensions]
    norms = np.linalg.norm(cut, axis=1, keepdims=True)
    return np.asarray(cut / np.maximum(norms, 1e-12), dtype=np.float32)


def embeddings_answer(
    model: str, matrix: np.ndarray, encoding_format: str, prompt_words: int
) -> dict[str, Any]:
    """The ``list`` of embeddings: floats, or base64 of little-endian float32."""
    data: list[dict[str, Any]] = []
    for index, row in enumerate(matrix):
        if encoding_format == "base64":
            vector: Any = base64.b64encode(row.astype("<f4").tobytes()).decode("ascii")
        else:
            vector = row.tolist()
        data.append({"object": "embedding", "index": index, "embedding": vector})
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_words, "total_tokens": prompt_words},
    }


def model_entry(name: str, created: int) -> dict[str, Any]:
    """One row of ``/models``."""
    return {"id": name, "object": "model", "created": created, "owned_by": "servekit"}


ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    501: "invalid_request_error",
    504: "timeout_error",
}


def under_prefix(path: str) -> bool:
    """Whether a request path is one of the OpenAI routes' (whose clients read OpenAI's error
    shape, even for a path or method servekit does not offer there)."""
    return path == PREFIX or path.startswith(PREFIX + "/")


MAX_SHOWN_PATH = 200
"""Characters of a request's path an error repeats."""


def routing_error(status: int, method: str, path: str, allowed: str | None) -> dict[str, Any]:
    """OpenAI's answer to a path it does not serve (404, OpenAI's words) or a method the path
    does not take (405, naming the ones it does)."""
    shown = path if len(path) <= MAX_SHOWN_PATH else path[:MAX_SHOWN_PATH] + "…"
    if status == 405:
        takes = f": it takes {allowed}" if allowed else ""
        return error_body(405, f"Invalid method {method} for URL {shown}{takes}")
    return error_body(status, f"Invalid URL ({method} {shown})")


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error object for ``status``."""
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
