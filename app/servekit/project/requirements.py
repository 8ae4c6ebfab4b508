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
from importlib import metadata
from pathlib import Path

from servekit.config.loader import load_config

_OURS = {"app", "servekit"}


def pins(modules: set[str]) -> list[str]:
    """``name==version`` for the distributions providing ``modules`` (top-level names)."""
    providers = metadata.packages_distributions()
    found: dict[str, str] = {}
    for module in sorted(modules):
        if module in sys.stdlib_module_names or module in _OURS:
            continue
        for dist in providers.get(module, []):
            if dist.lower() == "servekit":
                continue
            try:
                found[dist] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
    return [f"{dist}=={version}" for dist, version in sorted(found.items(), key=_lower)]


def _lower(item: tuple[str, str]) -> str:
    return item[0].lower()


def text(modules: set[str]) -> str:
    lines = pins(modules)
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
    and written as packaging renders it; ConfigError when the file is not valid."""
    return list(load_config(serve_yaml).server.requirements)
