"""Every code block of README.md and docs/*.md runs (issue 40): an example cannot drift from
the code.

```python blocks are executed, ```bash / ```sh blocks run in bash (``-e``: every command must
succeed; a pipeline is judged by its last command, as in a reader's shell), ```yaml blocks are
serve.yaml files or fragments checked with ``servekit validate``;
```text, ```console, ```json and unlabelled fences are output or illustrations and do not run.
Each test is named by the block's page and line (``docs/models.md:467``), and a failure says
that place first. The blocks of a page run, in order, in the page's own folder: a copy of the
repository's tracked files (what a reader's clone holds), plus the files that ``file`` blocks
of the page show. What a block needs besides its text is said by a marker above it
(tests/docs_blocks.py, listed in docs/development.md); blocks that run a process or need a
server are in the slow tier, the others (yaml, plain Python) in the fast one.

Completing a fragment, the one documented way: a yaml block whose top level is a list is a
list of models (put under ``models:``); a block with no ``models:`` gets ``models: []``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from docs_blocks import (
    NOT_CODE,
    PYTHON,
    ROOT,
    RUN,
    Block,
    addresses,
    all_blocks,
    blocks_of,
    compile_python,
    copy_checkout,
    write_stand_ins,
)
from needs import missing
from servers import ServerProcess, start_server
from waits import wait_until

BLOCKS = all_blocks()
RUNNABLE = [b for b in BLOCKS if b.language in RUN]

SETUPS = {
    # docs/notebook.md's scikit-learn example: a fitted classifier and test rows, and a server
    # (the page folder's serve.yaml) to add it to.
    "iris": """
import servekit
from sklearn.datasets import load_iris
from sklearn.ensemble import RandomForestClassifier

X, y = load_iris(return_X_y=True)
X_train, X_test, y_train = X[::2], X[1::2], y[::2]
clf = RandomForestClassifier(n_estimators=10, random_state=0).fit(X_train, y_train)
server = servekit.serve("serve.yaml")
""",
    # docs/models.md's MLServer client: the churn pipeline of issue 40 (text column `plan`,
    # numbers `age` and `spend`) fitted on a DataFrame `df`, served on the block's port 8000.
    "churn": """
import os

import pandas as pd
import servekit
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import GradientBoostingClassifier
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

df = pd.DataFrame(
    {
        "plan": ["basic", "pro", "team", "basic", "pro", "team", "basic", "pro"],
        "age": [23, 45, 31, 52, 38, 29, 61, 44],
        "spend": [12.0, 80.5, 45.0, 9.5, 70.0, 51.5, 15.0, 66.0],
    }
)
churned = [1, 0, 0, 1, 0, 0, 1, 0]
churn = Pipeline(
    [
        ("columns", ColumnTransformer([("plan", OneHotEncoder(), ["plan"]),
                                       ("numbers", StandardScaler(), ["age", "spend"])])),
        ("model", GradientBoostingClassifier(n_estimators=10, random_state=0)),
    ]
).fit(df, churned)
server = servekit.serve(None, http_port=int(os.environ["DOCS_HTTP_PORT"]), grpc_port=None)
server.add_model("churn", churn, example=df)
""",
}
"""What the ``setup NAME`` marker runs before a Python block, in the block's namespace."""


def _param(block: Block) -> Any:
    marks: list[Any] = [pytest.mark.slow] if block.slow else []
    if block.language in ("bash", "sh"):
        marks.append(pytest.mark.timeout(900))  # a benchmark or valgrind's count: minutes
    return pytest.param(block, id=f"{block.where}-{block.language}", marks=marks)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def page_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {}


def page_folder(folders: dict[str, Path], factory: pytest.TempPathFactory, page: str) -> Path:
    """The folder a page's blocks run in (made on first use): the checkout's files and the
    page's ``file`` blocks."""
    if page not in folders:
        folder = copy_checkout(factory.mktemp(page.replace("/", "-")))
        for block in blocks_of(ROOT / page):
            name = block.markers.get("file")
            if name:
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                (folder / name).write_text(block.source)
        folders[page] = folder
    return folders[page]


