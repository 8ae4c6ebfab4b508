"""A saved project as files: serve.yaml, model files, Python sources, requirements.txt and a
Dockerfile, gathered first and then written in one go.

Its own module, apart from :mod:`servekit.project.save` (which reads what a server in this
process serves, runtimes included): ``servekit.connect(url).save(folder)`` writes one from
what a remote server tells over HTTP, and the client (app/servekit/client/) imports nothing of
a server; this module imports only config and the foundation. Nothing is written or removed
outside the folder: the model names may come from another server (``servekit save URL``), so
each must be a model name by serve.yaml's own rule, and every path the save replaces or writes
must resolve inside the folder (a saved model's own folder inside ``models/``) before anything
is touched.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from servekit.config.schema import MODEL_NAME
from servekit.project import dockerfile, requirements
from servekit.project.source import MODULE, ModuleSource
from servekit.version import __version__


class SaveError(ValueError):
    """Models that cannot be saved; the message names each one and why."""


NAME_RULE = (
    "letters, digits, '_', '.', '-', starting with a letter or digit, at most 128 characters"
)
"""serve.yaml's model-name rule (``MODEL_NAME``) in words, for the save's refusals."""


def check_names(names: Sequence[object]) -> None:
    """SaveError naming every entry of ``names`` that is not a model name serve.yaml accepts
    (a server's index is another program's answer: ``../x`` must not become a path)."""
    bad = [n for n in names if not isinstance(n, str) or not MODEL_NAME.fullmatch(n)]
    if bad:
        raise SaveError(
            "cannot save: the server names models that are not model names "
            f"({NAME_RULE}); nothing was written: " + ", ".join(repr(n) for n in bad)
        )


@dataclass
class Project:
    """What a saved folder holds, gathered before anything is written."""

    models: list[dict[str, Any]] = field(default_factory=list)
    runtimes: list[dict[str, Any]] = field(default_factory=list)
    """serve.yaml's own runtimes that the saved models name (built-in ones need no entry)."""
    files: dict[str, bytes] = field(default_factory=dict)
    """Path relative to the folder -> content (model files, copied modules)."""
    source: ModuleSource = field(default_factory=ModuleSource)
    imports: set[str] = field(default_factory=set)
    """Top-level modules imported by the copied modules (and that load the saved models)."""
    distributions: set[str] = field(default_factory=set)
    """Distributions the saved models name themselves (an MLflow model's requirements.txt)."""
    notes: list[str] = field(default_factory=list)
    """What the saved project lacks (e.g. files a remote server does not hand out)."""
    requirements: list[str] = field(default_factory=list)
    """serve.yaml's ``server.requirements`` of the server saved (packages its models need that
    no saved module imports): kept, so the saved project's image installs them too."""

    def write(self, folder: str | Path) -> Path:
        """Write the project into ``folder`` (created if needed; files of the same name and
        each saved model's own folder under ``models/`` are replaced).

        SaveError, before anything is written or removed, when a model name is not one
        serve.yaml accepts or a path would land outside ``folder``."""
        root = Path(folder).expanduser()
        replaced, written = self._targets(root)
        root.mkdir(parents=True, exist_ok=True)
        for target in replaced:
            shutil.rmtree(target, ignore_errors=True)
        for target, content in written:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        if self.source.definitions:
            (root / f"{MODULE}.py").write_text(self.source.text())
        modules = self.source.modules | self.imports
        (root / "requirements.txt").write_text(requirements.text(modules, self.distributions))
        (root / "serve.yaml").write_text(self.serve_yaml())
        (root / "Dockerfile").write_text(dockerfile.PROJECT_DOCKERFILE)
        (root / ".dockerignore").write_text(dockerfile.DOCKERIGNORE)
        return root

    def _targets(self, root: Path) -> tuple[list[Path], list[tuple[Path, bytes]]]:
        """The model folders to replace and the files to write, each checked to resolve
        inside ``root`` (the folders strictly inside ``root/models``, never it or ``root``)."""
        base = root.resolve()
        models = base / "models"
        problems: list[str] = []
        for entry in self.models:
            name = entry.get("name")
            if not isinstance(name, str) or not MODEL_NAME.fullmatch(name):
                problems.append(f"{name!r} is not a model name ({NAME_RULE})")
        replaced: list[Path] = []
        for entry in self.models:
            uri = entry.get("storageUri")
            if isinstance(uri, str) and uri.startswith("models/"):
                target = (base / uri).resolve()
                if target.parent != models:  # models/<name> itself, nothing above or below
                    problems.append(f"storageUri {uri!r} is not a model folder under models/")
                else:
                    replaced.append(target)
        written: list[tuple[Path, bytes]] = []
        for relative, content in self.files.items():
            target = (base / relative).resolve()
            if target == base or not target.is_relative_to(base):
                problems.append(f"file {relative!r} would be written outside the folder")
            else:
                written.append((target, content))
        if problems:
            raise SaveError(
                "cannot save (nothing was written or removed):\n"
                + "\n".join(f"  {p}" for p in problems)
            )
        return replaced, written

    def serve_yaml(self) -> str:
        header = (
            f"# Saved by servekit {__version__}. Serve it: servekit serve serve.yaml\n"
            "# Build its image: servekit build . (Dockerfile and requirements.txt beside it)\n"
        )
        notes = "".join(f"# NOTE: {note}\n" for note in self.notes)
        document: dict[str, Any] = {}
        if self.requirements:
            document["server"] = {"requirements": self.requirements}
        if self.runtimes:
            document["runtimes"] = self.runtimes
        document["models"] = self.models
        body: str = yaml.safe_dump(document, sort_keys=False, allow_unicode=True)
        return header + notes + body
