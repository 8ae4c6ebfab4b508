"""Access tokens by API group: which requests need which token, checked in constant time.

Transport-neutral. Every route and gRPC method belongs to one :class:`ApiGroup`; each adapter
declares that next to the route (HTTP: the handler's ``opt``; gRPC: one table by method name)
and asks :meth:`AccessPolicy.check` with the ``Authorization`` value it received. Tokens are
resolved once at start from ``server.auth`` (an environment variable, a file, or, with a
warning from ``servekit validate``, the value itself), so a request never touches the
environment or the disk. A refusal is logged with the group and the client address only, and
at most once a second per group, so a client guessing tokens cannot flood the log.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from servekit.config.schema import AuthConfig, TokenSpec
from servekit.errors import Unauthenticated

log = logging.getLogger("servekit.auth")

GROUP_FIELDS = ("inference", "metadata", "repository", "admin")
"""The protectable groups, as ``server.auth`` names them."""
BEARER = b"bearer "
LOG_EVERY_SECONDS = 1.0


class ApiGroup(StrEnum):
    """What a request does, which decides the token it needs."""

    OPEN = "open"
    """Health and probes (live, ready, per-model ready) and the dashboard's static files."""
    INFERENCE = "inference"
    METADATA = "metadata"
    REPOSITORY = "repository"
    ADMIN = "admin"


class TokenError(ValueError):
    """A configured token cannot be resolved; ``field`` is its serve.yaml path."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(message)
        self.field = field_path


@dataclass
class _RefusalLog:
    """One WARNING a second per group at most; the rest are counted into the next line."""

    last: dict[ApiGroup, float] = field(default_factory=dict)
    suppressed: dict[ApiGroup, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def refused(self, group: ApiGroup, client: str, why: str) -> None:
        now = time.monotonic()
        with self.lock:
            if now - self.last.get(group, -LOG_EVERY_SECONDS) < LOG_EVERY_SECONDS:
                self.suppressed[group] = self.suppressed.get(group, 0) + 1
                return
            self.last[group] = now
            more = self.suppressed.pop(group, 0)
        extra = f" ({more} more refused since the last line)" if more else ""
        log.warning("refused a %s request from %s: %s%s", group.value, client, why, extra)


@dataclass(frozen=True)
class AccessPolicy:
    """The tokens in force: group -> the exact bytes a bearer token must equal."""

    tokens: Mapping[ApiGroup, bytes] = field(default_factory=dict)
    _log: _RefusalLog = field(default_factory=_RefusalLog, compare=False, repr=False)
    enabled: bool = field(init=False, compare=False)
    """Whether any group needs a token (if not, adapters skip the check entirely). A field,
    not a property: the inference fast path reads it on every request."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "enabled", bool(self.tokens))

    def protects(self, group: ApiGroup) -> bool:
        return group in self.tokens

    def allows(self, group: ApiGroup, authorization: bytes | str | None) -> bool:
        """Whether an ``Authorization`` header value (or gRPC metadata value) opens ``group``."""
        expected = self.tokens.get(group)
        if expected is None:
            return True
        presented = _bearer(authorization)
        # compare_digest takes time independent of where the two differ; comparing against
        # the expected value even when nothing was presented keeps the two paths alike.
        return hmac.compare_digest(presented or b"", expected) and presented is not None

    def check(self, group: ApiGroup, authorization: bytes | str | None, client: str) -> None:
        """Raise :class:`Unauthenticated` unless the request may use ``group``."""
        if self.allows(group, authorization):
            return
        why = "no bearer token" if _bearer(authorization) is None else "wrong token"
        self._log.refused(group, client, why)
        raise Unauthenticated(
            f"this {group.value} request needs a token: send 'Authorization: Bearer <token>' "
            f"(server.auth.{group.value})"
        )


def _bearer(value: bytes | str | None) -> bytes | None:
    """The token of ``Bearer <token>`` (scheme in any case), or None."""
    if value is None:
        return None
    raw = value.encode("latin-1", "replace") if isinstance(value, str) else value
    if len(raw) <= len(BEARER) or raw[: len(BEARER)].lower() != BEARER:
        return None
    token = raw[len(BEARER) :].strip()
    return token or None


def resolve_policy(
    auth: AuthConfig, base_dir: Path, environ: Mapping[str, str] | None = None
) -> AccessPolicy:
    """Read every configured token (environment or file); TokenError names the field."""
    env = os.environ if environ is None else environ
    tokens: dict[ApiGroup, bytes] = {}
    default = _resolve("default", auth.default, base_dir, env)
    for name in GROUP_FIELDS:
        value = _resolve(name, getattr(auth, name), base_dir, env) or default
        if value is not None:
            tokens[ApiGroup(name)] = value
    return AccessPolicy(tokens)


def _resolve(
    name: str, spec: TokenSpec | None, base_dir: Path, env: Mapping[str, str]
) -> bytes | None:
    if spec is None:
        return None
    where = f"server.auth.{name}"
    if isinstance(spec, str):
        return _valid(where, spec)
    if spec.env is not None:
        value = env.get(spec.env)
        if value is None:
            raise TokenError(where, f"environment variable {spec.env} is not set")
        return _valid(where, value)
    assert spec.file is not None  # TokenSource validates exactly one
    path = base_dir / spec.file
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise TokenError(where, f"cannot read token file {spec.file}: {reason}") from None
    return _valid(where, text)


def _valid(where: str, value: str) -> bytes:
    token = value.strip()
    if not token:
        raise TokenError(where, "the token is empty")
    if any(ord(c) < 0x21 or ord(c) > 0x7E for c in token):
        raise TokenError(where, "use printable ASCII without spaces (a token travels in a header)")
    return token.encode("ascii")


def clear_tokens(auth: AuthConfig) -> list[str]:
    """serve.yaml paths of tokens written in clear (for ``servekit validate``'s warning)."""
    names = ("default", *GROUP_FIELDS)
    return [f"server.auth.{n}" for n in names if isinstance(getattr(auth, n), str)]
