"""A saved project as files: serve.yaml, model files, Python sources, requirements.txt and a
Dockerfile, gathered first and then written in one go.

Its own module, apart from :mod:`servekit.project.save` (which reads what a server in this
process serves, runtimes included): ``servekit.connect(url).save(folder)`` writes one from
what a remote server tells over HTTP, and the client (app/servekit/client/) imports nothing of
a server; this module imports only config and the foundation.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from servekit.project import dockerfile, requirements
from servekit.project.source import MODULE, ModuleSource
from servekit.version import __version__


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
    """Top-level modules imported by the copied modules."""
    notes: list[str] = field(default_factory=list)
    """What the saved project lacks (e.g. files a remote server does not hand out)."""
    requirements: list[str] = field(default_factory=list)
    """serve.yaml's ``server.requirements`` of the server saved (packages its models need that
    no saved module imports): kept, so the saved project's image installs them too."""

    def write(self, folder: str | Path) -> Path:
        """Write the project into ``folder`` (created if needed; files of the same name and
        each saved model's own folder under ``models/`` are replaced)."""
        root = Path(folder).expanduser()
        root.mkdir(parents=True, exist_ok=True)
        for entry in self.models:
            uri = entry.get("storageUri")
            if isinstance(uri, str) and uri.startswith("models/"):
                shutil.rmtree(root / uri, ignore_errors=True)
        for relative, content in self.files.items():
            target = root / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        if self.source.definitions:
            (root / f"{MODULE}.py").write_text(self.source.text())
        modules = self.source.modules | self.imports
        (root / "requirements.txt").write_text(requirements.text(modules))
        (root / "serve.yaml").write_text(self.serve_yaml())
        (root / "Dockerfile").write_text(dockerfile.PROJECT_DOCKERFILE)
        (root / ".dockerignore").write_text(dockerfile.DOCKERIGNORE)
        return root

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
