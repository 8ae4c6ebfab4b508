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

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from servekit.config.compiler import BUILTIN_RUNTIMES, ModelPlan
from servekit.config.schema import RuntimeConfig
from servekit.formats import onnx_files
from servekit.project import requirements
from servekit.project.files import NAME_RULE, Project, SaveError, check_names
from servekit.project.source import MODULE, SourceError
from servekit.runtimes.python import OBJECT_PREFIX, resolve_entrypoint

__all__ = [
    "NAME_RULE",
    "Project",
    "SaveError",
    "add_onnx_file",
    "check_names",
    "entry_of",
    "from_plans",
]


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
        if plan.pipeline:  # no files: its steps are models of the project
            entry.pop("modelFormat", None)
            project.models.append(entry)
            continue
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


ONE_FILE_FORMATS = ("sklearn", "xgboost", "lightgbm", "mlflow")
"""Tabular formats: a version is one file (an MLflow model: one folder), copied as it is, and
the library that loads it is pinned in requirements.txt."""


def _model_files(plan: ModelPlan, entry: dict[str, Any], project: Project) -> None:
    """Each served version's model file under models/<name>/<v>/ (a joblib file of a model
    add_model served natively, an XGBoost or LightGBM file, an MLflow model's folder), and
    the modules that load it for requirements.txt: the format's library, the modules a
    pickle names (a FunctionTransformer's numpy, ...), an MLflow model's own requirements."""
    folder_format = plan.implementation == "mlflow"
    served = [
        v
        for v in plan.versions
        if v.path is not None and (v.path.is_dir() if folder_format else v.path.is_file())
    ]
    if not served:
        raise SourceError(f"{plan.name}: no model file on disk")
    project.imports |= requirements.FORMAT_MODULES.get(plan.implementation, set())
    for version in served:
        assert version.path is not None
        folder = f"models/{plan.name}/{version.version}"
        if folder_format:
            _mlflow_folder(version.path, folder, project)
            continue
        project.files[f"{folder}/{version.path.name}"] = version.path.read_bytes()
        if plan.implementation == "sklearn":
            project.imports |= requirements.pickled_modules(version.path)
    entry["storageUri"] = f"models/{plan.name}"
    entry["versionPolicy"] = {"specific": {"versions": sorted(v.version for v in served)}}


def _mlflow_folder(path: Path, folder: str, project: Project) -> None:
    """An MLflow model's folder, file by file (links left out), and the distributions its
    requirements.txt names, pinned at the versions installed here."""
    for item in sorted(path.rglob("*")):
        if item.is_file() and not item.is_symlink():
            relative = item.relative_to(path).as_posix()
            project.files[f"{folder}/{relative}"] = item.read_bytes()
    listed = path / "requirements.txt"
    if listed.is_file():
        project.distributions |= requirements.distributions_in(listed.read_text())


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
