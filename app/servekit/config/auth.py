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

from servekit.config.hosts import is_loopback
from servekit.config.schema import AuthConfig, TokenSpec
from servekit.errors import PermissionDenied, Unauthenticated

log = logging.getLogger("servekit.auth")

GROUP_FIELDS = ("inference", "metadata", "repository", "admin")
"""The protectable groups, as ``server.auth`` names them."""
BEARER = b"bearer "
TOKEN_ENV = "SERVEKIT_TOKEN"
"""Set in ``servekit serve``'s environment (or by ``--token``): the token of every API group but
health, unless serve.yaml gives a group its own (app/servekit/config/overrides.py). Clients
(``servekit.connect``, ``servekit bench``/``save``/``infer``) read the same variable."""
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
    """The tokens in force: group -> the exact bytes a bearer token must equal; and the groups
    closed to every request (``closed``: group -> why, see :func:`close_public_groups`)."""

    tokens: Mapping[ApiGroup, bytes] = field(default_factory=dict)
    closed: Mapping[ApiGroup, str] = field(default_factory=dict)
    """Groups without a token that no request may use (403), with the reason it is told."""
    _log: _RefusalLog = field(default_factory=_RefusalLog, compare=False, repr=False)
    enabled: bool = field(init=False, compare=False)
    """Whether any group needs a token or is closed (if not, adapters skip the check
    entirely). A field, not a property: the inference fast path reads it on every request."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "enabled", bool(self.tokens) or bool(self.closed))

    def protects(self, group: ApiGroup) -> bool:
        """Whether ``group`` has a token (a client holding it may use the group)."""
        return group in self.tokens

    def guards(self, group: ApiGroup) -> bool:
        """Whether some request of ``group`` is refused: it has a token, or it is closed."""
        return group in self.tokens or group in self.closed

    def allows(self, group: ApiGroup, authorization: bytes | str | None) -> bool:
        """Whether an ``Authorization`` header value (or gRPC metadata value) opens ``group``."""
        expected = self.tokens.get(group)
        if expected is None:
            return group not in self.closed
        presented = _bearer(authorization)
        # compare_digest takes time independent of where the two differ; comparing against
        # the expected value even when nothing was presented keeps the two paths alike.
        return hmac.compare_digest(presented or b"", expected) and presented is not None

    def check(self, group: ApiGroup, authorization: bytes | str | None, client: str) -> None:
        """Raise :class:`Unauthenticated` unless the request may use ``group``
        (:class:`PermissionDenied`, naming the token setting, when the group is closed)."""
        if self.allows(group, authorization):
            return
        reason = self.closed.get(group)
        if reason is not None:
            self._log.refused(group, client, "the group is closed")
            raise PermissionDenied(reason)
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


CLOSED_WHEN_PUBLIC = (ApiGroup.REPOSITORY, ApiGroup.ADMIN)
"""What a server beyond loopback closes when the group has no token: changing what it serves
(repository: load, unload, push, shared memory) and running it (admin: grps offline/online,
statistics, configuration, /metrics, the dashboard's benchmark). Inference, metadata and
health stay open: they are what a served model is for."""


def close_public_groups(
    policy: AccessPolicy, host: str, model_control: str | None = None
) -> AccessPolicy:
    """``policy`` with the groups of :data:`CLOSED_WHEN_PUBLIC` that have no token closed,
    when ``host`` (``server.host``) is reachable beyond this machine.

    On loopback only this machine's users reach the server, so a missing token opens the
    group, as before. Beyond it, a missing token used to mean "anyone on the network may take
    the server offline or load code"; now it means "nobody may", and the 403 says which
    setting opens it. ``server.modelControl: explicit`` written in serve.yaml keeps the
    repository group open: it is the explicit request that clients may load models.
    """
    if is_loopback(host):
        return policy
    closed: dict[ApiGroup, str] = {}
    for group in CLOSED_WHEN_PUBLIC:
        if policy.protects(group):
            continue
        if group is ApiGroup.REPOSITORY and model_control == "explicit":
            continue
        closed[group] = closed_reason(group, host)
    return AccessPolicy(policy.tokens, closed) if closed else policy


def closed_line(policy: AccessPolicy, host: str) -> str | None:
    """What ``servekit serve`` prints at start when groups are closed (None: none are)."""
    if not policy.closed:
        return None
    names = [g.value for g in policy.closed]
    settings = ", ".join(f"server.auth.{n}" for n in names)
    return (
        f"servekit: closed: the {' and '.join(names)} API{'s' if len(names) > 1 else ''} "
        f"({host} is beyond loopback and no token guards them; set {settings} or "
        f"server.auth.default, or start with --token / {TOKEN_ENV}, to open them to that token)"
    )


def closed_reason(group: ApiGroup, host: str) -> str:
    """Why a request of a closed ``group`` is refused, and the setting that opens it."""
    return (
        f"the {group.value} API is closed: the server listens on {host} (beyond loopback) "
        f"and no token guards it; set server.auth.{group.value} (or server.auth.default) "
        "and send 'Authorization: Bearer <token>'"
    )


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
