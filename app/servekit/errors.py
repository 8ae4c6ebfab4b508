"""Transport-neutral errors raised by the core.

The core says *what* went wrong with a code; each adapter maps codes to its own status through one
table (HTTP status in app/servekit/rest, gRPC status in app/servekit/grpc), and a test checks both
tables cover every code. No HTTP or gRPC numbers live here."""

from __future__ import annotations

import logging
import secrets
from enum import StrEnum


class ErrorCode(StrEnum):
    """What kind of failure, independent of transport."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    UNAVAILABLE = "UNAVAILABLE"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    INTERNAL = "INTERNAL"
    OVERLOADED = "OVERLOADED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"


NAME_SHOWN = 80
"""Characters of a client-given name an error message repeats (:func:`shown_name`)."""
MESSAGE_SHOWN = 2000
"""Longest message an error carries: gRPC sends it in a trailer, and a client refuses trailers
over its metadata limit (8 KiB by default) with RESOURCE_EXHAUSTED, hiding the real error."""


# Every code -> its HTTP status. In the foundation, not the HTTP adapter: the server answers
# with it (app/servekit/rest/errors.py) and the client reads it backwards
# (app/servekit/client/transport.py), and a client must not import the HTTP server.
HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_ARGUMENT: 400,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.RESOURCE_EXHAUSTED: 413,
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.PERMISSION_DENIED: 403,
    ErrorCode.UNIMPLEMENTED: 501,
    ErrorCode.ALREADY_EXISTS: 409,
    ErrorCode.INTERNAL: 500,
    ErrorCode.OVERLOADED: 429,
    ErrorCode.DEADLINE_EXCEEDED: 504,
}


def shown_name(name: object) -> str:
    """``repr(name)`` for an error message, cut to about :data:`NAME_SHOWN` characters.

    Names come from clients and can be any size (a 1 MB model name); every error that repeats a
    name goes through here, so the answer stays small and says how long the name was."""
    text = repr(name)
    if len(text) <= NAME_SHOWN:
        return text
    size = len(name) if isinstance(name, str | bytes) else len(text)
    return f"{text[: NAME_SHOWN - 20]}... ({size} characters)"


def clipped(message: str) -> str:
    """``message`` cut to :data:`MESSAGE_SHOWN` characters (its head and tail kept)."""
    if len(message) <= MESSAGE_SHOWN:
        return message
    half = MESSAGE_SHOWN // 2 - 20
    cut = len(message) - 2 * half
    return f"{message[:half]} ...({cut} characters cut)... {message[-half:]}"


class ServeError(Exception):
    """Base of every error the core raises on purpose; ``message`` is shown to the client
    (at most :data:`MESSAGE_SHOWN` characters: a backstop for text echoed from a request)."""

    code: ErrorCode = ErrorCode.INTERNAL
    retry_after_seconds: int | None = None
    """When set, how long the client should wait before trying again (HTTP ``Retry-After``)."""

    def __init__(self, message: str) -> None:
        message = clipped(message)
        super().__init__(message)
        self.message = message


class InvalidArgument(ServeError):
    """The client sent something malformed or inconsistent with the model."""

    code = ErrorCode.INVALID_ARGUMENT


class NotFound(ServeError):
    """Unknown model, version or resource."""

    code = ErrorCode.NOT_FOUND


class Unavailable(ServeError):
    """The model exists but is not ready (loading, failed, unloading); with
    ``retry_after_seconds`` when it is known to be ready by then (a model loading on demand)."""

    code = ErrorCode.UNAVAILABLE

    def __init__(self, message: str, retry_after_seconds: int | None = None) -> None:
        super().__init__(message)
        if retry_after_seconds is not None:
            self.retry_after_seconds = max(1, retry_after_seconds)


class ResourceExhausted(ServeError):
    """A size or queue limit was hit."""

    code = ErrorCode.RESOURCE_EXHAUSTED


class Overloaded(ServeError):
    """A model's queue is full (``maxQueueSize``): try again shortly.

    Distinct from ResourceExhausted (a request too large, which retrying does not fix): this
    one is HTTP 429 with ``Retry-After`` and gRPC RESOURCE_EXHAUSTED, so clients back off and
    retry instead of waiting on a queue that only grows.
    """

    code = ErrorCode.OVERLOADED

    def __init__(self, message: str, retry_after_seconds: int = 1) -> None:
        super().__init__(message)
        self.retry_after_seconds: int = max(1, retry_after_seconds)


class DeadlineExceeded(ServeError):
    """The request's deadline (client deadline, ``timeout`` parameter, queue timeout or
    ``server.requestTimeoutSeconds``) passed before it could be answered."""

    code = ErrorCode.DEADLINE_EXCEEDED


class Unauthenticated(ServeError):
    """The request lacks the token its API group needs (or carries a wrong one)."""

    code = ErrorCode.UNAUTHENTICATED


class PermissionDenied(ServeError):
    """The server's settings forbid this operation whoever asks (e.g. modelControl: none)."""

    code = ErrorCode.PERMISSION_DENIED


