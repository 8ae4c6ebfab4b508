"""Saving tabular models (issue 24, items 4 and 6): ``server.save`` copies the model files and
pins the libraries that load them in requirements.txt (a pickle's own modules too, read without
loading it); an MLflow model is saved as its folder with its requirements pinned; ``servekit
requirements`` (what a project image installs) adds the libraries of the models' formats."""

from __future__ import annotations

import warnings
from importlib import metadata
from pathlib import Path

import joblib
import numpy as np
import pytest
from inprocess import plan_of
from sklearn.linear_model import LinearRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import FunctionTransformer

from servekit.project import requirements, save


def pinned(name: str) -> str:
    return f"{metadata.metadata(name)['Name']}=={metadata.version(name)}"


@pytest.mark.slow  # mlflow.pyfunc.save_model runs `uname` (a process)
def test_saved_native_and_mlflow_models_pin_their_libraries(tmp_path: Path) -> None:
    x = np.random.default_rng(0).uniform(0, 3, (20, 2))
    logged = Pipeline([("log", FunctionTransformer(np.log1p)), ("reg", LinearRegression())])
    joblib.dump(logged.fit(x, x @ [1.0, 2.0]), tmp_path / "logged.joblib")
    with warnings.catch_warnings():  # MLflow warns on its own imports and untyped models
        warnings.simplefilter("ignore")
        import mlflow.pyfunc
        from tabular_models import make_scorer

        mlflow.pyfunc.save_model(str(tmp_path / "scorer"), python_model=make_scorer())
    (tmp_path / "scorer" / "requirements.txt").write_text(
        "mlflow==0.0.1\ncloudpickle==0.0.1\n--index-url https://example.invalid\n"
    )
    plan = plan_of(
        "models:\n"
        "  - {name: logged, modelFormat: {name: sklearn}, storageUri: logged.joblib}\n"
        "  - {name: scorer, modelFormat: {name: mlflow}, storageUri: scorer}\n",
        tmp_path,
    )
    folder = save.from_plans(list(plan.models)).write(tmp_path / "project")
    assert (folder / "models/logged/1/logged.joblib").read_bytes() == (
        tmp_path / "logged.joblib"
    ).read_bytes()
    assert (folder / "models/scorer/1/MLmodel").is_file()
    assert (folder / "models/scorer/1/python_model.pkl").is_file()
    lines = (folder / "requirements.txt").read_text().splitlines()
    # The format's library and the modules the pickle names (numpy's log1p), at the installed
    # versions; the MLflow model's own requirements pinned here, not at its file's versions.
    for name in ("scikit-learn", "joblib", "numpy", "mlflow-skinny", "cloudpickle"):
        assert pinned(name) in lines, (name, lines)
    assert not any("0.0.1" in line or "example.invalid" in line for line in lines)
    served = plan_of((folder / "serve.yaml").read_text(), folder)
    assert [(m.name, m.implementation, m.problem) for m in served.models] == [
        ("logged", "sklearn", None),
        ("scorer", "mlflow", None),
    ]


def test_the_modules_a_pickle_names_are_read_without_loading_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    payload = f"open({str(marker)!r}, 'w').write('x')"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (exec, (payload,))

    joblib.dump([Payload(), np.log1p], tmp_path / "model.joblib")
    found = requirements.pickled_modules(tmp_path / "model.joblib")
    assert {"builtins", "numpy"} <= found
    assert not marker.exists()


def test_requirements_of_a_project_add_its_formats_libraries(tmp_path: Path) -> None:
    """What `servekit build`'s Dockerfile installs (`servekit requirements serve.yaml`): the
    declared requirements, then the extras of the models' formats (servekit[sklearn] ...)."""
    joblib.dump(LinearRegression().fit([[0.0], [1.0]], [0.0, 1.0]), tmp_path / "m.joblib")
    (tmp_path / "serve.yaml").write_text(
        "server: {requirements: [scipy]}\n"
        "models:\n  - {name: m, modelFormat: {name: sklearn}, storageUri: m.joblib}\n"
    )
    listed = requirements.declared(tmp_path / "serve.yaml")
    assert listed[0] == "scipy"
    assert any(line.startswith("scikit-learn") for line in listed[1:]), listed
    (tmp_path / "serve.yaml").write_text("models: []\n")
    assert requirements.declared(tmp_path / "serve.yaml") == []
