"""The notebooks in ``notebooks/`` are tests: every cell must run, and the cells marked
``# NBVAL_CHECK_OUTPUT`` must print what the saved notebook shows (ports and timings sanitized
by ``notebooks/sanitize.cfg``).

nbval runs in a subprocess, with the command documented for running them by hand
(docs/notebook.md; notebooks/pytest.ini and notebooks/conftest.py hold nbval's options)::

    pytest notebooks/

so the kernels it starts, and the servers they start, never share this process. Notebook 05
(PyTorch) is in the torch tier (tests/needs.py's ``need_torch``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from needs import need_torch

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
TORCH_NOTEBOOK = "05-pytorch.ipynb"


def nbval_command(*paths: Path) -> list[str]:
    """``pytest notebooks/...``: nbval's options come from notebooks/pytest.ini."""
    return [sys.executable, "-m", "pytest", "-q", *map(str, paths)]


def run_nbval(*paths: Path) -> None:
    done = subprocess.run(
        nbval_command(*paths), cwd=ROOT, capture_output=True, text=True, timeout=840
    )
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-5000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]


def test_every_notebook_is_listed() -> None:
    found = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
    assert found == [
        "01-quickstart.ipynb", "02-add-models.ipynb", "03-protocols.ipynb",
        "04-to-production.ipynb", "05-pytorch.ipynb",
    ]  # fmt: skip


@pytest.mark.timeout(900)
def test_notebooks_run_under_nbval() -> None:
    """One nbval run over the notebooks that need no torch (a kernel per notebook, about 20 s
    in all)."""
    run_nbval(*sorted(p for p in NOTEBOOKS.glob("*.ipynb") if p.name != TORCH_NOTEBOOK))


@pytest.mark.torch
@pytest.mark.timeout(900)
def test_the_pytorch_notebook_runs_under_nbval() -> None:
    need_torch()
    run_nbval(NOTEBOOKS / TORCH_NOTEBOOK)
