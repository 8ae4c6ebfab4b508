"""``servekit build --include-models``: remote models baked into a project's image.

By default a project image keeps serve.yaml's remote ``storageUri``s and the server fetches
them when the container starts (into ``server.storage.cacheDir``, a volume in Kubernetes).
With ``--include-models`` they are fetched now, on the building machine, through the server's
own cache code (app/servekit/models/remote.py: the same checks, the same cache, so a second
build of an unchanged remote downloads nothing), and a second, small build context is made:

    baked-models/<model name>/   the model's files (its folder of versions, or its one file)
    serve.yaml                   the project's serve.yaml, each remote storageUri replaced by
                                 its baked copy (the text is edited in place: comments stay)
    Dockerfile                   FROM the project image: copies the two into /srv

Why a second context rather than copying the project folder with the models into one: the
project folder is used as it is (its own Dockerfile and .dockerignore included), nothing is
written into it and nothing of it is copied; the models land in a layer of their own.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from servekit.config.remote_uris import remote_scheme
from servekit.config.schema import ServeConfig
from servekit.models.remote import fetch, shown_error
from servekit.models.remote_cache import MANIFEST, USED, cache_dir
from servekit.models.remote_progress import Download
from servekit.shown_paths import shown_uri

BAKED = "baked-models"
"""The folder under /srv (and the context) that holds baked models."""

BAKE_DOCKERFILE = f"""\
# A servekit project image with its remote models baked in (`servekit build --include-models`):
# the project image, plus the models fetched at build time and the serve.yaml naming them.
ARG PROJECT_IMAGE
FROM ${{PROJECT_IMAGE}}
COPY --chown=root:root {BAKED}/ /srv/{BAKED}/
COPY --chown=root:root serve.yaml /srv/serve.yaml
"""


class BakeError(RuntimeError):
    """A remote model could not be fetched for the image (the message holds no secret)."""


@dataclass(frozen=True)
class Baked:
    """What was baked: model name -> its new storageUri (relative to /srv)."""

    context: Path
    models: dict[str, str]


def remote_models(config: ServeConfig) -> dict[str, str]:
    """serve.yaml's models whose storageUri is remote: name -> URI."""
    return {
        model.name: model.storage_uri
        for model in config.models
        if model.storage_uri is not None and remote_scheme(model.storage_uri) is not None
    }


def bake(project: Path, config: ServeConfig, context: Path) -> Baked | None:
    """Fetch ``project``'s remote models and write the bake context into ``context`` (a new,
    empty folder). None when serve.yaml has no remote model."""
    wanted = remote_models(config)
    if not wanted:
        return None
    if (project / BAKED).exists():
        raise BakeError(f"the project has a {BAKED}/ of its own: that name is the baked models'")
    settings = config.server.storage
    root = cache_dir(settings, project)
    uris: dict[str, str] = {}
    for name, uri in wanted.items():
        shown = shown_uri(uri)
        print(f"servekit: fetching model {name} from {shown}", flush=True)
        try:
            location = fetch(uri, settings, root, download=Download(name, shown))
        except Exception as exc:  # any store's failure, worded without secrets
            raise BakeError(
                f"cannot fetch model {name} from {shown}: {shown_error(exc, uri)}"
            ) from None
        target = context / BAKED / name
        if location.is_dir():
            _copy_tree(location, target)
            uris[name] = f"{BAKED}/{name}"
        else:
            target.mkdir(parents=True)
            _copy(location, target / location.name)
            uris[name] = f"{BAKED}/{name}/{location.name}"
    text = (project / "serve.yaml").read_text(encoding="utf-8")
    (context / "serve.yaml").write_text(replace_storage_uris(text, uris), encoding="utf-8")
    (context / "Dockerfile").write_text(BAKE_DOCKERFILE)
    return Baked(context, uris)


def replace_storage_uris(text: str, uris: dict[str, str]) -> str:
    """serve.yaml ``text`` with the ``storageUri`` of each model in ``uris`` replaced, edited
    where the value is written (PyYAML's node marks), so comments and layout stay."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    spans: list[tuple[int, int, str]] = []
    for model in _items(_value(root, "models")):
        name, uri = _value(model, "name"), _value(model, "storageUri")
        named = isinstance(name, yaml.ScalarNode) and name.value in uris
        if named and isinstance(uri, yaml.ScalarNode) and isinstance(name, yaml.ScalarNode):
            spans.append((uri.start_mark.index, uri.end_mark.index, uris[name.value]))
    for start, end, value in sorted(spans, reverse=True):
        text = text[:start] + json.dumps(value) + text[end:]
    return text


def _value(node: yaml.Node | None, key: str) -> yaml.Node | None:
    if not isinstance(node, yaml.MappingNode):
        return None
    for k, v in node.value:
        if isinstance(k, yaml.ScalarNode) and k.value == key:
            return v
    return None


def _items(node: yaml.Node | None) -> list[yaml.Node]:
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _copy_tree(source: Path, target: Path) -> None:
    """A snapshot's files (not the cache's own bookkeeping), readable by the image's user."""
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if relative.parts[0] in (MANIFEST, USED) or path.is_symlink():
            continue
        if path.is_dir():
            (target / relative).mkdir(parents=True, exist_ok=True)
        elif path.is_file():
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            _copy(path, target / relative)
    for folder in [target, *(p for p in target.rglob("*") if p.is_dir())]:
        folder.chmod(0o755)


def _copy(source: Path, target: Path) -> None:
    """A copy, not a hard link: the engine reads the context, and a link would share the cache
    file's mode (which the copy sets to world-readable for user 10001)."""
    shutil.copyfile(source, target)
    os.chmod(target, 0o644)