@pytest.fixture(scope="module")
def example_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The repository's serve.yaml, served (the ``server`` marker)."""
    folder = copy_checkout(tmp_path_factory.mktemp("example-server"))
    process = start_server(folder / "serve.yaml")
    yield process
    assert process.stop() == 0, process.log()


def _ports_of(server: ServerProcess) -> tuple[int, int]:
    grpc = server.grpc_target or "127.0.0.1:0"
    return int(server.http_url.rsplit(":", 1)[1]), int(grpc.rsplit(":", 1)[1])


def test_every_fence_runs_or_is_output() -> None:
    """A fence of another language (say ```toml) must be given a runner here or be ```text."""
    assert len(RUNNABLE) > 40, "the docs' blocks were not found"
    unknown = [f"{b.where}: ```{b.language}" for b in BLOCKS if b.language not in RUN | NOT_CODE]
    assert not unknown, "fences with no runner (run them here, or make them ```text):\n" + (
        "\n".join(unknown)
    )


@pytest.mark.parametrize("block", [_param(b) for b in RUNNABLE])
def test_block(
    block: Block,
    request: pytest.FixtureRequest,
    page_folders: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = page_folder(page_folders, tmp_path_factory, block.page)
    for variable in list(os.environ):  # the shell running the tests must not change a block
        if variable.upper().startswith("SERVEKIT_"):
            monkeypatch.delenv(variable)
    ports = (free_port(), free_port())
    if "server" in block.markers:
        ports = _ports_of(request.getfixturevalue("example_server"))
    if block.language == "python":
        _run_python(block, folder, ports, monkeypatch)
    elif block.language in ("bash", "sh"):
        _run_shell(block, folder, ports, tmp_path)
    else:
        _check_yaml(block, folder, tmp_path)


def _run_python(
    block: Block, folder: Path, ports: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    code = compile_python(block)
    if "file" in block.markers:
        return  # a module the page's other blocks use: compiled here, run by them
    if "setup" in block.markers:
        _run_with_setup(block, folder, ports)
        return
    if "server" in block.markers:  # its addresses made the test server's, lines kept
        code = compile_python(_with_source(block, addresses(block.source, *ports)))
    monkeypatch.chdir(folder)
    # A block starting a server of its own (servekit.serve) must not take port 8000.
    monkeypatch.setenv("SERVEKIT_SERVER__HTTPPORT", "0")
    monkeypatch.setenv("SERVEKIT_SERVER__GRPCPORT", "0")
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # an example may warn, as it would for its reader
        try:
            exec(code, namespace)
        finally:
            server = namespace.get("server")
            if server is not None and hasattr(server, "stop"):
                server.stop()


RUN_WITH_SETUP = """import sys, warnings
setup, setup_file, page, block_file = sys.argv[1:5]
warnings.simplefilter("default")  # an example may warn, as it would for its reader
namespace = {"__name__": "__docs__"}
try:
    exec(compile(open(setup_file).read(), f"<setup {setup}>", "exec"), namespace)
    exec(compile(open(block_file).read(), page, "exec"), namespace)
finally:
    server = namespace.get("server")
    if server is not None and hasattr(server, "stop"):
        server.stop()
"""
"""A setup and its block, run in one namespace of a fresh interpreter."""


def _run_with_setup(block: Block, folder: Path, ports: tuple[int, int]) -> None:
    """The setup, then the block, in a fresh Python as the reader's kernel is: the test
    process has imported clients a reader's notebook need not (tritonclient's gRPC protos and
    MLServer's cannot share one process). The block's localhost:8000 is the setup's server
    (``DOCS_HTTP_PORT``); a server the setup starts from serve.yaml takes a free port."""
    name = block.markers["setup"]
    scratch = folder / ".docs-test"
    scratch.mkdir(exist_ok=True)
    (scratch / "run.py").write_text(RUN_WITH_SETUP)
    (scratch / f"setup-{name}.py").write_text(SETUPS[name])
    source = "\n" * (block.source_line - 1) + addresses(block.source, *ports)
    (scratch / f"block-{block.line}.py").write_text(source)
    env = {
        **{k: v for k, v in os.environ.items() if not k.upper().startswith("SERVEKIT_")},
        "SERVEKIT_SERVER__HTTPPORT": "0",
        "SERVEKIT_SERVER__GRPCPORT": "0",
        "DOCS_HTTP_PORT": str(ports[0]),
        "DOCS_GRPC_PORT": str(ports[1]),
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT / "app"), os.environ.get("PYTHONPATH")])
        ),
    }
    done = subprocess.run(
        [PYTHON, str(scratch / "run.py"), name, str(scratch / f"setup-{name}.py"),
         str(ROOT / block.page), str(scratch / f"block-{block.line}.py")],
        cwd=folder, env=env, capture_output=True, text=True, timeout=600,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, (
        f"{block.where}: the ```python block (after setup {name}) exited {done.returncode}\n"
        f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-6000:]}"
    )


