"""``import app``, the name servekit had before issue 16: still works, warns, same modules.

servekit's code used to be imported as ``app``, the very name Streamlit, Flask and Gradio users
give their own ``app.py``: such a file in the working folder shadowed the whole package. The
package is ``servekit`` now (pyproject.toml maps it onto the ``app/`` folder). ``import app``
keeps working for a while: it warns, then *is* ``servekit`` (``sys.modules["app"]`` is the
servekit module), and every ``app.x.y`` is the already imported ``servekit.x.y``: one copy of
each module, so ``app.serve is servekit.serve`` and a class checked with ``isinstance`` is the
same class under either name.

Two places call :func:`install`: ``compat/app/__init__.py``, which a built wheel or an editable
install ships as ``app``, and the top of ``app/__init__.py``, which runs as ``app`` when a
source checkout is on ``sys.path`` (its ``app/`` folder is importable under that name too).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import CodeType, ModuleType

OLD = "app"
NEW = "servekit"

WARNING = (
    "`import app` is deprecated: servekit's package is `servekit` now (`import servekit`, "
    "`servekit.serve(...)`, `python -m servekit`). The old name stops working in a later "
    "release; a file named app.py in the working folder already hides it."
)


class _SameModule(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``app.x.y`` and answers with the module ``servekit.x.y`` itself (imported if new)."""

    def find_spec(
        self,
        fullname: str,
        path: object = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(OLD + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(NEW + spec.name[len(OLD) :])
        # The import system stamps the spec it found onto the module it gets back; keep the
        # module's own spec (its real name and file) to put back in exec_module.
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        spec = module.__spec__
        if spec is not None and isinstance(spec.loader_state, importlib.machinery.ModuleSpec):
            module.__spec__ = spec.loader_state

    def get_code(self, fullname: str) -> CodeType | None:
        """The real module's code, for ``python -m app ...`` (runpy asks the loader for it)."""
        spec = importlib.util.find_spec(NEW + fullname[len(OLD) :])
        loader = spec.loader if spec is not None else None
        if not isinstance(loader, importlib.abc.InspectLoader):
            return None
        return loader.get_code(spec.name if spec is not None else fullname)


def install(name: str) -> None:
    """Make the module being imported as ``name`` (``app``) be ``servekit``, with a warning.

    Called from that module's own body: the import system hands out ``sys.modules[name]`` once
    the body has run, so replacing it there is what ``import app`` returns.
    """
    # stacklevel 3: past this function and the module body calling it, to the line that
    # imports ``app`` (the import machinery's own frames are skipped by warnings itself).
    warnings.warn(WARNING, DeprecationWarning, stacklevel=3)
    servekit = importlib.import_module(NEW)
    if not any(isinstance(finder, _SameModule) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SameModule())
    sys.modules[name] = servekit
