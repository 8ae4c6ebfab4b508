"""A new user's first commands, as subprocesses (issue 27): ``servekit init`` writes a project
that ``servekit serve`` serves as written, and ``servekit infer`` calls it with ``--data`` and
``--json``; bad input and a token the server wants are said in one line, never a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from servers import start_server

pytestmark = pytest.mark.slow


def servekit(
    *argv: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servekit", *argv],
        cwd=cwd, capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_init_then_serve_then_infer(tmp_path: Path) -> None:
    done = servekit("init", "project", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    project = tmp_path / "project"
    server = start_server(project / "serve.yaml")
    try:
        url = server.http_url
        by_data = servekit("infer", url, "starter", "--data", "1,2,3,0,0,0", cwd=tmp_path)
        assert by_data.returncode == 0, by_data.stderr
        scores = json.loads(by_data.stdout)["output"]
        assert scores == pytest.approx([0.5 - 0.5 + 3 + 0.1, 0.1])
        tensor = {"name": "features", "shape": [1, 3], "datatype": "FP32", "data": [2, 0, 0]}
        body = json.dumps({"inputs": [tensor]})
        for given in ('{"features": [[2, 0, 0]]}', body):
            by_json = servekit("infer", url, "starter", "--json", given, cwd=tmp_path)
            assert by_json.returncode == 0, by_json.stderr
            assert json.loads(by_json.stdout)["output"] == pytest.approx([1.1])
        short = servekit("infer", url, "starter", "--data", "1,2", cwd=tmp_path)
        assert short.returncode == 1
        assert "2 number(s) do not fill input 'features'" in short.stderr
        unknown = servekit("infer", url, "nope", "--data", "1", cwd=tmp_path)
        assert unknown.returncode == 1 and "nope" in unknown.stderr
        for out in (short, unknown):
            assert "Traceback" not in out.stderr
    finally:
        assert server.stop() == 0, server.log()


def test_infer_sends_the_token(tmp_path: Path) -> None:
    assert servekit("init", cwd=tmp_path).returncode == 0
    server = start_server(tmp_path / "serve.yaml", extra=("--token", "first-hour-token-1"))
    try:
        refused = servekit("infer", server.http_url, "starter", "--data", "1,2,3", cwd=tmp_path)
        assert refused.returncode == 1 and "token" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
        flag = ("--token", "first-hour-token-1")
        served = servekit(
            "infer", server.http_url, "starter", "--data", "1,2,3", *flag, cwd=tmp_path
        )
        assert served.returncode == 0, served.stderr
        env = {"SERVEKIT_TOKEN": "first-hour-token-1"}
        from_env = servekit(
            "infer", server.http_url, "starter", "--data", "1,2,3", cwd=tmp_path, env=env
        )
        assert json.loads(from_env.stdout) == json.loads(served.stdout)
    finally:
        assert server.stop() == 0, server.log()