def _with_source(block: Block, source: str) -> Block:
    return Block(block.page, block.line, block.language, source, block.source_line,
                 block.markers)  # fmt: skip


def _run_shell(block: Block, folder: Path, ports: tuple[int, int], scratch: Path) -> None:
    stand_ins = write_stand_ins(scratch / "bin")
    pids, log, containers = scratch / "pids", scratch / "background.log", scratch / "containers"
    pids.touch()
    containers.touch()
    env = {
        **{k: v for k, v in os.environ.items() if not k.upper().startswith("SERVEKIT_")},
        "PATH": f"{stand_ins}{os.pathsep}{Path(PYTHON).parent}{os.pathsep}{os.environ['PATH']}",
        "DOCS_PYTHON": PYTHON,
        "GIT_AUTHOR_NAME": "docs test",
        "GIT_AUTHOR_EMAIL": "docs@test.invalid",
        "GIT_COMMITTER_NAME": "docs test",
        "GIT_COMMITTER_EMAIL": "docs@test.invalid",
        "DOCS_WAIT": str(stand_ins / "wait_url.py"),
        "DOCS_KUBECTL": str(stand_ins / "kubectl.py"),
        "DOCS_KUBECTL_APPLIED": str(scratch / "kubectl-applied"),
        "DOCS_TESTS_DIR": str(Path(__file__).resolve().parent),
        "DOCS_CONTAINERS": str(containers),
        # podman as this machine needs it (docs/ops.md's containers.conf), unless set already.
        "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(stand_ins / "containers.conf")),
        "DOCS_PIDS": str(pids),
        "DOCS_LOG": str(log),
        "DOCS_HTTP_PORT": str(ports[0]),
        "DOCS_GRPC_PORT": str(ports[1]),
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT / "app"), os.environ.get("PYTHONPATH")])
        ),
    }
    for command, package in NEEDS.items():
        if command in block.source and shutil.which(command) is None:
            missing(command, f"apt-get install {package}")
    if re.search(CONTAINERS, block.source) and shutil.which("podman") is None:
        missing("podman", "apt-get install buildah podman runc mmdebstrap")
    if "git" in block.markers:
        _make_repository(folder, env)
    script = scratch / "block.sh"
    script.write_text(addresses(block.source, *ports))
    try:
        done = subprocess.run(
            ["bash", "-e", str(script)],
            cwd=folder, env=env, capture_output=True, text=True, timeout=900,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        _stop_background(pids)
        _remove_containers(containers, env)
    shown = log.read_text(errors="replace")[-4000:] if log.exists() else ""
    expected = int(block.markers.get("exit") or 0)
    assert done.returncode == expected, (
        f"{block.where}: the ```{block.language} block exited {done.returncode}"
        f" (expected {expected})\n"
        f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}\n"
        f"--- what it started in the background\n{shown}"
    )


NEEDS = {"valgrind": "valgrind", "callgrind_annotate": "valgrind", "taskset": "util-linux"}
"""System commands a shell block may name, with their Debian package (tests/needs.py)."""
CONTAINERS = r"\bdocker\b|\bpodman\b|servekit build|make-base-image"
"""What in a shell block builds or runs an image: podman does (the docker stand-in too)."""


