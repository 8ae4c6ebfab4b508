"""What a project image installs: ``requirements.txt`` of a saved project (the packages its
model code imports, pinned) and serve.yaml's ``server.requirements`` (:func:`declared`).

Module names become distribution names through ``importlib.metadata.packages_distributions``
(``sklearn`` -> ``scikit-learn``) and are pinned at the versions installed here, so the image
runs the code with what the notebook ran it with. The standard library and servekit itself
(the image has it) are left out.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Set
from importlib import metadata
from pathlib import Path

from servekit.config.loader import load_config

_OURS = {"app", "servekit"}


def pins(modules: set[str], distributions: Set[str] = frozenset()) -> list[str]:
    """``name==version`` for the distributions providing ``modules`` (top-level names) and
    for ``distributions`` (names), at the versions installed here (one not installed here is
    left out: nothing to pin it to)."""
    providers = metadata.packages_distributions()
    wanted = set(distributions)
    for module in sorted(modules):
        if module in sys.stdlib_module_names or module in _OURS:
            continue
        wanted.update(providers.get(module, []))
    found: dict[str, str] = {}
    for dist in wanted:
        if dist.lower() == "servekit":
            continue
        try:
            found[metadata.metadata(dist)["Name"]] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return [f"{dist}=={version}" for dist, version in sorted(found.items(), key=_lower)]


def distributions_in(text: str) -> set[str]:
    """The distribution names a requirements.txt lists (an MLflow model's own): options,
    URLs and lines packaging cannot read are left out."""
    from packaging.requirements import InvalidRequirement, Requirement

    names: set[str] = set()
    for raw in text.splitlines():
        line = raw.split("#")[0].strip()
        if not line or line.startswith("-"):
            continue
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.url is None:
            names.add(requirement.name)
    return names


def _lower(item: tuple[str, str]) -> str:
    return item[0].lower()


def text(modules: set[str], distributions: Set[str] = frozenset()) -> str:
    lines = pins(modules, distributions)
    header = (
        "# The packages the saved models import, at the versions they were saved with\n"
        "# (servekit itself comes with the image's base).\n"
    )
    return header + "".join(f"{line}\n" for line in lines)


def imports_of(source: str) -> set[str]:
    """Top-level names of the modules a source file imports (relative imports left out)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def is_installed(path: Path) -> bool:
    """Whether a file belongs to the Python installation (stdlib or site-packages)."""
    resolved = path.resolve()
    roots = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return "site-packages" in resolved.parts or any(resolved.is_relative_to(r) for r in roots)


def declared(serve_yaml: str | Path) -> list[str]:
    """``server.requirements`` of a serve.yaml, each entry checked (no options, URLs or paths)
    and written as packaging renders it, then what its models' formats need
    (:func:`format_extras`); ConfigError when the file is not valid."""
    config = load_config(serve_yaml)
    listed = list(config.server.requirements)
    formats = {m.model_format.name for m in config.models}
    return listed + [r for r in format_extras(formats) if r not in listed]


FORMAT_MODULES = {
    "sklearn": {"sklearn", "joblib"},
    "xgboost": {"xgboost"},
    "lightgbm": {"lightgbm"},
    "mlflow": {"mlflow"},
}
"""The modules each tabular format loads its models with (pinned in a saved project)."""


def format_extras(formats: set[str]) -> list[str]:
    """The requirements of servekit's extras named like ``formats`` (``servekit[sklearn]``
    -> ``scikit-learn>=1.3``, ...), read from servekit's installed metadata: a project image
    (servekit's image plus the project) installs the libraries its models' formats load
    with, whether serve.yaml or requirements.txt names them or not."""
    from packaging.requirements import Requirement

    try:
        listed = metadata.requires("servekit") or []
    except metadata.PackageNotFoundError:
        return []
    found: list[str] = []
    for line in listed:
        requirement = Requirement(line)
        marker = requirement.marker
        if marker is None:
            continue
        for extra in sorted(formats & set(FORMAT_MODULES)):
            if marker.evaluate({"extra": extra}):
                requirement.marker = None
                text = str(requirement)
                if text not in found:
                    found.append(text)
                break
    return found


def pickled_modules(path: Path) -> set[str]:
    """Top-level modules a pickle (or an uncompressed joblib file) names, read without
    loading it (pickletools: no code runs); empty when the file cannot be read that way."""
    import pickletools

    names: set[str] = set()
    strings: list[str] = []
    try:
        with path.open("rb") as handle:
            for opcode, arg, _ in pickletools.genops(handle):
                if opcode.name in ("GLOBAL", "INST") and isinstance(arg, str):
                    names.add(arg.split(" ")[0].split(".")[0])
                elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                    names.add(strings[-2].split(".")[0])
                elif isinstance(arg, str):
                    strings.append(arg)
    except Exception:  # joblib's arrays after the pickle, compression, ...: what was read counts
        pass
    return {n for n in names if n.isidentifier()}
