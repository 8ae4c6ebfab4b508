"""The package is ``servekit`` (issue 16): an ``app.py`` beside the user's work cannot hide it.

Streamlit, Flask and Gradio users keep an ``app.py`` in their working folder; while servekit was
imported as ``app``, that file shadowed it (``python -m app serve`` even ran the user's file).
The code stays in the ``app/`` folder and pyproject.toml maps the name; ``import app`` still
works for a while, warns, and gives the very same modules.

Fast tier: the packaging list against the folders, the old name in this process. Slow tier
(subprocesses): a folder holding an app.py imports and serves servekit, ``python -m app`` still
runs, nothing in the repository still says ``app`` where it means the package, and a built wheel
installs ``servekit`` (and the ``app`` shim) with its data files and console script.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tomllib
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import start_server

import servekit

ROOT = Path(__file__).resolve().parent.parent

USERS_APP = """\
# A Streamlit / Flask / Gradio app file, as users keep them beside their models.
raise SystemExit("the user's app.py was imported")
"""

ADDER = """\
import numpy as np
from numpy.typing import NDArray


def add_one(x: NDArray[np.float32]) -> NDArray[np.float32]:
    return x + 1
"""

CONFIG = """\
models:
  - {name: local, modelFormat: {name: python}, entrypoint: "adder:add_one"}
  - {name: isolated, modelFormat: {name: python}, entrypoint: "adder:add_one",
     isolation: process}
"""


def run(
    *argv: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


# ---- packaging -------------------------------------------------------------------------------


def test_every_folder_of_app_is_packaged_as_servekit() -> None:
    """package-dir renames only the packages listed: a new subfolder must be listed too."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"servekit": "app", "app": "compat/app"}
    folders = {  # every folder holding Python code (app/project has no __init__.py)
        ".".join(("servekit", *p.parent.relative_to(ROOT / "app").parts))
        for p in (ROOT / "app").rglob("*.py")
    }
    assert sorted(setuptools["packages"]) == sorted([*folders, "app"])
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"servekit": "servekit.cli:main"}


def test_the_checkout_finds_servekit_in_app() -> None:
    """A source checkout on the path (tests, worktrees, mypy) reaches app/ through the symlink."""
    link = ROOT / "servekit"
    assert link.is_symlink() and os.readlink(link) == "app"
    assert Path(servekit.__file__).resolve() == (ROOT / "app" / "__init__.py").resolve()


# ---- the old name, in this process ---------------------------------------------------------


@pytest.fixture
def old_name() -> Iterator[None]:
    """Forget ``app`` afterwards, so that each test imports it (and is warned) afresh."""
    yield
    for name in [n for n in sys.modules if n == "app" or n.startswith("app.")]:
        del sys.modules[name]
    from servekit import _old_name

    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _old_name._SameModule)]


@pytest.mark.usefixtures("old_name")
def test_import_app_warns_at_the_importing_line_and_is_servekit() -> None:
    with pytest.warns(
        DeprecationWarning, match=r"`import app` is deprecated.*import servekit"
    ) as w:
        import app
    assert w[0].filename == __file__  # the user's own line, not servekit's or importlib's
    assert app is servekit
    assert app.serve is servekit.serve and app.connect is servekit.connect


@pytest.mark.usefixtures("old_name")
def test_modules_under_the_old_name_are_the_same_objects() -> None:
    with pytest.warns(DeprecationWarning):
        from app.export import kserve
    schema = importlib.import_module("app.config.schema")
    errors = importlib.import_module("app.errors")
    from servekit.config.schema import ServeConfig
    from servekit.errors import ServeError
    from servekit.export import kserve as same_module

    assert schema.ServeConfig is ServeConfig and errors.ServeError is ServeError
    assert kserve is same_module
    assert importlib.import_module("app.export.kserve") is sys.modules["servekit.export.kserve"]
    # Each module keeps its own spec and name: pickling, reload and -m see servekit.x.
    assert kserve.__name__ == "servekit.export.kserve"
    for module, name in ((kserve, "servekit.export.kserve"), (errors, "servekit.errors")):
        assert module.__spec__ is not None and module.__spec__.name == name