def _make_repository(folder: Path, env: dict[str, str]) -> None:
    """The page's folder as a clone would be: a git repository, every file committed (once)."""
    if (folder / ".git").exists():
        return
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the checkout"]):
        subprocess.run(["git", *command], cwd=folder, env=env, check=True, capture_output=True)


def _stop_background(pids: Path) -> None:
    """Stop what the stand-ins started (SIGTERM, as a user's Ctrl-C would), bounded."""
    for pid in (int(p) for p in pids.read_text().split()):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        wait_until(lambda pid=pid: _gone(pid), 30, f"background process {pid} to stop")


def _remove_containers(names: Path, env: dict[str, str]) -> None:
    """Remove the containers the ``docker run`` stand-in started (stopped already, as a rule:
    SIGTERM to ``podman run`` reaches the server in it)."""
    for name in names.read_text().split():
        subprocess.run(["podman", "rm", "-f", "-t", "3", "--ignore", name], env=env,
                       capture_output=True, timeout=60, check=False)  # fmt: skip


def _gone(pid: int) -> bool:
    """Exited (a zombie waiting for its parent counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def complete(text: str) -> str:
    """A serve.yaml fragment made a file (the module docstring's rule)."""
    data = yaml.safe_load(text)
    if isinstance(data, list):
        return "models:\n" + "".join(f"  {line}\n" for line in text.splitlines())
    if isinstance(data, dict) and "models" not in data:
        return text.rstrip("\n") + "\nmodels: []\n"
    return text


def _check_yaml(block: Block, folder: Path, scratch: Path) -> None:
    from servekit.cli import main
    from servekit.config.loader import parse_config

    text = complete(block.source)
    if "loader" in block.markers:
        parse_config(text, block.where)
        return
    config = folder / f"docs-block-{block.line}.yaml"
    config.write_text(text)
    out, err = scratch / "out", scratch / "err"
    with out.open("w") as stdout, err.open("w") as stderr:
        done = _validate(main, config, stdout, stderr)
    said = _on_the_page(block, config, text, err.read_text() + out.read_text())
    assert done == 0, f"{block.where}: servekit validate exited {done}\n{said}"


def _on_the_page(block: Block, config: Path, text: str, said: str) -> str:
    """validate's output with each ``<file>:<line>`` made the page's own line."""
    added = text.count("\n") - block.source.count("\n") if text.startswith("models:\n  ") else 0

    def page_line(match: re.Match[str]) -> str:
        return f"{block.page}:{block.source_line + int(match.group(1)) - 1 - added}"

    return re.sub(re.escape(str(config)) + r":(\d+)", page_line, said)


@pytest.mark.slow
@pytest.mark.parametrize(
    "block",
    [pytest.param(b, id=f"{b.where}-served") for b in RUNNABLE if "serve" in b.markers],
)
def test_served(
    block: Block, page_folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A yaml block marked ``serve`` (validated by test_block) is served from its page's
    folder, and every model in it becomes READY."""
    folder = page_folder(page_folders, tmp_path_factory, block.page)
    config = folder / f"docs-block-{block.line}-served.yaml"
    config.write_text(complete(block.source))
    _serve_all_ready(block, config)


def _validate(main: Any, config: Path, stdout: Any, stderr: Any) -> int:
    import contextlib

    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        return int(main(["validate", str(config)]))


def _serve_all_ready(block: Block, config: Path) -> None:
    server = start_server(config, wait_ready=False)
    try:
        with httpx.Client(base_url=server.http_url, timeout=10) as client:

            def settled() -> bool:
                rows = client.post("/v2/repository/index", json={}).json()
                return all(r["state"] in ("READY", "UNAVAILABLE") for r in rows)

            wait_until(settled, 60, "every model to load")
            rows = client.post("/v2/repository/index", json={}).json()
            names = {r["name"] for r in rows}
            bad = [r for r in rows if r["state"] != "READY"]
            not_ready = [n for n in names if not client.get(f"/v2/models/{n}/ready").json()]
        assert not bad and not not_ready, (
            f"{block.where}: not ready when served: {bad or not_ready}"
        )
    finally:
        assert server.stop() == 0, server.log()
