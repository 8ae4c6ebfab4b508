"""The notebooks in ``notebooks/`` are tests: every cell must run, and the cells marked
``# NBVAL_CHECK_OUTPUT`` must print what the saved notebook shows (ports and timings sanitized
by ``notebooks/sanitize.cfg``).

nbval runs in a subprocess, exactly as documented for running it by hand::

    pytest --nbval-lax --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg notebooks/

so the kernels it starts, and the servers they start, never share this process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def nbval_command(*paths: Path) -> list[str]:
    return [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        "--nbval-lax", "--nbval-current-env",
        "--nbval-sanitize-with", str(NOTEBOOKS / "sanitize.cfg"),
        *map(str, paths),
    ]  # fmt: skip


def test_every_notebook_is_listed() -> None:
    found = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
    assert found == [
        "01-quickstart.ipynb", "02-add-models.ipynb", "03-protocols.ipynb",
        "04-to-production.ipynb", "05-pytorch.ipynb",
    ]  # fmt: skip


@pytest.mark.timeout(900)
def test_notebooks_run_under_nbval() -> None:
    """One nbval run over all notebooks (a kernel per notebook, about 20 s in all)."""
    done = subprocess.run(
        nbval_command(*sorted(NOTEBOOKS.glob("*.ipynb"))),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-5000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]