# ---- a folder holding an app.py -------------------------------------------------------------


@pytest.fixture
def users_folder(tmp_path: Path) -> Path:
    (tmp_path / "app.py").write_text(USERS_APP)
    (tmp_path / "adder.py").write_text(ADDER)
    (tmp_path / "serve.yaml").write_text(CONFIG)
    return tmp_path


@pytest.mark.slow
def test_import_servekit_beside_an_app_py(users_folder: Path) -> None:
    code = (
        "import servekit, servekit.server, servekit.cli, servekit.workers.supervisor\n"
        "import servekit.runtimes.isolated_child, servekit.notebook\n"
        "print(servekit.serve.__module__, servekit.connect.__module__)"
    )
    done = run(sys.executable, "-c", code, cwd=users_folder)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["servekit.notebook.api", "servekit.notebook.remote"]
    done = run(sys.executable, "-m", "servekit", "validate", "serve.yaml", cwd=users_folder)
    assert done.returncode == 0, done.stderr
    assert "OK, 2 model(s)" in done.stdout


@pytest.mark.slow
def test_a_folder_with_an_app_py_serves(users_folder: Path) -> None:
    """The server, and an isolated model's own process, run from the folder of the app.py."""
    server = start_server(users_folder / "serve.yaml", grpc=False)
    try:
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}
        with server.http_client(timeout=30) as client:
            for model in ("local", "isolated"):
                answer = client.post(f"/v2/models/{model}/infer", json=body)
                assert answer.status_code == 200, answer.text
                assert answer.json()["outputs"][0]["data"] == [2, 3]
    finally:
        assert server.stop() == 0, server.log()


@pytest.mark.slow
def test_python_m_app_still_runs(tmp_path: Path) -> None:
    done = run(sys.executable, "-m", "app", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "serve" in done.stdout


@pytest.mark.slow
def test_nothing_in_the_repository_still_imports_app() -> None:
    """Code, docs and notebooks merged after the rename say servekit (scripts/rename_package.py
    rewrites what they do not)."""
    done = run(sys.executable, "scripts/rename_package.py", "--check", cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


# ---- the wheel ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_wheel_installs_servekit(tmp_path: Path, users_folder: Path) -> None:
    """Built and installed as users get it (offline: no build isolation, no dependencies)."""
    wheels = tmp_path / "wheels"
    built = run(
        sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
        "--wheel-dir", str(wheels), str(ROOT), cwd=tmp_path,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("servekit-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "servekit/__init__.py", "servekit/__main__.py", "servekit/py.typed",
        "servekit/protos/grpc_service_pb2.py", "servekit/notebook/card.html.j2",
        "servekit/dashboard/templates/dashboard_base.html", "app/__init__.py",
    } <= names  # fmt: skip
    assert not {n for n in names if n.startswith("app/") and n != "app/__init__.py"}
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "servekit = servekit.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()

    # A venv that sees the dependencies installed here, with the wheel installed into it.
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=False)
    python = str(env_dir / "bin" / "python")
    # --ignore-installed: the servekit of this environment shows through; the venv gets its own.
    installed = run(
        sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
        "--ignore-installed", "-q", str(wheel), cwd=tmp_path,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # not this checkout
    code = (
        "import warnings, servekit\n"
        f"assert servekit.__file__.startswith({str(env_dir)!r}), servekit.__file__\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    from app.server import ServeKit\n"
        "import servekit.server\n"
        "assert ServeKit is servekit.server.ServeKit and w[0].category is DeprecationWarning\n"
        "print(servekit.serve.__module__)"
    )
    done = run(python, "-c", code, cwd=wheels, env=clean)  # not beside the app.py: old name
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "servekit.notebook.api"
    for command in ([python, "-m", "servekit"], [str(env_dir / "bin" / "servekit")]):
        done = run(*command, "--help", cwd=users_folder, env=clean)
        assert done.returncode == 0 and "serve" in done.stdout, done.stderr
        done = run(*command, "validate", "serve.yaml", cwd=users_folder, env=clean)
        assert done.returncode == 0, done.stderr
        assert "OK, 2 model(s)" in done.stdout and not done.stderr, done.stderr
