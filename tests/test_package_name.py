"""The package is ``servekit``, in ``app/servekit/``: an ``app.py`` beside the user's work cannot
hide it.

Streamlit, Flask and Gradio users keep an ``app.py`` in their working folder; a package called
``app`` would be shadowed by it. ``app/`` is only the source root (a src layout): a module's path
is its name, and the wheel installs ``servekit`` and nothing else at the top level.

Fast tier: the source layout. Slow tier (subprocesses): a folder holding an app.py imports and
serves servekit, and a built wheel installs ``servekit`` with its data files and console script.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
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


def test_a_modules_path_is_its_name() -> None:
    """app/ is the source root; nothing but servekit lives there, and no symlink joins names."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"servekit": "app/servekit"}
    assert [p.name for p in (ROOT / "app").iterdir() if p.name != "__pycache__"] == ["servekit"]
    assert not (ROOT / "servekit").exists() and not (ROOT / "app" / "__init__.py").exists()
    assert Path(servekit.__file__).resolve() == ROOT / "app" / "servekit" / "__init__.py"
    folders = {  # every folder holding Python code
        ".".join(p.parent.relative_to(ROOT / "app").parts) for p in (ROOT / "app").rglob("*.py")
    }
    assert sorted(setuptools["packages"]) == sorted(folders)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"servekit": "servekit.cli:main"}


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
    assert done.stdout.split() == ["servekit.notebook.api", "servekit.client.remote"]
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


# ---- the wheel ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_wheel_installs_servekit(tmp_path: Path, users_folder: Path) -> None:
    """Built and installed as users get it (offline: no build isolation, no dependencies).

    The wheel goes into a folder of its own (``pip install --target``) run with this
    interpreter, so the test passes inside a venv too: the dependencies are this
    environment's, the servekit is the wheel's (the checkout is not on the path)."""
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
        "servekit/protos/grpc_service_pb2.py", "servekit/client/card.html.j2",
        "servekit/dashboard/templates/dashboard_base.html",
    } <= names  # fmt: skip
    top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"servekit"}  # no generic top-level package (no `app`)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "servekit = servekit.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()

    target = tmp_path / "site"
    installed = run(
        sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
        "--target", str(target), str(wheel), cwd=tmp_path,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    # Only the wheel's folder on the path: an editable install of the checkout must not show.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    code = (
        "import servekit\n"
        f"assert servekit.__file__.startswith({str(target)!r}), servekit.__file__\n"
        "import servekit.server\n"
        "print(servekit.serve.__module__)"
    )
    done = run(sys.executable, "-c", code, cwd=wheels, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "servekit.notebook.api"
    done = run(sys.executable, "-m", "servekit", "--help", cwd=users_folder, env=env)
    assert done.returncode == 0 and "serve" in done.stdout, done.stderr
    done = run(
        sys.executable, "-m", "servekit", "validate", "serve.yaml", cwd=users_folder, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "OK, 2 model(s)" in done.stdout and not done.stderr, done.stderr