class Unimplemented(ServeError):
    """The operation exists in the protocol but this server does not offer it."""

    code = ErrorCode.UNIMPLEMENTED


class AlreadyExists(ServeError):
    """A resource with that name already exists."""

    code = ErrorCode.ALREADY_EXISTS


class Internal(ServeError):
    """A failure inside the server or inside user model code."""

    code = ErrorCode.INTERNAL


# -- Triton's wording ---------------------------------------------------------------------------
# Triton's clients and example programs check these texts (``message().startswith("Request for
# unknown model")``, ``"failed to load" in message``, ...), so the errors they check begin with
# Triton's words, and servekit's own detail, when there is any, follows them.


def unknown_model(name: object, version: object = None, detail: str = "") -> NotFound:
    """A model (or a version of it) this server does not have."""
    where = f" version {version}" if version is not None else ""
    text = f"Request for unknown model: {shown_name(name)}{where} is not found"
    return NotFound(f"{text}; {detail}" if detail else text)


def version_not_integral(version: str, detail: str = "") -> InvalidArgument:
    """A version string that is not a number (nor one of the model's named versions)."""
    text = (
        f"failed to get model version from specified version string {shown_name(version)}, "
        "version should be an integral value > 0"
    )
    return InvalidArgument(f"{text}; {detail}" if detail else text)


def contents_with_raw(input_name: str, model: str) -> InvalidArgument:
    """A gRPC input with typed ``contents`` in a request that also carries raw contents."""
    return InvalidArgument(
        f"contents field must not be specified when using raw_input_contents for "
        f"{shown_name(input_name)} for model {shown_name(model)}"
    )


POLL_FAILED = "failed to poll from model repository"
"""Triton's words, after "failed to load '<model>', ", for a load naming a model it cannot find
or files it cannot use (Triton's tests and example programs look for them)."""


def load_failed(name: str, error: ServeError) -> ServeError:
    """``error`` (same code) led by Triton's "failed to load '<model>', "."""
    prefix = f"failed to load {shown_name(name)}"
    if error.message.startswith(prefix):
        return error
    return type(error)(f"{prefix}, {error.message}")


def logged_reference(logger: logging.Logger, exc: BaseException, what: str) -> str:
    """Log ``exc`` (with its traceback) under a fresh short random reference; return it."""
    reference = secrets.token_hex(6)
    logger.error("%s (reference %s)", what, reference, exc_info=exc)
    return reference


def internal_error(logger: logging.Logger, exc: BaseException, where: str) -> str:
    """Log an unexpected exception; return what the client is told instead of its text.

    The exception's text never reaches the client: it may hold absolute paths, secrets or
    internals. The reference is in both the answer and the log line, so whoever sees the error
    can find its details (and traceback) in the server log.
    """
    reference = logged_reference(logger, exc, f"internal error in {where}")
    return f"internal error (reference {reference}; the server log has the details)"
