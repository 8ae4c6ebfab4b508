"""``server.save(folder)``: the models a server runs, written as a project that runs elsewhere.

The folder gets ``serve.yaml`` (one entry per model, its settings as served), the model files
(ONNX versions under ``models/<name>/<version>/``), the Python models (``notebook_models.py``
for what was defined in the notebook, copies of the project's own modules otherwise),
``requirements.txt`` (the packages that code imports, at the versions installed here), a
``Dockerfile`` and a ``.dockerignore``. ``servekit serve folder/serve.yaml`` then serves the
same models with the same outputs, and ``servekit build folder`` makes its image.

Nothing is written unless every model can be: a model whose source cannot be written (a lambda,
a closure ...) fails the save with every such model named. Nothing is written or removed outside
the folder either: the model names may come from another server (``servekit save URL``), so each
must be a model name by serve.yaml's own rule, and every path the save replaces or writes must
resolve inside the folder (a saved model's own folder inside ``models/``) before anything is
touched.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from servekit import __version__
from servekit.config.compiler import BUILTIN_RUNTIMES, ModelPlan
from servekit.config.schema import MODEL_NAME, RuntimeConfig
from servekit.project import dockerfile, requirements
from servekit.project.source import MODULE, ModuleSource, SourceError
from servekit.runtimes import onnx_files
from servekit.runtimes.python import OBJECT_PREFIX, resolve_entrypoint


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
    """Top-level modules imported by the copied modules."""
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
        (root / "requirements.txt").write_text(requirements.text(modules))
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


def entry_of(plan: ModelPlan) -> dict[str, Any]:
    """The serve.yaml entry of a served model, without where its files or code were."""
    assert plan.config is not None
    entry: dict[str, Any] = plan.config.model_dump(
        mode="json", by_alias=True, exclude_unset=True, exclude={"storage_uri", "entrypoint"}
    )
    entry["name"] = plan.name
    entry.setdefault("modelFormat", {"name": plan.format_name})
    return entry


def from_plans(
    plans: list[ModelPlan],
    runtimes: Sequence[RuntimeConfig] = (),
    requirements: Sequence[str] = (),
) -> Project:
    """A project of the models a server serves now (its ``served_plans``), with the declared
    ``runtimes`` (serve.yaml's ``runtimes:``) those models use and the server's
    ``requirements`` (``server.requirements``)."""
    project = Project(requirements=list(requirements))
    used = {plan.runtime for plan in plans}
    project.runtimes = [
        runtime.model_dump(mode="json", by_alias=True, exclude_unset=True)
        for runtime in runtimes
        if runtime.name in used and runtime not in BUILTIN_RUNTIMES
    ]
    problems: list[str] = []
    for plan in sorted(plans, key=lambda p: p.name):
        if plan.config is None:
            problems.append(f"{plan.name}: no settings to save")
            continue
        entry = entry_of(plan)
        try:
            if plan.implementation == "onnxruntime":
                _onnx(plan, entry, project)
            elif plan.implementation == "python":
                _python(plan, entry, project)
            elif plan.implementation in ONE_FILE_FORMATS:
                _model_files(plan, entry, project)
            else:
                problems.append(f"{plan.name}: runtime {plan.runtime} cannot be saved")
                continue
        except (SourceError, OSError) as exc:
            problems.append(str(exc))
            continue
        project.models.append(entry)
    if problems:
        raise SaveError(
            "cannot save these models (nothing was written):\n"
            + "\n".join(f"  {p}" for p in problems)
        )
    return project


def _onnx(plan: ModelPlan, entry: dict[str, Any], project: Project) -> None:
    """Each served version's model file (and its external data) under models/<name>/<v>/."""
    served = [v for v in plan.versions if v.path is not None and v.path.is_file()]
    if not served:
        raise SourceError(f"{plan.name}: no model file on disk")
    for version in served:
        assert version.path is not None
        add_onnx_file(project, plan.name, version.version, version.path.name, version.path)
    entry["storageUri"] = f"models/{plan.name}"
    versions = sorted(v.version for v in served)
    entry["versionPolicy"] = {"specific": {"versions": versions}}


ONE_FILE_FORMATS = ("sklearn", "xgboost", "lightgbm")
"""Tabular formats whose version is one file, copied as it is (an MLflow folder is not saved
yet)."""


def _model_files(plan: ModelPlan, entry: dict[str, Any], project: Project) -> None:
    """Each served version's model file under models/<name>/<v>/ (a joblib file of a model
    add_model served natively, an XGBoost or LightGBM file)."""
    served = [v for v in plan.versions if v.path is not None and v.path.is_file()]
    if not served:
        raise SourceError(f"{plan.name}: no model file on disk")
    for version in served:
        assert version.path is not None
        folder = f"models/{plan.name}/{version.version}"
        project.files[f"{folder}/{version.path.name}"] = version.path.read_bytes()
    entry["storageUri"] = f"models/{plan.name}"
    entry["versionPolicy"] = {"specific": {"versions": sorted(v.version for v in served)}}


def add_onnx_file(project: Project, name: str, version: int, file: str, path: Path) -> None:
    """One version's ONNX file and the external-data files it names (inside its folder)."""
    folder = f"models/{name}/{version}"
    data = path.read_bytes()
    project.files[f"{folder}/{file}"] = data
    proto = onnx_files.parse(data)
    for location in onnx_files.external_locations(proto) if proto is not None else ():
        extra = path.parent / location
        if extra.is_file() and extra.resolve().is_relative_to(path.parent.resolve()):
            project.files[f"{folder}/{location}"] = extra.read_bytes()


def _python(plan: ModelPlan, entry: dict[str, Any], project: Project) -> None:
    entrypoint = plan.entrypoint or ""
    label = f"model {plan.name!r}"
    if entrypoint.startswith(OBJECT_PREFIX):
        target = resolve_entrypoint(entrypoint)
        module = getattr(target, "__module__", None)
        if module not in (None, "__main__") and _copy_module(module, project):
            entry["entrypoint"] = f"{module}:{getattr(target, '__qualname__', '')}"
            return
        name = project.source.add(target, label)
        entry["entrypoint"] = f"{MODULE}:{name}"
        return
    module_name = entrypoint.partition(":")[0]
    if not _copy_module(module_name, project):
        # An installed package: requirements.txt names it, nothing to copy.
        project.imports.add(module_name.split(".")[0])
    entry["entrypoint"] = entrypoint


def _copy_module(module_name: str | None, project: Project) -> bool:
    """Copy a module of the user's own project (not an installed package) beside serve.yaml;
    False when it is installed (or unknown)."""
    import importlib.util

    if not module_name or "." in module_name:
        return False
    spec = importlib.util.find_spec(module_name)
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    if origin is None or not origin.is_file() or requirements.is_installed(origin):
        return False
    text = origin.read_bytes()
    project.files[f"{module_name}.py"] = text
    project.imports |= requirements.imports_of(text.decode("utf-8", "replace")) - {module_name}
    return True
