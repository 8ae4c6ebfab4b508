"""The tokens of ``server.auth`` in exported manifests: read from a Kubernetes Secret, never
written into them.

The ConfigMap carries serve.yaml verbatim, so a token written in it in clear would sit in the
cluster (and in every Git repository the manifests go to) for anyone who can read a ConfigMap:
the export refuses it, naming the key. A source ``{env: VAR}`` becomes the container variable
VAR read from a key of the Secret ``<server name>-auth``; ``{file: PATH}`` becomes that key as a
file at PATH (the Secret mounted at PATH's folder; in serve.yaml's own folder, which a folder
mount would hide, just the one file). Ops create the Secret (:func:`secret_command`), so the
export never holds a token: it does not even read one.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from servekit.config.auth import GROUP_FIELDS
from servekit.config.schema import AuthConfig

Manifest = dict[str, object]

_NOT_IN_KEY = re.compile(r"[^-._a-zA-Z0-9]+")
"""A Secret key is letters, digits, '-', '_' and '.'."""
TOKEN_RECIPE = "python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > {key}"
"""One way to make a strong token, written to a file named after its key."""


class SecretError(ValueError):
    """``server.auth`` cannot be carried by the manifests as written (the message says why)."""


@dataclass(frozen=True)
class TokenKey:
    """One key of the Secret and the token source it feeds."""

    key: str
    field: str
    """``server.auth.<group>`` that first names the source (for messages)."""
    env: str | None = None
    file: str | None = None
    """The path as serve.yaml writes it (normalized), relative to serve.yaml unless absolute."""


def token_keys(auth: AuthConfig) -> list[TokenKey]:
    """Every distinct token source of ``server.auth`` with its Secret key, in serve.yaml order.

    A token in clear is refused, and so are two sources that would need one key.
    """
    keys: list[TokenKey] = []
    for name in ("default", *GROUP_FIELDS):
        spec = getattr(auth, name)
        where = f"server.auth.{name}"
        if spec is None:
            continue
        if isinstance(spec, str):
            raise SecretError(
                f"{where} is a token written in clear: the manifests would carry it in the "
                "ConfigMap for anyone who can read it. Give it as {env: VAR} or {file: PATH} "
                "and keep it in a Kubernetes Secret (docs/security.md, 'In a container and on "
                "Kubernetes')"
            )
        if spec.env is not None:
            found = TokenKey(_key(spec.env.lower().replace("_", "-")), where, env=spec.env)
        else:
            assert spec.file is not None  # TokenSource validates exactly one
            file = posixpath.normpath(spec.file)
            found = TokenKey(_key(posixpath.basename(file)), where, file=file)
        same = next((k for k in keys if k.key == found.key), None)
        if same is None:
            keys.append(found)
        elif (same.env, same.file) != (found.env, found.file):
            raise SecretError(
                f"{where} and {same.field} read different tokens that would share the Secret "
                f"key {found.key!r}; rename the variable or file of one of them"
            )
    return keys


def _key(text: str) -> str:
    return _NOT_IN_KEY.sub("-", text).strip("-") or "token"


def secret_command(auth: AuthConfig, secret: str) -> str | None:
    """What ops run once to create the Secret (no token in it: each comes from a file)."""
    keys = token_keys(auth)
    if not keys:
        return None
    files = " ".join(f"--from-file={k.key}=./{k.key}" for k in keys)
    return f"kubectl create secret generic {secret} {files}"


def secret_note(auth: AuthConfig, secret: str) -> str | None:
    """The stderr note of an export whose serve.yaml reads tokens."""
    command = secret_command(auth, secret)
    if command is None:
        return None
    first = token_keys(auth)[0].key
    return (
        f"server.auth reads its tokens from the Secret {secret}, which these manifests do not "
        "contain. Create it before applying them, from files named after their keys and "
        f"holding one token each (make one with: {TOKEN_RECIPE.format(key=first)}): {command}"
    )


@dataclass(frozen=True)
class ContainerTokens:
    """What the container gains: variables, volumes of the Secret and their mounts."""

    env: list[Manifest]
    volumes: list[Manifest]
    mounts: list[Manifest]


def container_tokens(
    auth: AuthConfig,
    secret: str,
    config_dir: str,
    *,
    used: Sequence[str],
    filled: Sequence[str] = (),
    mode: int | None = None,
) -> ContainerTokens:
    """The Secret's keys where serve.yaml expects them in a container whose serve.yaml lies in
    ``config_dir``. ``used`` are the container's own mount paths (a Secret folder may not hide
    one); ``filled`` are folders something else fills (KServe: the ConfigMap, the model), where
    a token file cannot go at all. ``mode`` is the files' permission bits (None: Kubernetes'
    default, 0644, for pods without an fsGroup)."""
    env: list[Manifest] = []
    folders: dict[PurePosixPath, list[tuple[TokenKey, PurePosixPath]]] = {}
    home = PurePosixPath(config_dir)
    for token in token_keys(auth):
        if token.env is not None:
            ref = {"name": secret, "key": token.key}
            env.append({"name": token.env, "valueFrom": {"secretKeyRef": ref}})
            continue
        assert token.file is not None
        path = PurePosixPath(posixpath.normpath(home / token.file))
        for taken in filled:
            if path.is_relative_to(taken):
                raise SecretError(
                    f"{token.field}: {path} lies in {taken}, which the cluster fills itself; "
                    "give the token file an absolute path in a folder of its own, such as "
                    "/var/run/secrets/servekit/token"
                )
        folders.setdefault(path.parent, []).append((token, path))
    volumes: list[Manifest] = []
    mounts: list[Manifest] = []
    for index, (folder, files) in enumerate(folders.items()):
        volume = f"auth-{index}"
        items = [{"key": token.key, "path": path.name} for token, path in files]
        source: Manifest = {"secretName": secret, "items": items}
        if mode is not None:
            source["defaultMode"] = mode
        volumes.append({"name": volume, "secret": source})
        if folder == home:  # a folder mount would hide serve.yaml and the models beside it
            mounts += [
                {"name": volume, "mountPath": str(path), "subPath": path.name, "readOnly": True}
                for _, path in files
            ]
            continue
        hidden = [p for p in (*used, config_dir) if PurePosixPath(p).is_relative_to(folder)]
        if hidden:
            raise SecretError(
                f"{files[0][0].field}: mounting the Secret at {folder} would hide {hidden[0]}; "
                "give the token file a folder of its own, such as /var/run/secrets/servekit"
            )
        mounts.append({"name": volume, "mountPath": str(folder), "readOnly": True})
    return ContainerTokens(env, volumes, mounts)
