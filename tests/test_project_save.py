"""``server.save(folder)``: a notebook's models written as a project that serves the same outputs.

The notebook is played by a script run as ``__main__`` (as a kernel runs cells): it serves an
ONNX model, a function, a class and a scikit-learn pipeline from memory, records their outputs,
and saves the project. ``servekit serve folder/serve.yaml`` then runs in a fresh process and
must give bit-identical outputs over HTTP (tritonclient). Refusals (a lambda, a closure) and
the requirements file are checked too.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import yaml
from servers import running_server

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent

NOTEBOOK = textwrap.dedent(
    """
    import sys
    from typing import Annotated

    import numpy as np
    from numpy.typing import NDArray
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    import servekit
    import onnx_builders

    SCALE = 3.0
    Rows = Annotated[NDArray[np.float32], (-1, 4)]


    def helper(x):
        return x * SCALE


    def double(x: Rows) -> Rows:
        return helper(x)


    class Weighted:
        def load(self) -> None:
            self.w = np.arange(4, dtype=np.float32)

        def predict(self, x: Rows) -> dict[str, NDArray[np.float32]]:
            return {"y": x * self.w, "s": np.sin(x).astype(np.float32)}


    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 4))
    y = (X[:, 0] + X[:, 1] > 0).astype(int)
    pipe = make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y)
    x16 = rng.standard_normal((3, 16)).astype(np.float32)
    x4 = rng.standard_normal((5, 4)).astype(np.float32)
    with servekit.serve(grpc_port=None) as server:
        server.add_model("mlp", onnx_builders.mlp())
        server.add_model("double", double)
        server.add_model("weighted", Weighted)
        server.add_model("pipe", pipe)
        outputs = {
            "mlp": server.infer("mlp", {"input": x16}),
            "double": server.infer("double", {"x": x4}),
            "weighted": server.infer("weighted", {"x": x4}),
            "pipe": server.infer("pipe", {"X": x4}),
        }
        server.save(sys.argv[1])
    flat = {f"{m}.{k}": v for m, out in outputs.items() for k, v in out.items()}
    np.savez(sys.argv[2], x16=x16, x4=x4, **flat)
    """
)


def _run_notebook(script: str, *args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "notebook.py"
    path.write_text(script)
    env_path = f"{TESTS}{':' + sys.path[0] if sys.path else ''}"
    import os

    env = {**os.environ, "PYTHONPATH": f"{os.environ.get('PYTHONPATH', '')}:{env_path}"}
    return subprocess.run(
        [sys.executable, str(path), *args],
        capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path,
    )  # fmt: skip


@pytest.mark.timeout(300)
def test_saved_project_serves_identical_outputs(tmp_path: Path) -> None:
    folder, record = tmp_path / "project", tmp_path / "outputs.npz"
    done = _run_notebook(NOTEBOOK, str(folder), str(record), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    assert sorted(p.name for p in folder.iterdir()) == [
        ".dockerignore", "Dockerfile", "models", "notebook_models.py", "requirements.txt",
        "serve.yaml",
    ]  # fmt: skip
    config = yaml.safe_load((folder / "serve.yaml").read_text())
    entries = {m["name"]: m for m in config["models"]}
    assert entries["double"]["entrypoint"] == "notebook_models:double"
    assert entries["weighted"]["entrypoint"] == "notebook_models:Weighted"
    assert entries["pipe"]["storageUri"] == "models/pipe"
    assert (folder / "models/mlp/1/model.onnx").is_file()
    requirements = (folder / "requirements.txt").read_text()
    assert "numpy==" in requirements and "scikit-learn" not in requirements  # ONNX needs none
    module = (folder / "notebook_models.py").read_text()
    assert "SCALE = 3.0" in module and "def helper(x):" in module
    expected = dict(np.load(record))
    # A fresh process, from the saved folder only: nothing of the notebook is on its path.
    with running_server(folder / "serve.yaml", grpc=False) as server:
        client = httpclient.InferenceServerClient(server.http_url.removeprefix("http://"))
        feeds = {"mlp": ("input", expected["x16"]), "double": ("x", expected["x4"]),
                 "weighted": ("x", expected["x4"]), "pipe": ("X", expected["x4"])}  # fmt: skip
        for model, (name, array) in feeds.items():
            inp = httpclient.InferInput(name, list(array.shape), "FP32")
            inp.set_data_from_numpy(array, binary_data=True)
            result = client.infer(model, [inp])
            produced = {k.split(".", 1)[1] for k in expected if k.startswith(model + ".")}
            assert produced, model
            for output in produced:
                got = result.as_numpy(output)
                want = expected[f"{model}.{output}"]
                assert got.dtype == want.dtype and got.shape == want.shape, (model, output)
                assert got.tobytes() == want.tobytes(), (model, output)  # bit-identical
        client.close()


REFUSED = textwrap.dedent(
    """
    import sys
    import servekit
    import numpy as np
    from numpy.typing import NDArray


    def make(k):
        def scaled(x: NDArray[np.float32]) -> NDArray[np.float32]:
            return x * k
        return scaled


    with servekit.serve(grpc_port=None) as server:
        spec = dict(inputs=[("x", "FP32", [-1])], outputs=[("output", "FP32", [-1])])
        server.add_model("lam", lambda x: x, **spec)
        server.add_model("closure", make(2.0))
        try:
            server.save(sys.argv[1])
        except ValueError as exc:
            print(exc)
    """
)


@pytest.mark.timeout(200)
def test_save_refuses_lambdas_and_closures_naming_them(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    done = _run_notebook(REFUSED, str(folder), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "model 'lam': a lambda cannot be saved" in done.stdout
    assert "model 'closure': make.<locals>.scaled is a closure over k" in done.stdout
    assert not folder.exists()  # nothing written
