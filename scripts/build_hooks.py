"""setuptools hook: ship the dashboard's Jinja templates inside the wheel.

The contract keeps the templates in the repository's top-level ``templates/`` folder, but a
wheel can only carry files that live inside a package. This ``build_py`` copies ``templates/``
into ``servekit/dashboard/templates`` of the build (the package ``servekit``, whose code is
the ``app/servekit/`` folder), where ``servekit.dashboard.render`` looks first; a
source checkout (editable install, tests) reads ``templates/`` itself. No symlinks, nothing
copied into the source tree. Wired by ``[tool.setuptools] cmdclass`` in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools.command.build_py import build_py  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "templates"
TARGET = Path("servekit", "dashboard", "templates")  # in the build: the package name


class BuildPy(build_py):  # type: ignore[misc]
    """The standard build_py, plus the dashboard templates."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads templates/ in place
            return
        if not (TEMPLATES / "dashboard_base.html").is_file():
            raise RuntimeError(f"{TEMPLATES} is missing: the dashboard templates must ship")
        shutil.copytree(TEMPLATES, Path(self.build_lib) / TARGET, dirs_exist_ok=True)
